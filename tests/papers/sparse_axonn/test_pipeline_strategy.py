"""Sparse AxoNN's pipeline x data parallelism in the thinwire loop (``strategy: pipeline``), on 4 real
gloo ranks (2 stages x 2 replicas): the loop's parameters equal the paper stage's own arithmetic
(``PipelineTrainer`` + ``CompactTraining`` on the same global batches) bit for bit, pruned and dense;
the bits are the sent activations plus the compact all-reduce; a killed run resumes bit-exactly;
the saved model is the whole model; and the run's settings are checked before anything starts."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from common.config import RunConfig
from common.methods import checked_config
from papers.sparse_axonn.compact import CompactTraining
from papers.sparse_axonn.pipeline_stages import GPT2Stage, PipelineTrainer, ProcessGrid, flat_all_reduce_grads
from papers.sparse_axonn.pruning import apply_masks, load_masks, magnitude_masks, save_masks
from tests.distributed import run_ranks
from trainer import MODEL_FILE, StepInfo, evaluate_trained, train
from trainer.data import load_dataset
from trainer.data.sampling import epoch_batches
from trainer.distributed import DistContext, seed_everything
from trainer.models import build_model

N_LAYER, N_EMBD, SEQ, BATCH, MICRO, STEPS, LR, WARMUP = 4, 32, 16, 8, 2, 6, 3e-3, 2
MODEL_OPTIONS = {
    "n_layer": N_LAYER,
    "n_embd": N_EMBD,
    "n_head": 2,
    "n_positions": 32,
    "dropout": 0.0,
    "tied": False,
}
BASE = {
    "dataset": "tinyshakespeare",
    "model": "gpt2_small",
    "model_options": MODEL_OPTIONS,
    "seq_len": SEQ,
    "train_limit": 4096,
    "eval_limit": 64,
    "batch_size": BATCH,  # per replica
    "epochs": 1,
    "max_steps": STEPS,
    "optimizer": "adamw",
    "lr": LR,
    "weight_decay": 0.01,
    "lr_warmup_steps": WARMUP,
    "world_size": 4,
    "strategy": "pipeline",
    "eval_every": 3,
    "log_every": 1,
    "checkpoint_every": 3,
}


class Stop(Exception):
    pass


def _model():
    data = load_dataset("tinyshakespeare", "train", limit=1, seq_len=SEQ)
    return build_model("gpt2_small", vocab_size=data.info.vocab_size, **MODEL_OPTIONS)


def _masks_file(path: Path) -> str:
    seed_everything(0)
    gpt2 = _model().gpt2
    weights = {n: p for n, p in gpt2.named_parameters() if n.endswith("weight")}
    save_masks(path, magnitude_masks(weights, 0.7), gpt2, "global")
    return str(path)


def _config(masks: str | None, **over) -> RunConfig:
    options = {"stages": 2, "microbatches": MICRO, **({"masks": masks} if masks else {})}
    return checked_config({**BASE, "strategy_options": options, **over})


def _ctx(rank: int, world: int) -> DistContext:
    return DistContext(
        rank=rank, world_size=world, local_rank=rank, backend="gloo", device=torch.device("cpu")
    )


def _stage_state(out: Path, rank: int) -> dict:
    (fingerprint,) = [p for p in (out / "ckpt").iterdir() if p.is_dir()]
    info = json.loads((fingerprint / "latest.json").read_text())
    assert info["complete"] is True
    return torch.load(fingerprint / f"step-{info['step']:08d}" / f"rank{rank}.pt", weights_only=False)


def _paper_step(rank: int, world: int, masks: str | None) -> dict:
    """The sparse AxoNN stage's arithmetic (papers/sparse_axonn/train.py) on the loop's batches."""
    seed_everything(0)
    gpt2 = _model().gpt2
    pruned = load_masks(masks).masks if masks else {}
    apply_masks(gpt2, pruned)
    grid = ProcessGrid.create(2, num_blocks=N_LAYER)
    stage = GPT2Stage(gpt2, grid.stage, grid.num_stages)
    if masks:  # sparse AxoNN: compact AdamW and all-reduce
        training = CompactTraining(stage, pruned, lr=LR / WARMUP, weight_decay=0.01)
        trainer = PipelineTrainer(stage, grid, training, num_microbatches=MICRO, reduce_grads=training)
        set_lr, kept, numel = training.set_lr, training.layout.num_kept, training.layout.numel
    else:  # dense AxoNN: torch AdamW, one flat all-reduce
        dense = torch.optim.AdamW(stage.parameters(), lr=LR / WARMUP, weight_decay=0.01, foreach=False)
        trainer = PipelineTrainer(
            stage, grid, dense, num_microbatches=MICRO, reduce_grads=flat_all_reduce_grads
        )
        kept = numel = sum(p.numel() for p in stage.parameters())

        def set_lr(lr: float) -> None:
            dense.param_groups[0]["lr"] = lr

    data = load_dataset("tinyshakespeare", "train", limit=4096, seq_len=SEQ)
    replicas = [epoch_batches(len(data), BATCH, rank=r, world_size=2, seed=0, epoch=0) for r in range(2)]
    losses, bits = [], []
    for step in range(STEPS):
        x, y = data.get_batch(torch.cat([replicas[r][step] for r in range(2)]))  # the global batch
        set_lr(LR * min(1.0, (step + 1) / WARMUP))
        s = trainer.train_step(x, y)
        losses.append(s.loss)
        bits.append(s.p2p_bits + s.allreduce_bits)
    return {
        "state": {k: v.clone() for k, v in stage.state_dict().items()},
        "losses": losses,
        "bits": bits,
        "kept": kept,
        "numel": numel,
    }


def _ranks(rank: int, world: int, masks: str | None, out: str, stop_at: int | None) -> dict:
    ctx = _ctx(rank, world)

    def stop(info: StepInfo) -> None:
        if info.step == stop_at:
            raise Stop

    try:
        metrics = train(_config(masks), out, ctx=ctx, callbacks=[stop])
    except Stop:
        return {"stopped": True}
    return {"metrics": metrics, "paper": _paper_step(rank, world, masks)}


@pytest.fixture(scope="module", params=["sparse", "dense"])
def runs(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"pipeline-{request.param}")
    masks = _masks_file(tmp / "masks.pt") if request.param == "sparse" else None
    out = tmp / "run"
    results = run_ranks(_ranks, 4, masks, str(out), None, tmp_path=tmp, timeout=300)
    return SimpleNamespace(kind=request.param, masks=masks, out=out, results=results, tmp=tmp)


def test_the_loop_equals_the_paper_stage_bit_for_bit(runs):
    masks, out, results = runs.masks, runs.out, runs.results
    for rank, result in enumerate(results):
        loop = _stage_state(out, rank)["model"]
        paper = result["paper"]["state"]
        assert loop.keys() == paper.keys()
        for name, value in paper.items():
            assert torch.equal(loop[name], value), (rank, name)
    if masks:  # pruned weights stay exactly zero on every stage
        pruned = load_masks(masks).masks
        for rank in range(4):
            state = _stage_state(out, rank)["model"]
            for name, mask in pruned.items():
                if name in state:
                    assert not state[name][~mask].any(), name
    # the training curve: the mean over the replicas of their losses, as the paper logs
    import csv

    with (out / "train_curve.csv").open() as f:
        logged = [float(r["train_loss"]) for r in csv.DictReader(f)]
    assert logged == results[0]["paper"]["losses"]  # the same all-reduce of the same shares


def test_bits_are_the_sent_activations_and_the_stage_all_reduce(runs):
    kind, out, results = runs.kind, runs.out, runs.results
    metrics = json.loads((out / "metrics.json").read_text())
    paper = results[0]["paper"]
    activations = BATCH * SEQ * N_EMBD * 32  # stage 0 sends M micro-batches of (B/M) x T x n_embd
    assert metrics["bits_per_step"] == activations + paper["kept"] * 32
    assert paper["bits"] == [metrics["bits_per_step"]] * STEPS  # the paper stage counts the same
    assert metrics["dense_bits_per_step"] == activations + paper["numel"] * 32
    assert metrics["num_stages"] == 2 and metrics["num_replicas"] == 2
    assert (paper["kept"] < paper["numel"]) == (kind == "sparse")


def test_the_saved_model_is_the_whole_model_evaluated(runs):
    out = runs.out
    metrics = json.loads((out / "metrics.json").read_text())
    again = evaluate_trained(out, eval_limit=64)
    assert again["test_loss"] == pytest.approx(metrics["test_loss"], rel=1e-5)
    state = torch.load(out / MODEL_FILE, weights_only=True)
    assert any(k.startswith("gpt2.transformer.h.3.") for k in state)  # the last stage's blocks too
    assert sum(1 for _ in (out / "eval_curve.csv").read_text().splitlines()) == 1 + 2  # steps 3, 6


@pytest.mark.parametrize("runs", ["sparse"], indirect=True)  # it carries the compact optimizer state
def test_a_stopped_run_resumes_bit_exactly(runs):
    masks, out, tmp = runs.masks, runs.out, runs.tmp
    resumed = tmp / "resumed"
    assert run_ranks(_ranks, 4, masks, str(resumed), 5, tmp_path=tmp, timeout=300)[0] == {"stopped": True}
    run_ranks(_ranks, 4, masks, str(resumed), None, tmp_path=tmp, timeout=300)  # from step 3
    for rank in range(4):
        a, b = _stage_state(out, rank), _stage_state(resumed, rank)
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
        adam_a, adam_b = a["strategy"]["compact"], b["strategy"]["compact"]
        assert all(torch.equal(adam_a[k], adam_b[k]) for k in adam_a if isinstance(adam_a[k], torch.Tensor))


@pytest.mark.parametrize(
    ("over", "message"),
    [
        (
            {"model_options": {**MODEL_OPTIONS, "tied": True}},
            "set model: gpt2_small with model_options tied: false",
        ),
        ({"world_size": 3}, "pipeline stages=2 do not divide world_size=3"),
        ({"batch_size": 7}, r"batch_size 7 \(per replica\) must divide by microbatches=2"),
        ({"grad_clip_norm": 1.0}, "strategy pipeline ignores grad_clip_norm"),
        ({"optimizer": "sgd"}, "optimizer must be adamw"),
        (
            {"world_size": 8, "strategy_options": {"stages": 8}},
            "num_stages=8 exceeds the model's 4 transformer blocks",
        ),
        (
            {"strategy_options": {"stages": 2, "schedule": "1f1b", "microbatches": 1}},
            "1f1b needs microbatches >= stages",
        ),
        ({"strategy_options": {"stages": 2, "grads": "sparse"}}, "pipeline grads must be dense or packed"),
    ],
)
def test_bad_pipeline_runs_are_rejected_before_anything_starts(over, message):
    with pytest.raises(ValueError, match=message):
        checked_config({**BASE, "strategy_options": {"stages": 2}, **over})


def test_missing_masks_name_the_file(tmp_path):
    from trainer import default_strategy

    config = _config(str(tmp_path / "none.pt"))
    with pytest.raises(FileNotFoundError, match="none.pt does not exist: run the prune stage first"):
        default_strategy(config)


def test_drawn_batches_are_the_paper_stages_global_batch_split_over_the_replicas():
    """``sampling: draws``: the shares of a step, in replica order, are the sparse AxoNN stage's
    global batch of that step (papers.sparse_axonn.model.batch)."""
    from papers.sparse_axonn.model import batch
    from trainer.data import drawn_batch

    data = load_dataset("tinyshakespeare", "train", limit=512, seq_len=SEQ)
    for step in (0, 7, 3999):
        shares = [drawn_batch(len(data), 4, rank=r, world_size=4, seed=3, step=step) for r in range(4)]
        x, y = data.get_batch(torch.cat(shares))
        px, py = batch(data, 3, step, 16)
        assert torch.equal(x, px) and torch.equal(y, py)
    with pytest.raises(ValueError, match="first_step 5 needs sampling: draws"):
        checked_config({"first_step": 5})
    with pytest.raises(ValueError, match="unknown sampling 'shuffle'; valid: epochs, draws"):
        checked_config({"sampling": "shuffle"})
    base = checked_config({})  # draws change the computation: another checkpoint folder
    assert base.fingerprint() != checked_config({"sampling": "draws"}).fingerprint()
