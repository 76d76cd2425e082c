"""Every method of the six papers in a user's own training loop (``strategy.optimizer(model, ...)``,
``loss.backward()``, ``optimizer.step()``; no thinwire loop) gives the parameters the thinwire loop
(``trainer.train``) gives on the same data and seed, on real gloo ranks (2; MATCHA's ring 4)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tests.distributed import run_ranks
from trainer import MODEL_FILE, default_strategy, train
from trainer.checks import checked_config
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
    "lr": 0.05,
    "momentum": 0.9,
    "weight_decay": 1e-4,
    "world_size": 2,
    "eval_every": 1000,
    "log_every": 1000,
    "checkpoint_every": 1000,
}
METHODS = {
    "terngrad": {"compressor": "terngrad"},
    "qsgd": {"compressor": "qsgd", "compressor_options": {"bits": 4}},
    "topk_ef": {"compressor": "topk", "compressor_options": {"density": 0.05}, "error_feedback": True},
    "dgc": {"strategy": "dgc", "compressor": "dgc", "compressor_options": {"density": 0.05},
            "strategy_options": {"warmup": [0.25], "warmup_epochs": 0.5}},
    "def": {"strategy": "def", "compressor": "random_block", "compressor_options": {"density": 0.1},
            "strategy_options": {"mu": 0.3}},
    "def_a": {"strategy": "def", "compressor": "random_block", "compressor_options": {"density": 0.1},
              "strategy_options": {"mu": 0.3, "average_every": 4}},
    "exdyna": {"strategy": "sparse", "strategy_options": {"selector": "exdyna", "density": 0.01}},
    "matcha": {"strategy": "gossip", "strategy_options": {"graph": "ring", "budget": 0.5}},
}  # fmt: skip


def _both(rank: int, world: int, name: str, out: str) -> dict:
    config = checked_config({**BASE, **METHODS[name], "world_size": world})
    ctx = DistContext(
        rank=rank, world_size=world, local_rank=rank, backend="gloo", device=torch.device("cpu")
    )
    train(config, out, ctx=ctx)  # the thinwire loop; model.pt: the model as evaluated
    thinwire = torch.load(Path(out) / MODEL_FILE) if rank == 0 else None

    # a user's loop: the library's data and model, the user's own steps
    data = load_dataset("mnist", "train", limit=512)
    seed_everything(config.seed)
    model = build_model("mlp", num_classes=10, in_channels=1, image_size=28, hidden_sizes=[32])
    strategy = default_strategy(config)
    optimizer = strategy.optimizer(model, torch.optim.SGD, lr=0.05, momentum=0.9, weight_decay=1e-4)
    batches = epoch_batches(len(data), 16, rank=rank, world_size=world, seed=config.seed, epoch=0)
    for step, batch in enumerate(batches):
        strategy.set_epoch(step / len(batches))
        x, y = data.get_batch(batch)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    with strategy.evaluating(model):
        user = {k: v.clone() for k, v in model.state_dict().items()}
    return {"thinwire": thinwire, "user": user, "bits": strategy.stats.bits_sent}


@pytest.mark.parametrize("name", list(METHODS))
def test_a_users_loop_equals_the_thinwire_loop(tmp_path, name):
    world = 4 if name == "matcha" else 2  # a ring needs 3 nodes or more
    results = run_ranks(_both, world, name, str(tmp_path / "run"), tmp_path=tmp_path)
    thinwire, user = results[0]["thinwire"], results[0]["user"]
    assert thinwire.keys() == user.keys()
    for key in thinwire:
        torch.testing.assert_close(user[key], thinwire[key], rtol=1e-6, atol=1e-7)
    assert results[0]["bits"] > 0
