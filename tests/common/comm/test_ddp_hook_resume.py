"""Every compressor through the DDP hook, on real gloo ranks: stopped at step k, DDP and the hook
rebuilt and their state loaded, the run continues bit-exactly as an uninterrupted one, on a model
whose buckets DDP rebuilds after its first step; and the hook gives the thinwire loop's per-tensor
result (GradientSync, one tensor at a time)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from common.comm import GradientSync, install_ddp_hook
from common.compressors import build_compressor
from tests.distributed import run_ranks

COMPRESSORS = {
    "identity": {},
    "fp16": {},
    "bf16": {},
    "topk": {"density": 0.05},
    "randomk": {"density": 0.1},
    "random_block": {"density": 0.1},
    "terngrad": {},
    "qsgd": {"bits": 4},
    "dgc": {"density": 0.05},
    "signsgd": {},
    "powersgd": {"rank": 2},
}
STEPS, STOP = 7, 3


class _Reordered(nn.Module):
    """Registered head first, used last: DDP's first buckets (reverse registration order) differ
    from the ones it rebuilds from the order gradients become ready (head first)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(32, 5)
        self.body = nn.Linear(24, 32)
        self.stem = nn.Linear(12, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(torch.relu(self.stem(x)))))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 12, generator=g), torch.randint(0, 5, (8,), generator=g)


def _hooked(name: str, state: dict | None = None):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_Reordered(), bucket_cap_mb=0.002)  # ~500 floats a bucket: several buckets
    sync = install_ddp_hook(model, name, error_feedback=True, seed=5, **COMPRESSORS[name])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if state is not None:
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sync.load_state_dict(state["sync"])
    return model, sync, opt


def _train(model, opt, rank: int, steps: range, sync: GradientSync | None = None) -> None:
    for step in steps:
        opt.zero_grad()
        x, y = _batch(rank, step)
        nn.functional.cross_entropy(model(x), y).backward()
        if sync is not None:  # the explicit path (no DDP)
            sync.sync_gradients(model)
        opt.step()


def _scenario(rank: int, world: int, name: str) -> dict:
    model, _, opt = _hooked(name)
    _train(model, opt, rank, range(STEPS))
    uninterrupted = [p.detach().clone() for p in model.module.parameters()]

    model, sync, opt = _hooked(name)
    _train(model, opt, rank, range(STOP))
    state = copy.deepcopy(
        {"model": model.module.state_dict(), "opt": opt.state_dict(), "sync": sync.state_dict()}
    )
    del model, sync, opt
    model, _, opt = _hooked(name, state)  # a fresh DDP: its first step is on the initial buckets again
    _train(model, opt, rank, range(STOP, STEPS))
    resumed = [p.detach().clone() for p in model.module.parameters()]

    explicit = _Reordered()
    sync = GradientSync(build_compressor(name, **COMPRESSORS[name]), error_feedback=True, seed=5)
    opt = torch.optim.SGD(explicit.parameters(), lr=0.1, momentum=0.9)
    _train(explicit, opt, rank, range(STEPS), sync)
    return {
        "uninterrupted": uninterrupted,
        "resumed": resumed,
        "loop": [p.detach().clone() for p in explicit.parameters()],
    }


@pytest.mark.parametrize("name", list(COMPRESSORS))
def test_resume_through_the_hook_is_bit_exact_and_equals_the_per_tensor_loop(tmp_path, name):
    results = run_ranks(_scenario, 2, name, tmp_path=tmp_path)
    for r in results:
        for a, b in zip(r["uninterrupted"], r["resumed"], strict=True):
            assert torch.equal(a, b)
        for a, b in zip(r["uninterrupted"], r["loop"], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(results[0]["resumed"], results[1]["resumed"], strict=True):
        assert torch.equal(a, b)  # the ranks agree
