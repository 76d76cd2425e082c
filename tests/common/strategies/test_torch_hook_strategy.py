"""PyTorch's own DDP comm hooks as a run strategy (``strategy: torch_hook``): the thinwire loop with
it gives the parameters of a user's plain DDP loop with the same hook, on real gloo ranks, and
counts what the hook hands to the collectives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from common.methods import checked_config
from common.strategies import TorchHookDataParallel
from tests.distributed import run_ranks
from trainer import MODEL_FILE, default_strategy, train
from trainer.data import load_dataset
from trainer.data.sampling import epoch_batches
from trainer.distributed import DistContext, seed_everything
from trainer.models import build_model

BASE = {
    "dataset": "mnist",
    "model": "mlp",
    "model_options": {"hidden_sizes": [64]},
    "train_limit": 384,
    "eval_limit": 128,
    "batch_size": 16,  # per rank: 12 steps
    "epochs": 1,
    "lr": 0.05,
    "momentum": 0.9,
    "world_size": 2,
    "eval_every": 1000,
    "log_every": 1000,
    "checkpoint_every": 1000,
    "strategy": "torch_hook",
}


def _both(rank: int, world: int, options: dict, out: str) -> dict:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    config = checked_config({**BASE, "strategy_options": options})
    ctx = DistContext(
        rank=rank, world_size=world, local_rank=rank, backend="gloo", device=torch.device("cpu")
    )
    metrics = train(config, out, ctx=ctx)
    thinwire = torch.load(Path(out) / MODEL_FILE) if rank == 0 else None

    data = load_dataset("mnist", "train", limit=384)
    seed_everything(config.seed)
    model = build_model("mlp", num_classes=10, in_channels=1, image_size=28, hidden_sizes=[64])
    if options["hook"] == "fp16":
        ddp = DDP(model)
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    else:
        ddp = DDP(model, bucket_cap_mb=1024)
        state = powerSGD_hook.PowerSGDState(
            None, matrix_approximation_rank=options["rank"], start_powerSGD_iter=2
        )
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for batch in epoch_batches(len(data), 16, rank=rank, world_size=world, seed=config.seed, epoch=0):
        x, y = data.get_batch(batch)
        optimizer.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
    user = {k: v.clone() for k, v in model.state_dict().items()}
    return {"thinwire": thinwire, "user": user, "metrics": metrics}


@pytest.mark.parametrize(
    "options", [{"hook": "fp16"}, {"hook": "powersgd", "rank": 2}], ids=["fp16", "powersgd"]
)
def test_the_loop_with_torchs_hook_equals_a_plain_ddp_loop_with_it(tmp_path, options):
    results = run_ranks(_both, 2, options, str(tmp_path / "run"), tmp_path=tmp_path)
    thinwire, user = results[0]["thinwire"], results[0]["user"]
    for key in thinwire:
        assert torch.equal(user[key], thinwire[key]), key
    metrics = results[0]["metrics"]
    numel = 784 * 64 + 64 + 64 * 10 + 10
    if options["hook"] == "fp16":  # the bucket in half precision
        assert metrics["bits_per_step"] == 16 * numel
    else:  # 2 plain steps, then 10 of P (784 x 2, 64 x 2... on the 64 x 784 and 10 x 64 weights)
        low_rank = (64 + 784) * 2 + 64 + (10 + 64) * 2 + 10  # P's and Q's, the biases whole
        assert metrics["bits_per_step"] == pytest.approx(32 * (2 * numel + 10 * low_rank) / 12)
        assert metrics["compression_factor"] > 5


def test_bad_options_and_a_users_loop_are_refused():
    with pytest.raises(ValueError, match="unknown torch_hook hook 'fp8'; valid: fp16, bf16, powersgd"):
        checked_config({**BASE, "strategy_options": {"hook": "fp8"}})
    with pytest.raises(ValueError, match="start_iter must be an integer >= 2"):
        checked_config({**BASE, "strategy_options": {"hook": "powersgd", "start_iter": 1}})
    with pytest.raises(ValueError, match="strategy torch_hook ignores bucket_numel"):
        checked_config({**BASE, "strategy_options": {"hook": "fp16"}, "bucket_numel": 1000})
    strategy = default_strategy(checked_config({**BASE, "strategy_options": {"hook": "bf16"}}))
    assert isinstance(strategy, TorchHookDataParallel) and strategy.options.hook == "bf16"
    with pytest.raises(TypeError, match="register_comm_hook"):
        strategy.optimizer(nn.Linear(2, 2))
