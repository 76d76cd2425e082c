"""The training loop: determinism, checkpoint/resume (also after SIGKILL), outputs, failures."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.distributed import run_ranks
from tests.helpers.processes import run_group
from tests.helpers.train_once import CONFIG
from trainer import StepInfo, train
from trainer.checks import checked_config
from trainer.distributed import RESTART_SAFE_ENV, DistContext
from trainer.paths import REPO_ROOT


def _final_state(out: Path, rank: int) -> dict:
    ckpt_root = out / "ckpt"
    (fingerprint,) = [p for p in ckpt_root.iterdir() if p.is_dir()]
    info = json.loads((fingerprint / "latest.json").read_text())
    assert info["complete"] is True
    return torch.load(fingerprint / f"step-{info['step']:08d}" / f"rank{rank}.pt", weights_only=False)


def _deterministic_columns(path: Path) -> list[tuple[str, ...]]:
    """The curve without its timing columns (wall and communication seconds differ run to run)."""
    import csv

    with path.open() as f:
        return [(r["step"], r["train_loss"], r["lr"], r["bits_per_step"]) for r in csv.DictReader(f)]


class Stop(Exception):
    pass


def _train_ranks(rank: int, world: int, out: str, stop_at: int | None, overrides: dict | None = None) -> dict:
    ctx = DistContext(
        rank=rank, world_size=world, local_rank=rank, backend="gloo", device=torch.device("cpu")
    )

    def stop(info: StepInfo) -> None:
        if info.step == stop_at:
            raise Stop(f"stopped at {info.step}")

    try:
        metrics = train(checked_config({**CONFIG, **(overrides or {})}), out, callbacks=[stop], ctx=ctx)
    except Stop:
        return {"stopped": True}
    return {"metrics": metrics}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted 2-rank run (48 steps) and its outputs."""
    out = tmp_path_factory.mktemp("reference")
    results = run_ranks(_train_ranks, 2, str(out), None, tmp_path=out)
    return out, results


def test_outputs_and_metrics(reference):
    out, results = reference
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics == pytest.approx(results[0]["metrics"], nan_ok=True)
    assert metrics["steps"] == 48 and metrics["world_size"] == 2
    assert metrics["epochs"] == 2.0  # 24 steps per epoch (768 examples / (2 ranks x 16))
    # random-k 10% with shared indices: only values cross the wire (32 bits each) -> about 10x
    assert 9.0 <= metrics["compression_factor"] <= 10.0
    assert metrics["test_accuracy"] > 0.25  # chance is 0.1; 48 small steps
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "eval_curve.csv").read_text().startswith("step,epoch,wall_seconds,test_loss,test_accuracy")
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["compressor"] == "randomk" and run["mlflow_run_id"] is None
    assert run["resumed_at"] == []  # ran through in one go


def test_failed_run_keeps_earlier_outputs_then_resumes_bit_exact(reference, tmp_path):
    """A finished run's outputs survive a failed rerun; the rerun then resumes from its own
    checkpoint and ends exactly where an uninterrupted run ends (same losses, same parameters)."""
    out, _ = reference
    rerun = tmp_path / "rerun"
    shutil.copytree(out, rerun)
    before = (rerun / "metrics.json").read_text()
    assert run_ranks(_train_ranks, 2, str(rerun), 21, tmp_path=tmp_path)[0] == {"stopped": True}
    assert (rerun / "metrics.json").read_text() == before
    assert not list(rerun.glob("**/*.tmp"))
    latest = next((rerun / "ckpt").iterdir()) / "latest.json"
    assert json.loads(latest.read_text()) == {
        "step": 16,
        "steps": [16, 8],
        "complete": False,
        "world_size": 2,
    }
    run_ranks(_train_ranks, 2, str(rerun), None, tmp_path=tmp_path)
    for rank in range(2):
        a, b = _final_state(out, rank), _final_state(rerun, rank)
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
        ra = a["strategy"]["sync"]["error_feedback"]["residuals"]
        rb = b["strategy"]["sync"]["error_feedback"]["residuals"]
        assert all(torch.equal(ra[k], rb[k]) for k in ra)
    assert _deterministic_columns(rerun / "train_curve.csv") == _deterministic_columns(
        out / "train_curve.csv"
    )
    assert json.loads((rerun / "run.json").read_text())["resumed_at"] == [16]  # the restart is on record


