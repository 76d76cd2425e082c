"""A NaN gradient stops a run, naming the step and the tensor, in every strategy of the loop."""

from __future__ import annotations

import math

import pytest
import torch

from common.finite import NonFiniteGradient, assert_finite, flat_finite
from tests.distributed import run_ranks
from tests.helpers.train_once import CONFIG
from trainer import default_strategy, train
from trainer.checks import checked_config
from trainer.distributed import DistContext

BAD_STEP = 3
BASE = {**CONFIG, "max_steps": 6, "log_every": 2, "eval_every": 100, "checkpoint_every": 100, "world_size": 2}

STRATEGIES = {
    "data_parallel identity": {"compressor": "identity", "error_feedback": False, "compressor_options": {}},
    "data_parallel topk + EF": {"compressor": "topk", "compressor_options": {"density": 0.1}},
    "dgc": {
        "strategy": "dgc",
        "compressor": "dgc",
        "compressor_options": {"density": 0.1},
        "error_feedback": False,
    },
    "def": {
        "strategy": "def",
        "compressor": "random_block",
        "compressor_options": {"density": 0.1},
        "error_feedback": False,
    },
    "sparse exdyna": {
        "strategy": "sparse",
        "compressor": "identity",
        "compressor_options": {},
        "error_feedback": False,
        "strategy_options": {"selector": "exdyna", "density": 0.1},
    },
    "gossip": {
        "strategy": "gossip",
        "compressor": "identity",
        "compressor_options": {},
        "error_feedback": False,
        "strategy_options": {"graph": "erdos_renyi", "budget": 0.5},
    },
    "torch fp16 hook": {
        "strategy": "torch_hook",
        "compressor": "identity",
        "compressor_options": {},
        "error_feedback": False,
        "strategy_options": {"hook": "fp16"},
    },
}


def _poisoned_run(rank: int, world: int, out: str, overrides: dict) -> str:
    """Rank 1's first parameter gets a NaN gradient at step BAD_STEP; what each rank raised."""
    ctx = DistContext(
        rank=rank, world_size=world, local_rank=rank, backend="gloo", device=torch.device("cpu")
    )
    config = checked_config({**BASE, **overrides})
    strategy = default_strategy(config)
    setup = strategy.setup

    def poisoned_setup(model: torch.nn.Module) -> None:
        setup(model)
        calls = [0]

        def poison(grad: torch.Tensor) -> torch.Tensor:
            calls[0] += 1
            return grad * math.nan if rank == 1 and calls[0] == BAD_STEP else grad

        next(p for p in model.parameters() if p.requires_grad).register_hook(poison)

    strategy.setup = poisoned_setup  # type: ignore[method-assign]
    try:
        train(config, out, strategy=strategy, ctx=ctx)
    except (NonFiniteGradient, FloatingPointError, RuntimeError) as error:
        return f"{type(error).__name__}: {error}"
    return "finished"


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_a_nan_gradient_stops_the_run_naming_step_and_tensor(name, tmp_path):
    results = run_ranks(
        _poisoned_run, 2, str(tmp_path / "run"), STRATEGIES[name], tmp_path=tmp_path, timeout=180
    )
    # The rank whose gradient is NaN (or, where the hook already averaged it in, every rank)
    # stops at that step with the tensor named; no rank finishes the run as if nothing happened.
    assert "finished" not in results, results
    named = [r for r in results if r.startswith("NonFiniteGradient") and f"at step {BAD_STEP}" in r]
    assert named, results
    assert "is not finite at step" in named[0] and "gradient of " in named[0]


def test_the_flags_and_the_message():
    good, bad = torch.ones(5), torch.tensor([1.0, math.inf, math.nan])
    assert bool(flat_finite(good)) and not bool(flat_finite(bad))
    assert_finite(flat_finite(good), ["w"], [good], "at step 1")
    with pytest.raises(
        NonFiniteGradient, match=r"gradient of b is not finite at step 7: 2 of 3 entries \(the first is inf\)"
    ):
        assert_finite(flat_finite(torch.cat([good, bad])), ["a", "b"], [good, bad], "at step 7")


def _hooked_nan(rank: int, world: int, compressor: str, options: dict) -> str:
    """A user's own DDP script: thinwire's hook, the last rank's second layer's weight gradient NaN
    (one rank: the other ranks of a real run wait in the collective until the launcher stops them)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from common.comm import install_ddp_hook

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)))
    install_ddp_hook(model, compressor, **options)
    if rank == world - 1:
        model.module[2].weight.register_hook(lambda g: g * math.nan)
    try:
        model(torch.randn(4, 8)).sum().backward()
    except Exception as error:  # what surfaces from DDP's backward
        return f"{type(error).__name__}: {error}"
    return "finished"


@pytest.mark.parametrize(
    ("compressor", "options"),
    [("topk", {"density": 0.25, "error_feedback": True}), ("fp16", {}), ("terngrad", {})],
)
def test_a_nan_gradient_through_the_hook_names_the_tensor(compressor, options, tmp_path):
    (result,) = run_ranks(_hooked_nan, 1, compressor, options, tmp_path=tmp_path, timeout=60)
    assert result.startswith("NonFiniteGradient"), result
    assert "gradient of 2.weight is not finite in a reduction" in result, result
