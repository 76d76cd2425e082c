"""Sparse AxoNN end to end at smoke scale: prune, then dense and sparse AxoNN on 2 stages x 2 replicas.

The library's exactness (compact AdamW against masked dense AdamW, pruned entries staying zero, the
pipeline against single-process training) is tested in tests/common; here the stages: what the
files say was sent, kept and measured, and that bad inputs fail before any rank starts.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import math
import os
import sys

import pytest
import torch

from harness.params import load_params
from papers.sparse_axonn.config import ModelConfig, ScaleConfig, from_params
from papers.sparse_axonn.model import build_gpt2, evaluate, load_split
from papers.sparse_axonn.params import load_config
from papers.sparse_axonn.pipeline_stages import GPT2Stage
from papers.sparse_axonn.pruning import load_masks, magnitude_masks, save_masks
from tests.helpers.mlflow_store import fresh_store
from tests.helpers.processes import run_group
from tests.helpers.smoke_record import check_losses
from trainer.paths import REPO_ROOT

SMOKE_RUNS = ("dense_2x2", "sparse90_2x2", "sputnik90_2x2")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """One MLflow store for the module's runs (creating a SQLite store costs ~10 s)."""
    return {
        **os.environ,
        "MLFLOW_TRACKING_URI": fresh_store(tmp_path_factory.mktemp("mlflow")),
    }