def test_stop_at_ends_at_the_first_evaluation_reaching_the_target_on_the_full_runs_trajectory(
    reference, tmp_path
):
    """A time-to-target run (the leaderboard's) is the full run up to its target: the same losses
    and evaluations step by step (the lr schedule still spans every step), then it ends."""
    out, _ = reference
    evals = _read_csv(out / "eval_curve.csv")
    assert len(evals) == 4  # steps 12, 24, 36, 48
    target = float(evals[1]["test_loss"]) + 1e-9  # reached at the 2nd evaluation at the latest
    first = next(i for i, row in enumerate(evals) if float(row["test_loss"]) <= target)
    assert first < len(evals) - 1  # the stop comes before the last step
    stopped = tmp_path / "stopped"
    results = run_ranks(
        _train_ranks, 2, str(stopped), None, {"stop_at": {"test_loss": target}}, tmp_path=tmp_path
    )
    metrics = results[0]["metrics"]
    assert metrics["steps"] == float(evals[first]["step"]) and metrics["stopped_at_target"] == 1.0
    assert metrics["epochs"] == metrics["steps"] / 24  # what was trained, not the config's 2
    assert results[1]["metrics"]["steps"] == metrics["steps"]  # every rank stopped there
    columns = ("step", "test_loss", "test_accuracy")
    assert [[r[c] for c in columns] for r in _read_csv(stopped / "eval_curve.csv")] == [
        [r[c] for c in columns] for r in evals[: first + 1]
    ]
    reference_rows = _deterministic_columns(out / "train_curve.csv")
    rows = _deterministic_columns(stopped / "train_curve.csv")
    assert rows == reference_rows[: len(rows)] and int(rows[-1][0]) == int(metrics["steps"])
    assert not (stopped / "model.pt").exists()  # not the recipe's trained model
    # a target never reached: the whole run
    never = run_ranks(_train_ranks, 2, str(tmp_path / "never"), None, {"stop_at": {"test_accuracy": 1.01}},
                      tmp_path=tmp_path)  # fmt: skip
    assert never[0]["metrics"]["steps"] == 48 and never[0]["metrics"]["stopped_at_target"] == 0.0


