"""DGC in a user's own DDP loop (comm hook + optimizer) equals the thinwire loop's DGC step, on
real gloo ranks: momentum correction, masking, warm-up and local weight decay included."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from common.compressors import build_compressor
from common.strategies import DGCDataParallel
from tests.distributed import run_ranks

STEPS, LR, MOMENTUM, WD = 8, 0.1, 0.9, 1e-3
OPTIONS = {"warmup": [0.25, 0.1], "warmup_epochs": 0.5}  # steps 0-1 at 25 %, 2-3 at 10 %, then 5 %


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 24), nn.ReLU(), nn.Linear(24, 5))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(16, 12, generator=g), torch.randint(0, 5, (16,), generator=g)


def _strategy(options: dict) -> DGCDataParallel:
    compressor = build_compressor("dgc", density=0.05)
    return DGCDataParallel(compressor, momentum=MOMENTUM, weight_decay=WD, options=options)


def _both(rank: int, world: int, options: dict) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    # the thinwire loop's calls (trainer/): setup, param_groups, set_epoch, after_backward
    loop_model, loop = _model(), _strategy(options)
    loop.setup(loop_model)
    loop_opt = torch.optim.SGD(loop.param_groups(loop_model), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    # a user's DDP loop: the hook and DGC's optimizer
    user_model, user = DDP(_model()), _strategy(options)
    user_opt = user.install(user_model, lr=LR)
    for step in range(STEPS):
        x, y = _batch(rank, step)
        for model, strategy, opt in ((loop_model, loop, loop_opt), (user_model, user, user_opt)):
            strategy.set_epoch(step / 4)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            if strategy is loop:
                loop.after_backward(loop_model)
            opt.step()
    return {
        "loop": [p.detach().clone() for p in loop_model.parameters()],
        "user": [p.detach().clone() for p in user_model.module.parameters()],
        "bits": (loop.stats.bits_sent, user.stats.bits_sent),
        "steps": (loop.stats.steps, user.stats.steps),
        "metrics": (loop.metrics(), user.metrics()),
    }


@pytest.mark.parametrize("options", [OPTIONS, {**OPTIONS, "momentum_correction": False}], ids=["dgc", "gd"])
def test_dgc_through_the_hook_equals_the_thinwire_loop(tmp_path, options):
    for r in run_ranks(_both, 2, options, tmp_path=tmp_path):
        for a, b in zip(r["loop"], r["user"], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
        assert r["bits"][0] == r["bits"][1] > 0 and r["steps"] == (STEPS, STEPS)
        assert r["metrics"][0] == pytest.approx(r["metrics"][1])


def _bucket_in_background(rank: int, world: int) -> dict:
    """The hook's work on one bucket (two sparsified matrices, a bias between them), rank 1 late:
    rank 0's future is pending when returned, and the mean it ends with is the loop's."""
    import time

    model = _model()
    names = [n for n, _ in model.named_parameters()][:3]  # weight, bias, weight
    sizes = [p.numel() for _, p in list(model.named_parameters())[:3]]
    flat = torch.randn(sum(sizes), generator=torch.Generator().manual_seed(rank))
    loop, hook = _strategy({}), _strategy({})
    for strategy in (loop, hook):
        strategy._sparse_names = {n for n, _ in strategy._split(model)[0]}
        strategy.sparse.bucket_numel = strategy.dense.bucket_numel = 10**9  # one bucket per route
    parts = [t.clone() for t in flat.split(sizes)]
    loop.sparse.sync([(names[0], parts[0]), (names[2], parts[2])], count_step=False)
    loop.dense.sync([(names[1], parts[1])])
    hook.reduce_bucket_async(names, flat.clone(), sizes).wait()  # first call: plans, kernels loaded
    # Three tries, the same on both ranks (their collectives must pair up): one pending future shows
    # the work runs in the background. One try flaked under `make test`'s load, where rank 0's main
    # thread can lose the core long enough for the background gather to finish before it looks.
    pending, equal = [], []
    for _ in range(3):
        hook = _strategy({})  # each timed call starts from the same state as the loop's
        hook._sparse_names = loop._sparse_names
        hook.sparse.bucket_numel = hook.dense.bucket_numel = 10**9
        if rank == 1:
            time.sleep(2.0)
        future = hook.reduce_bucket_async(names, flat.clone(), sizes)
        pending.append(not future.done())
        equal.append(torch.equal(future.wait(), torch.cat(parts)))
    return {"pending": any(pending), "equal": all(equal)}


def test_the_hook_gathers_in_the_background_and_equals_the_loop(tmp_path):
    results = run_ranks(_bucket_in_background, 2, tmp_path=tmp_path)
    assert results[0]["pending"]
    assert all(r["equal"] for r in results)