@pytest.fixture(scope="module")
def pruned(tmp_path_factory, env):
    out = tmp_path_factory.mktemp("prune")
    command = [sys.executable, "-m", "papers.sparse_axonn.prune", "--scale", "smoke", "--out", str(out)]
    result = run_group(command, cwd=REPO_ROOT, env=env, timeout=240)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def trained(pruned, tmp_path_factory, env):
    out = tmp_path_factory.mktemp("train")
    command = [
        sys.executable,
        "-m",
        "pipelines.launch",
        "sparse_axonn",
        ",".join(SMOKE_RUNS),
        "--scale",
        "smoke",
    ]
    result = run_group(
        [*command, "--inputs", str(pruned), "--out", str(out)], cwd=REPO_ROOT, env=env, timeout=300
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return out


def _model(pruned):
    config, _ = load_config("smoke")
    record = json.loads((pruned / "prune.json").read_text())
    return config, build_gpt2(config.model, record["vocab_size"])


def test_prune_writes_every_mask_and_the_perplexities(pruned):
    record = json.loads((pruned / "prune.json").read_text())
    _, model = _model(pruned)
    assert math.isfinite(record["dense"]["perplexity"])
    expected = {
        f"{f}_{p}" for f in ("oneshot_global", "oneshot_layerwise", "imp_global") for p in (50, 80, 90)
    }
    assert set(record["masks"]) == expected
    for name, r in record["masks"].items():
        saved = load_masks(pruned / "masks" / f"{name}.pt", model)  # fits the model of the scale
        assert abs(saved.sparsity - r["target_sparsity"]) < 1e-3, name
        assert math.isfinite(r["perplexity_pruned"]) and math.isfinite(r["perplexity_retrained"])
        if name.startswith("oneshot_layerwise"):  # every weight loses the same fraction
            assert all(abs(k - (1 - r["target_sparsity"])) < 0.01 for k in r["kept_fraction"].values()), name
    # iterative pruning keeps what an earlier round pruned pruned
    m80 = load_masks(pruned / "masks" / "imp_global_80.pt").masks
    m90 = load_masks(pruned / "masks" / "imp_global_90.pt").masks
    assert all(not (m90[n] & ~m80[n]).any() for n in m80)
    assert (pruned / "rewind.pt").exists() and "capacity_bytes" in record["configurations"]["fp32"]


def test_the_dense_curve_is_judged_and_every_model_is_written(pruned):
    record = json.loads((pruned / "prune.json").read_text())
    config, _ = load_config("smoke")
    dense = record["dense"]
    assert [step for step, _ in dense["eval_curve"]] == config.prune.evaluation_steps() == [2, 4, 6, 8]
    first, last = dense["eval_curve"][-2][1], dense["eval_curve"][-1][1]
    # the last fifth of 8 steps starts at the evaluation at or before step 6.4: step 6
    assert dense["plateau"]["from_step"] == 6 and dense["plateau"]["improvement"] == pytest.approx(
        first - last
    )
    assert dense["plateau"]["reached"] == (first - last < config.prune.plateau)
    assert {p.stem for p in (pruned / "models").glob("*.pt")} == {"dense", *record["masks"]}


def test_evaluate_measures_the_pruned_models_on_the_whole_test_split(pruned, env, monkeypatch):
    from papers.sparse_axonn.evaluate import evaluate_models

    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    rows = {r["model"]: r for r in evaluate_models(pruned)}
    record = json.loads((pruned / "prune.json").read_text())
    assert set(rows) == {"dense", *record["masks"]}
    config, _ = load_config("smoke")
    test_tokens = len(load_split(config, "test"))
    for name, row in rows.items():
        assert row["test_windows"] == test_tokens and math.isfinite(row["test_perplexity"])
        assert row["mlflow_run_id"] and row["prune_run_id"] == record["mlflow_run_id"]
        assert json.loads((pruned / "evaluations" / f"{name}.json").read_text()) == row
        if name != "dense":
            assert row["sparsity"] == pytest.approx(record["masks"][name]["sparsity"])
    # the same model on the prune stage's validation windows: the same loss as the stage measured
    val = load_split(config, "val", limit=config.prune.eval_windows)
    _, model = _model(pruned)
    model.load_state_dict(torch.load(pruned / "models" / "imp_global_90.pt", weights_only=True))
    assert evaluate(model, val)["perplexity"] == pytest.approx(
        record["masks"]["imp_global_90"]["perplexity_retrained"], rel=1e-6
    )


def test_evaluate_refuses_a_model_that_is_not_the_pruned_one(pruned, tmp_path):
    import shutil

    from papers.sparse_axonn.evaluate import evaluate_models

    copy = tmp_path / "prune"
    shutil.copytree(pruned, copy)
    shutil.copy(copy / "models" / "dense.pt", copy / "models" / "oneshot_global_90.pt")
    with pytest.raises(SystemExit, match=r"models/oneshot_global_90.pt is not the pruned model of masks/"):
        evaluate_models(copy, track=False)
    (copy / "models" / "dense.pt").unlink()
    with pytest.raises(SystemExit, match=r"no trained weights .*dense.pt: rerun the prune stage"):
        evaluate_models(copy, track=False)


def test_cosine_decay_runs_from_the_warm_up_to_the_floor():
    config, _ = load_config("smoke")
    prune = dataclasses.replace(config.prune, lr_decay="cosine", min_lr_factor=0.1, steps=110)
    optim = dataclasses.replace(config.optim, lr=1e-3, warmup_steps=10)
    lrs = [prune.lr_at(optim, s) for s in range(110)]
    assert lrs[:10] == [optim.lr_at(s) for s in range(10)] and lrs[10] == pytest.approx(1e-3)
    assert lrs[60] == pytest.approx(1e-4 + 0.9e-3 * 0.5) and lrs[109] == pytest.approx(1e-4, rel=3e-3)
    assert all(a >= b for a, b in itertools.pairwise(lrs[10:]))
    constant = dataclasses.replace(prune, lr_decay="constant")
    assert [constant.lr_at(optim, s) for s in range(110)] == [optim.lr_at(s) for s in range(110)]
    with pytest.raises(ValueError, match=r"lr_decay must be one of \['constant', 'cosine'\], got 'step'"):
        dataclasses.replace(prune, lr_decay="step")
    with pytest.raises(ValueError, match=r"num_evaluations \(200\) must be <= steps \(110\)"):
        dataclasses.replace(prune, num_evaluations=200)


def _stage_counts(pruned, num_stages):
    """(N, K) of every stage, counted here from the model and the train masks."""
    config, model = _model(pruned)
    masks = load_masks(pruned / "masks" / "imp_global_90.pt", model).masks
    out = []
    for s in range(num_stages):
        params = dict(GPT2Stage(model, s, num_stages).named_parameters())
        n = sum(p.numel() for p in params.values())
        k = sum(int(masks[name].sum()) if name in masks else p.numel() for name, p in params.items())
        out.append((n, k))
    return config, out


def test_sparse_all_reduce_sends_the_kept_entries_only_and_activations_stay_dense(pruned, trained):
    config, counts = _stage_counts(pruned, 2)
    ranks = {r: json.loads((trained / r / "ranks.json").read_text()) for r in SMOKE_RUNS}
    train, d = config.train, config.model.n_embd
    boundary_bits = train.batch_size // 2 * config.seq_len * d * 32  # one direction, per step
    for dense, sparse, sputnik in zip(
        ranks["dense_2x2"], ranks["sparse90_2x2"], ranks["sputnik90_2x2"], strict=True
    ):
        n, k = counts[sparse["stage"]]
        # the Sputnik-like model holds only the kept weights of its CSR layers, and sends the same
        assert (sputnik["num_params"], sputnik["num_kept"]) == (n, k)
        assert sputnik["allreduce_bits_steps"] == [k * 32]
        assert sputnik["p2p_bits_steps"] == dense["p2p_bits_steps"]
        assert sputnik["state_bytes"]["params"] < sparse["state_bytes"]["params"]
        assert (sparse["num_params"], sparse["num_kept"]) == (n, k) and k < n / 5
        # one all-reduce per step of the stage's kept entries (biases and LayerNorms included), fp32
        assert sparse["allreduce_bits_steps"] == [k * 32]
        assert dense["allreduce_bits_steps"] == [n * 32]
        # point to point: the same dense activations forward (stage 0) or gradients back (stage 1)
        assert sparse["p2p_bits_steps"] == dense["p2p_bits_steps"] == [boundary_bits]
        # model state counted from the tensors: dense AdamW 16 B/param; compact 8 B/param + 16 B/kept
        assert dense["state_bytes"]["total"] == 16 * n
        assert sparse["state_bytes"]["total"] == 8 * n + 16 * k
        assert sparse["state_bytes"]["index_bytes"] > 0 and sparse["peak_rss_bytes"] > 0
        for r in (dense, sparse, sputnik):  # the reduction, timed: wait for the replica, then transfer
            assert r["allreduce_transfer_seconds_median"] > 0 and r["allreduce_wait_seconds_median"] >= 0


def test_pruned_weights_stay_zero_and_the_runs_report_what_they_measured(trained):
    for run in SMOKE_RUNS:
        metrics = json.loads((trained / run / "metrics.json").read_text())
        info = json.loads((trained / run / "run.json").read_text())
        assert metrics["pruned_nonzero"] == 0
        assert math.isfinite(metrics["val_perplexity"]) and metrics["step_seconds_median_max"] > 0
        assert info["grid"] == "2x2" and info["mlflow_run_id"]
        with (trained / run / "steps.csv").open() as f:
            assert len(list(csv.DictReader(f))) == 4
    sparse = json.loads((trained / "sparse90_2x2" / "metrics.json").read_text())
    assert 0.1 < sparse["density"] < 0.2


def test_two_stages_by_two_replicas_train_like_one_process(pruned, trained, tmp_path, monkeypatch):
    """The 2x2 run's losses and final perplexity against the same run trained here in one process."""
    from papers.sparse_axonn.config import RunSpec
    from papers.sparse_axonn.train import load_data, train_paper_run
    from trainer.distributed import DistContext

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # refused at once: no tracking
    config, _ = load_config("smoke")
    data = load_data(config)
    ctx = DistContext(rank=0, world_size=1, local_rank=0, backend="gloo", device=torch.device("cpu"))
    spec = RunSpec(method="sparse", sparsity=0.9, stages=1)
    metrics = train_paper_run("sparse90_1x1", spec, config, ctx, pruned, tmp_path / "sparse90_1x1", data)
    assert metrics is not None
    reference = json.loads((trained / "sparse90_2x2" / "metrics.json").read_text())
    assert metrics["val_perplexity"] == pytest.approx(reference["val_perplexity"], rel=1e-4)
    with (trained / "sparse90_2x2" / "steps.csv").open() as f:
        pipelined = [float(r["loss"]) for r in csv.DictReader(f)]
    with (tmp_path / "sparse90_1x1" / "steps.csv").open() as f:
        single = [float(r["loss"]) for r in csv.DictReader(f)]
    assert single == pytest.approx(pipelined, abs=1e-5)
    assert metrics["pruned_nonzero"] == 0 and metrics["allreduce_bits_per_step_max"] == 0


def test_the_report_reads_the_runs_as_seeds_and_judges_no_claim_from_one(pruned, trained, tmp_path):
    """The smoke runs (one seed, the launch without --seeds) as the train stage lays out seed 0: every
    claim is there, judged, and inconclusive for too few seeds, never from one run."""
    from papers.sparse_axonn.claims import NOT_TESTED
    from papers.sparse_axonn.report import markdown
    from papers.sparse_axonn.runs import collect

    for run in SMOKE_RUNS:
        (tmp_path / run).mkdir()
        (tmp_path / run / "seed0").symlink_to(trained / run, target_is_directory=True)
    prune = json.loads((pruned / "prune.json").read_text())
    rows = collect(tmp_path, list(SMOKE_RUNS))
    assert [r["seeds"] for r in rows] == [[0]] * len(SMOKE_RUNS)
    text, model, claims = markdown(rows, prune, load_params("sparse_axonn"), "smoke")
    assert "## The claims, judged over seeds" in text and "A MODEL of the paper's setting" in text
    assert model is None or 0 < model["memory_reduction"] < 1
    kinds = [c["kind"] for c in claims]  # the 1x4 run is not a smoke run: its two claims are absent
    assert kinds == ["memory", "bits", "comm", "speed", "sputnik"]
    assert all(c["verdict"] == "inconclusive" and c["seeds"] == [1, 1] for c in claims)
    assert {c["reason"] for c in claims} == {"1 run(s) on one side, 3 needed for an interval"}
    assert all(c["paper"] in text for c in NOT_TESTED)


def test_a_launch_over_seeds_plans_every_run_in_seed_folders(pruned, tmp_path, monkeypatch):
    """What the train stage's --seeds 0,1,2 plans (the smoke test trains one seed): each run three
    times, into <out>/<run>/seed<k>, the seed in its config (its batches are drawn from it)."""
    from pipelines.common import INPUTS_ENV
    from pipelines.train import OUT_DIR_ENV, SEEDS_ENV, plan_repeats

    monkeypatch.setenv(INPUTS_ENV, str(pruned))
    monkeypatch.setenv(OUT_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(SEEDS_ENV, "0,1,2")
    planned = plan_repeats("sparse_axonn", "sparse90_2x2", "smoke")
    assert [(run, c.seed, d, name) for run, c, d, name in planned] == [
        ("sparse90_2x2", s, str(tmp_path / "sparse90_2x2" / f"seed{s}"), f"sparse90_2x2-seed{s}")
        for s in (0, 1, 2)
    ]
    assert {c.sampling for _, c, _, _ in planned} == {"draws"}


def test_masks_that_do_not_fit_the_model_are_rejected_before_any_rank_starts(pruned, tmp_path, monkeypatch):
    from pipelines.common import INPUTS_ENV
    from pipelines.launch import main

    monkeypatch.setenv(INPUTS_ENV, "")  # restored after the test: main sets it from --inputs

    other = build_gpt2(ModelConfig(n_layer=2, n_embd=16, n_head=2, n_positions=32), 66)
    (tmp_path / "masks").mkdir()
    save_masks(tmp_path / "masks" / "imp_global_90.pt", magnitude_masks(other, 0.9), other, "global")
    (tmp_path / "rewind.pt").write_bytes((pruned / "rewind.pt").read_bytes())
    # the command line's own checks: a clear error, and no torchrun started (main would run it)
    with pytest.raises(SystemExit, match=r"error: run 'sparse90_2x2': mask .* has shape \(66, 16\)"):
        main(["sparse_axonn", "sparse90_2x2", "--scale", "smoke", "--inputs", str(tmp_path)])
    (tmp_path / "masks" / "imp_global_90.pt").unlink()
    with pytest.raises(SystemExit, match=r"no mask file .*imp_global_90.pt: run the prune stage"):
        main(["sparse_axonn", "sparse90_2x2", "--scale", "smoke", "--inputs", str(tmp_path)])


@pytest.mark.parametrize("sparsity", [1.0, 1.5, -0.1, float("nan")])
def test_a_sparsity_outside_zero_one_is_rejected(sparsity):
    params = load_params("sparse_axonn")
    bad_run = {**params, "runs": {"bad": {"method": "sparse", "sparsity": sparsity, "stages": 2}}}
    with pytest.raises(ValueError, match=r"run 'bad': sparsity must be in \[0, 1\)"):
        from_params(bad_run, "smoke")
    bad_prune = {
        **params,
        "defaults": {
            **params["defaults"],
            "prune": {**params["defaults"]["prune"], "sparsities": [0.5, sparsity]},
        },
    }
    with pytest.raises(ValueError, match=r"prune sparsity must be in \[0, 1\)"):
        from_params(bad_prune, "smoke")


def test_bad_settings_name_what_is_wrong():
    params = load_params("sparse_axonn")
    cases = [
        ({"runs": {"x": {"method": "sparse", "sparsity": 0.7, "stages": 2}}}, r"sparsity 0.7 has no mask"),
        (
            {"runs": {"x": {"method": "sparse", "sparsity": 0.9, "stages": 3}}},
            r"3 stages do not divide world_size 4",
        ),
        ({"runs": {"x": {"method": "dense", "sparsity": 0.9, "stages": 2}}}, r"sparsity must be 0"),
        ({"runs": {"x": {"method": "magic", "stages": 2}}}, r"method must be one of"),
        ({"runs": {"x": {"method": "dense", "stages": 2, "density": 1}}}, r"unknown key\(s\) density"),
        ({"nonsense": 1}, r"unknown top-level key\(s\) nonsense"),
    ]
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            from_params({**params, **change}, "cpu")


def test_every_run_composes_and_the_dvc_stages_list_every_run():
    params = load_params("sparse_axonn")
    for scale in params["scales"]:
        from_params(params, scale)
    assert from_params(params, "smoke")[0] == ScaleConfig.smoke()  # the preset is the smoke scale
    text = (REPO_ROOT / "pipelines" / "sparse_axonn" / "dvc.yaml").read_text()
    train = text.split("  train:", 1)[1].split("    do:", 1)[0]
    listed = [line.strip()[2:] for line in train.splitlines() if line.strip().startswith("- ")]
    assert listed == list(params["runs"])


def test_smoke_losses_equal_the_record(trained):
    """Training arithmetic unchanged by refactors: the logged losses are the recorded ones."""
    check_losses("sparse_axonn", trained)