@pytest.mark.parametrize(
    "stop_at, message",
    [
        ({"test_perplexity": 5.0}, "stop_at must be one of {test_accuracy: X} (stop at or above X)"),
        ({"test_accuracy": 0.9, "test_loss": 1.0}, "stop_at must be one of"),
        ({"test_loss": "low"}, "stop_at test_loss must be a finite number, got 'low'"),
        ({"test_loss": float("nan")}, "stop_at test_loss must be a finite number"),
    ],
)
def test_a_bad_stop_at_names_what_is_allowed(stop_at, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        checked_config({**CONFIG, "stop_at": stop_at})


def _read_csv(path: Path) -> list[dict[str, str]]:
    import csv

    with path.open() as f:
        return list(csv.DictReader(f))


def _train_once(out: Path, max_restarts: int, *flags: str) -> subprocess.CompletedProcess[str]:
    """``tests/helpers/train_once.py`` on 2 ranks under torchrun (``flags``: its faults), to success."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **RESTART_SAFE_ENV}
    torchrun = Path(sys.executable).parent / "torchrun"
    command = [str(torchrun), "--standalone", "--nproc_per_node=2", f"--max-restarts={max_restarts}",
               str(REPO_ROOT / "tests/helpers/train_once.py"), str(out), *flags]  # fmt: skip
    result = run_group(command, timeout=300, env=env)  # torchrun and its workers stop on timeout too
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_a_hung_then_a_killed_rank_both_restart_and_resume_bit_exact(reference, tmp_path):
    """Rank 1 hangs at step 19: rank 0 gives up after collective_timeout_s (not gloo's 30 min),
    names where it waited and exits non-zero; torchrun restarts both ranks, which resume from step
    16. Then rank 1 is SIGKILLed at step 35: restarted again, from step 32. The run still ends
    where the uninterrupted run ends, and has the same losses step by step."""
    out, _ = reference
    faulty = tmp_path / "faulty"
    result = _train_once(faulty, 2, "--hang-at", "19", "--kill-at", "35", "--timeout", "4")
    assert (faulty / "hung-once").exists() and (faulty / "killed-once").exists()
    assert "rank 0 waited over collective_timeout_s = 4 s for its peers at step 20" in result.stderr
    assert "Timed out waiting 4000ms" in result.stderr and "common/" in result.stderr
    assert "exitcode: -9" in result.stderr  # torchrun saw the SIGKILL and restarted the ranks
    assert json.loads((faulty / "run.json").read_text())["resumed_at"] == [16, 32]
    for rank in range(2):
        a, b = _final_state(out, rank)["model"], _final_state(faulty, rank)["model"]
        assert all(torch.equal(a[k], b[k]) for k in a)
    # a separately launched run with the same seed has the same losses, step by step
    assert _deterministic_columns(faulty / "train_curve.csv") == _deterministic_columns(
        out / "train_curve.csv"
    )


def test_a_run_through_data_loader_workers_is_killed_resumes_and_equals_the_in_process_run(
    reference, tmp_path
):
    """``data_workers: 2`` (each rank's batches decoded by 2 DataLoader processes): rank 1 is
    SIGKILLed at step 11, both restart from step 8, mid-epoch; the run ends with the parameters
    of the reference, which decoded in process."""
    out, _ = reference
    loaded = tmp_path / "loaded"
    _train_once(loaded, 1, "--kill-at", "11", "--data-workers", "2")
    run = json.loads((loaded / "run.json").read_text())
    assert run["resumed_at"] == [8] and run["config"]["data_workers"] == 2
    for rank in range(2):
        a, b = _final_state(out, rank)["model"], _final_state(loaded, rank)["model"]
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_unreachable_mlflow_costs_one_warning_and_training_goes_on(tmp_path, monkeypatch, caplog):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the with-block ends: nothing listens there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    config = checked_config({**CONFIG, "epochs": 1, "world_size": 1, "train_limit": 128, "compressor": "identity",
                                  "compressor_options": {}, "error_feedback": False})  # fmt: skip
    ctx = DistContext(rank=0, world_size=1, local_rank=0, backend="gloo", device=torch.device("cpu"))
    with caplog.at_level(logging.WARNING):
        metrics = train(config, tmp_path, experiment="unreachable", run_name="r", ctx=ctx)
    warnings = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(warnings) == 1 and str(port) in warnings[0].getMessage()
    assert json.loads((tmp_path / "metrics.json").read_text())["steps"] == metrics["steps"] == 8


def _one_rank(**overrides) -> tuple[dict, DistContext]:
    """A small one-process run's config (8 steps an epoch: 128 examples, batch 16) and context."""
    config = {**CONFIG, "world_size": 1, "train_limit": 128, "compressor": "identity",
              "compressor_options": {}, "error_feedback": False, **overrides}  # fmt: skip
    return config, DistContext(rank=0, world_size=1, local_rank=0, backend="gloo", device=torch.device("cpu"))


def test_a_run_that_max_steps_ends_mid_epoch_reports_the_epochs_it_trained(tmp_path):
    """A smoke run of 2 epochs cut at 12 steps (8 an epoch) trained 1.5 epochs: metrics.json says
    1.5, not the config's 2."""
    config, ctx = _one_rank(epochs=2, max_steps=12)
    metrics = train(checked_config(config), tmp_path, ctx=ctx)
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written["steps"] == metrics["steps"] == 12
    assert written["epochs"] == metrics["epochs"] == 1.5


def test_a_final_evaluation_that_is_not_finite_fails_the_run_after_its_outputs(tmp_path, monkeypatch):
    """The last evaluation's loss is inf (the evaluation the loop calls returns it): the run ends
    with an error naming the metric and the step, a FloatingPointError (the launcher does not retry
    it), once every output is written, metrics.json recording the loss as null."""
    from common.finite import NonFiniteMetric
    from trainer import loop

    evaluate = loop.evaluate

    def diverged(*args, **kwargs):
        return {**evaluate(*args, **kwargs), "test_loss": math.inf}

    monkeypatch.setattr(loop, "evaluate", diverged)
    config, ctx = _one_rank(epochs=1, eval_every=4)
    with pytest.raises(NonFiniteMetric, match=r"^final test_loss is inf at step 8 \(the run's last evaluation; "
                       r"metrics\.json records it as null\): the model diverged") as failed:  # fmt: skip
        train(checked_config(config), tmp_path, ctx=ctx)
    assert isinstance(failed.value, FloatingPointError)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["test_loss"] is None and metrics["steps"] == 8 and 0 <= metrics["test_accuracy"] <= 1
    assert (tmp_path / "model.pt").is_file() and (tmp_path / "run.json").is_file()
    assert len(_read_csv(tmp_path / "eval_curve.csv")) == 2  # steps 4 and 8


def test_a_kill_between_the_last_checkpoint_and_the_outputs_costs_no_retraining(tmp_path, monkeypatch):
    """The outputs are written before the run is marked complete: a run that dies writing them
    (a kill, a full disk) resumes at its last step on the rerun, trains no step, and writes the
    outputs an uninterrupted run writes; only then is its checkpoint marked complete."""
    from trainer import run as run_module

    config, ctx = _one_rank(epochs=1, eval_every=4)
    reference = train(checked_config(config), tmp_path / "reference", ctx=ctx)

    write_outputs = run_module.write_outputs

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed while writing the outputs")

    out = tmp_path / "run"
    monkeypatch.setattr(run_module, "write_outputs", killed)
    with pytest.raises(KeyboardInterrupt):
        train(checked_config(config), out, ctx=ctx)
    assert not (out / "metrics.json").exists()
    (fingerprint,) = [p for p in (out / "ckpt").iterdir() if p.is_dir()]
    assert json.loads((fingerprint / "latest.json").read_text())["complete"] is False

    monkeypatch.setattr(run_module, "write_outputs", write_outputs)
    steps: list[int] = []
    metrics = train(checked_config(config), out, ctx=ctx, callbacks=[lambda info: steps.append(info.step)])
    assert steps == []  # nothing retrained
    assert json.loads((fingerprint / "latest.json").read_text())["complete"] is True
    timeless = sorted(k for k in reference if "seconds" not in k and k != "wall_time_s")
    assert json.dumps([metrics[k] for k in timeless]) == json.dumps([reference[k] for k in timeless])
    assert _deterministic_columns(out / "train_curve.csv") == _deterministic_columns(
        tmp_path / "reference" / "train_curve.csv"
    )
    assert json.loads((out / "run.json").read_text())["resumed_at"] == [8]


def test_artifacts_dir_holds_model_and_checkpoints_and_evaluate_finds_them(tmp_path):
    """With ``artifacts_dir`` (the pipelines: results/X -> artifacts/X) ``model.pt`` and ``ckpt/``
    go there and the results folder holds only what is committed, so a fresh clone has it whole;
    ``run.json`` says where, relative to the folder, and ``evaluate_trained`` reads the model from
    there; without it, an error that says why and what to do."""
    from trainer import MODEL_FILE, evaluate_trained

    config = checked_config({**CONFIG, "epochs": 1, "world_size": 1, "train_limit": 128, "compressor": "identity",
                                  "compressor_options": {}, "error_feedback": False, "checkpoint_every": 4})  # fmt: skip
    ctx = DistContext(rank=0, world_size=1, local_rank=0, backend="gloo", device=torch.device("cpu"))
    out, artifacts = tmp_path / "results" / "run", tmp_path / "artifacts" / "run"
    train(config, out, ctx=ctx, artifacts_dir=artifacts)
    assert (artifacts / MODEL_FILE).is_file() and any((artifacts / "ckpt").iterdir())
    assert sorted(p.name for p in out.iterdir()) == [
        "eval_curve.csv", "metrics.json", "plot.png", "run.json", "train_curve.csv"
    ]  # fmt: skip
    assert json.loads((out / "run.json").read_text())["artifacts"] == os.path.join(
        "..", "..", "artifacts", "run"
    )
    result = evaluate_trained(out, eval_limit=64)
    assert result["test_examples"] == 64 and 0.0 <= result["test_accuracy"] <= 1.0
    shutil.rmtree(artifacts)
    with pytest.raises(FileNotFoundError, match=r"has no model\.pt .*not committed"):
        evaluate_trained(out)


def test_a_run_logs_and_checkpoints_the_settings_its_strategy_forces(tmp_path):
    """DGC compresses per tensor whatever compress_per_tensor says at its default (false): run.json,
    the MLflow params (the same config) and the checkpoint folder are those of the effective config."""
    from common.methods import effective_config

    config = checked_config({**CONFIG, "epochs": 1, "world_size": 1, "train_limit": 64, "strategy": "dgc",
                             "compressor": "dgc", "compressor_options": {"density": 0.1}, "error_feedback": False,
                             "bucket_numel": 4096, "checkpoint_every": 4})  # fmt: skip
    assert config.compress_per_tensor is False
    ctx = DistContext(rank=0, world_size=1, local_rank=0, backend="gloo", device=torch.device("cpu"))
    train(config, tmp_path, ctx=ctx)
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["config"] == json.loads(json.dumps({**config.to_dict(), "compress_per_tensor": True}))
    assert run["fingerprint"] == effective_config(config).fingerprint() != config.fingerprint()
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == [run["fingerprint"]]
