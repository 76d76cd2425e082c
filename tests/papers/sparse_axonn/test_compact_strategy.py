"""Sparse AxoNN's compact data parallelism as a strategy, on real gloo ranks: a user's own loop
equals dense AdamW on the masked model with masked, averaged gradients (the paper's arithmetic,
bit for bit in fp32), the thinwire loop gives the same parameters, and a run validates its options."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from common.methods import checked_config
from papers.sparse_axonn.pruning import apply_masks, load_masks, magnitude_masks, save_masks
from papers.sparse_axonn.strategies import CompactDataParallel
from tests.distributed import run_ranks
from tests.helpers.strategies import assert_scheduled_lr_survives_a_resume
from trainer import MODEL_FILE, default_strategy, train
from trainer.data import load_dataset
from trainer.data.sampling import epoch_batches
from trainer.distributed import DistContext, seed_everything
from trainer.models import build_model

BASE = {
    "dataset": "mnist",
    "model": "mlp",
    "model_options": {"hidden_sizes": [32]},
    "train_limit": 512,
    "eval_limit": 256,
    "batch_size": 16,  # per rank: 16 steps
    "epochs": 1,
    "optimizer": "adamw",
    "lr": 3e-3,
    "weight_decay": 0.01,
    "world_size": 2,
    "eval_every": 1000,
    "log_every": 1000,
    "checkpoint_every": 1000,
}


def _model() -> nn.Module:
    return build_model("mlp", num_classes=10, in_channels=1, image_size=28, hidden_sizes=[32])


def _masks_file(tmp_path: Path) -> Path:
    seed_everything(0)
    model = _model()
    weights = {n: p for n, p in model.named_parameters() if n.endswith("weight")}
    path = tmp_path / "masks.pt"
    save_masks(path, magnitude_masks(weights, 0.8), model, "global")
    return path


def _loops(rank: int, world: int, masks_path: str, out: str) -> dict:
    config = checked_config(
        {**BASE, "strategy": "compact", "strategy_options": {"masks": masks_path}, "world_size": world}
    )
    ctx = DistContext(
        rank=rank, world_size=world, local_rank=rank, backend="gloo", device=torch.device("cpu")
    )
    train(config, out, ctx=ctx)
    thinwire = torch.load(Path(out) / MODEL_FILE) if rank == 0 else None
    data = load_dataset("mnist", "train", limit=512)
    batches = epoch_batches(len(data), 16, rank=rank, world_size=world, seed=0, epoch=0)
    masks = load_masks(masks_path).masks

    # a user's loop: the strategy's optimizer
    seed_everything(0)
    model = _model()
    strategy = CompactDataParallel(masks=masks, weight_decay=0.01)
    optimizer = strategy.optimizer(model, torch.optim.AdamW, lr=3e-3)
    # the reference: dense AdamW on the masked model, gradients averaged densely and masked
    seed_everything(0)
    dense = _model()
    apply_masks(dense, masks)
    reference = torch.optim.AdamW(dense.parameters(), lr=3e-3, weight_decay=0.01, foreach=False)
    for batch in batches:
        x, y = data.get_batch(batch)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        reference.zero_grad()
        nn.functional.cross_entropy(dense(x), y).backward()
        for name, p in dense.named_parameters():
            torch.distributed.all_reduce(p.grad)
            p.grad.div_(world)
            if name in masks:
                p.grad.masked_fill_(~masks[name], 0)
        reference.step()
    return {
        "thinwire": thinwire,
        "user": {k: v.clone() for k, v in model.state_dict().items()},
        "reference": {k: v.clone() for k, v in dense.state_dict().items()},
        "bits": strategy.stats.bits_sent,
        "dense_bits": strategy.stats.dense_bits,
        "kept": sum(int(m.sum()) for m in masks.values()),
    }


def test_the_compact_step_equals_dense_adamw_on_the_masked_model_and_the_thinwire_loop(tmp_path):
    masks = _masks_file(tmp_path)
    results = run_ranks(_loops, 2, str(masks), str(tmp_path / "run"), tmp_path=tmp_path)
    first = results[0]
    for key, value in first["reference"].items():
        assert torch.equal(first["user"][key], value), key  # bit for bit
        torch.testing.assert_close(first["thinwire"][key], value, rtol=1e-6, atol=1e-7)
    pruned = load_masks(masks).masks
    for name, mask in pruned.items():
        assert not first["user"][name][~mask].any()  # pruned weights stay exactly zero
    biases = 32 + 10  # dense: every entry is sent
    assert first["bits"] == 16 * (first["kept"] + biases) * 32  # the compact vector only
    assert first["dense_bits"] == 16 * (784 * 32 + 32 * 10 + biases) * 32


def test_a_compact_run_names_its_masks_and_uses_adamw(tmp_path):
    with pytest.raises(ValueError, match="compact masks must name the prune stage's mask file"):
        checked_config({**BASE, "strategy": "compact"})
    with pytest.raises(
        ValueError,
        match="strategy compact applies AdamW on the unpruned entries itself: optimizer must be adamw",
    ):
        checked_config(
            {**BASE, "strategy": "compact", "optimizer": "sgd", "strategy_options": {"masks": "m.pt"}}
        )
    with pytest.raises(ValueError, match="strategy compact ignores bucket_numel"):
        checked_config(
            {**BASE, "strategy": "compact", "bucket_numel": 64, "strategy_options": {"masks": "m.pt"}}
        )
    config = checked_config(
        {**BASE, "strategy": "compact", "strategy_options": {"masks": str(tmp_path / "no.pt")}}
    )
    with pytest.raises(FileNotFoundError, match="no.pt does not exist: run the prune stage first"):
        default_strategy(config)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_the_compact_strategy_reads_the_scheduled_lr_through_its_optimizer_also_after_a_resume():
    """The compact AdamW reads the lr the run's scheduler writes (tests/common/test_methods.py)."""
    strategy = CompactDataParallel(masks={"0.weight": torch.ones(3, 4, dtype=torch.bool)})
    assert_scheduled_lr_survives_a_resume(strategy, torch.optim.AdamW)
