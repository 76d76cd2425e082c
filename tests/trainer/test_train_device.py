"""The loop's per-step bookkeeping stays on the device: no host read of a device value inside a
training step (fp16: exactly one, the skip decision), a non-finite loss still named by its step,
and evaluation totals equal to a plain-Python sum."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

import trainer.loop as train_module
from common.compressors import build_compressor
from common.config import RunConfig
from common.strategies import DataParallel
from tests.distributed import run_ranks
from tests.helpers.train_once import CONFIG
from trainer import StepInfo, evaluate, train
from trainer.checks import checked_config
from trainer.data.base import DatasetInfo
from trainer.data.images import ImageDataset
from trainer.data.text import TextDataset
from trainer.distributed import DistContext

# What a host read of a tensor's value dispatches (``.item()``, ``float()``, ``bool()``,
# ``torch.equal``, data-dependent shapes): on CUDA each one waits for the device.
HOST_READS = ("aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::is_nonzero", "aten::equal")

# Plain data parallelism (fp32 all-reduce, no error feedback) with SGD: torch's Adam reads its
# step counter with .item(), a CPU tensor's read even on CUDA, which this CPU test cannot tell apart.
PLAIN = {
    **CONFIG,
    "compressor": "identity",
    "compressor_options": {},
    "error_feedback": False,
    "epochs": 1,
    "train_limit": 256,
    "log_every": 4,
    "eval_every": 1000,
    "checkpoint_every": 1000,
}


def _ctx(rank: int, world: int) -> DistContext:
    return DistContext(
        rank=rank, world_size=world, local_rank=rank, backend="gloo", device=torch.device("cpu")
    )


class _OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched inside it, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[func._schema.name] += 1
        return func(*args, **(kwargs or {}))


def _ops_per_step(rank: int, world: int, out: str, overrides: dict) -> dict[str, Any]:
    """Train under ``_OpCounter`` around every ``_train_step``: each step's ops, and the log steps."""
    steps: list[Counter[str]] = []
    original = train_module._train_step

    def counted(*args: Any, **kwargs: Any) -> Tensor:
        with _OpCounter() as counter:
            loss = original(*args, **kwargs)
        steps.append(counter.ops)
        return loss

    with mock.patch.object(train_module, "_train_step", counted):
        config = checked_config({**PLAIN, "world_size": world, **overrides})
        metrics = train(config, out, ctx=_ctx(rank, world))
    rows = (Path(out) / "train_curve.csv").read_text().splitlines()[1:] if rank == 0 else []
    return {"steps": steps, "metrics": metrics, "logged": [int(r.split(",")[0]) for r in rows]}


@pytest.mark.parametrize(
    "world, precision, reads_per_step",
    [(1, "fp32", 0), (2, "fp32", 0), (2, "fp16", 1)],
    ids=["1-rank", "2-ranks", "2-ranks-fp16"],
)
def test_a_training_step_reads_no_device_value_on_the_host(tmp_path, world, precision, reads_per_step):
    """No .item()/float()/bool()/nonzero/equal inside a step: the loss is summed and checked on the
    device and read at log steps only, outside the step. fp16 keeps one read per step, the loss
    scale's skip decision (the loop must know whether to step the optimizer)."""
    results = run_ranks(
        _ops_per_step, world, str(tmp_path / "out"), {"precision": precision}, tmp_path=tmp_path
    )
    num_steps = 256 // (PLAIN["batch_size"] * world)
    assert results[0]["logged"] == list(range(4, num_steps + 1, 4))  # steps 1-3, 5-7 are not log steps
    for result in results:
        assert len(result["steps"]) == num_steps
        for step, ops in enumerate(result["steps"], start=1):
            assert ops["aten::addmm"] > 0, "the counter sees the step's ops"
            reads = {name: ops[name] for name in HOST_READS if ops[name]}
            expected = {"aten::_local_scalar_dense": reads_per_step} if reads_per_step else {}
            assert reads == expected, f"step {step}"
        assert (
            math.isfinite(result["metrics"]["train_loss"]) and result["metrics"]["sync_compute_seconds"] > 0
        )


class _LossBecomes(DataParallel):
    """Plain data parallelism whose reported loss becomes ``value`` at step ``at`` (1-based) on
    ``rank`` (the gradients stay finite: the run goes on until the loop reads the loss)."""

    def __init__(self, config: RunConfig, at: int, value: float, rank: int = 0) -> None:
        super().__init__(
            build_compressor(config.compressor, **config.compressor_options),
            seed=config.seed,
            error_feedback=config.error_feedback,
            transport=config.transport,
            bucket_numel=config.bucket_numel,
            compress_per_tensor=config.compress_per_tensor,
        )
        self.at, self.value, self.poisoned_rank, self.calls = at, value, rank, 0

    def forward_backward(self, model: nn.Module, x: Tensor, y: Tensor, loss_fn: Any) -> Tensor:
        loss = super().forward_backward(model, x, y, loss_fn)
        self.calls += 1
        poisoned = self.calls == self.at and torch.distributed.get_rank() == self.poisoned_rank
        return loss * self.value if poisoned else loss


def _train_until_error(rank: int, world: int, out: str, overrides: dict, at: int, value: float) -> str:
    config = checked_config({**PLAIN, "world_size": world, **overrides})
    try:
        train(config, out, ctx=_ctx(rank, world), strategy=_LossBecomes(config, at, value))
    except FloatingPointError as error:
        return str(error)
    return "no error"


@pytest.mark.parametrize("at, value", [(2, math.nan), (3, math.inf), (4, math.nan)])
def test_a_non_finite_loss_is_named_by_its_step_at_the_next_log(tmp_path, at, value):
    """The first non-finite loss is recorded on the device and raised, with its step, when the
    log step reads the window (steps 1-4 here); every rank raises, none waits for the others."""
    errors = run_ranks(_train_until_error, 2, str(tmp_path / "out"), {}, at, value, tmp_path=tmp_path)
    assert errors[0] == f"training loss became {value} at step {at}: lower lr"
    assert errors[1] == f"training loss became {value} on another rank by step 4: lower lr"


def test_no_checkpoint_is_written_after_a_non_finite_loss(tmp_path):
    """A checkpoint reads the record first: a loss that became nan at step 5 stops the run at the
    step-6 checkpoint (before the step-8 log), and the last checkpoint is step 4's."""
    out = tmp_path / "out"
    errors = run_ranks(
        _train_until_error, 1, str(out), {"checkpoint_every": 2}, 5, math.nan, tmp_path=tmp_path
    )
    assert errors == ["training loss became nan at step 5: lower lr"]
    (latest,) = (out / "ckpt").glob("*/latest.json")
    assert json.loads(latest.read_text())["step"] == 4


def test_step_info_loss_is_this_ranks_loss_read_when_asked(tmp_path):
    """``StepInfo.loss`` reads the step's loss only when a callback asks; with one rank and a log
    every step it is the logged training loss."""
    seen: list[tuple[float, float]] = []

    def record(info: StepInfo) -> None:
        seen.append((info.loss, info.logged["train_loss"]))

    config = checked_config({**PLAIN, "world_size": 1, "train_limit": 64, "log_every": 1})
    train(config, tmp_path, ctx=_ctx(0, 1), callbacks=[record])
    assert len(seen) == 4 and all(loss == logged for loss, logged in seen)


# -- evaluation ---------------------------------------------------------------------------------------


def _image_data() -> tuple[ImageDataset, nn.Module]:
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (37, 1, 5, 5), dtype=torch.uint8, generator=generator)  # odd sizes
    labels = torch.randint(0, 3, (37,), generator=generator)
    info = DatasetInfo("synthetic", "image", num_classes=3, input_shape=(1, 5, 5))
    data = ImageDataset(info, images, labels, mean=(0.5,), std=(0.25,), classes=("a", "b", "c"))
    torch.manual_seed(0)
    return data, nn.Sequential(nn.Flatten(), nn.Linear(25, 3))


def _text_data() -> tuple[TextDataset, nn.Module]:
    tokens = torch.randint(0, 11, (7 * 23 + 1,), generator=torch.Generator().manual_seed(0))
    info = DatasetInfo("synthetic", "text", vocab_size=11)
    data = TextDataset(info, tokens, seq_len=7, vocab=tuple("abcdefghijk"))
    torch.manual_seed(0)
    return data, nn.Sequential(nn.Embedding(11, 4), nn.Linear(4, 11))


DATA = {"image": _image_data, "text": _text_data}


def _plain_totals(kind: str, rank: int, world: int, batch_size: int) -> list[float]:
    """What evaluate sums on one rank, in Python floats: loss x examples, correct, examples."""
    data, model = DATA[kind]()
    loss_sum, correct, count = 0.0, 0, 0
    indices = list(range(rank, len(data), world))
    with torch.no_grad():
        for begin in range(0, len(indices), batch_size):
            x, y = data.get_batch(torch.tensor(indices[begin : begin + batch_size]))
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.flatten(0, -2), y.flatten()).item()
            loss_sum += loss * y.numel()
            correct += sum(a == b for a, b in zip(logits.argmax(-1).flatten().tolist(), y.flatten().tolist()))
            count += y.numel()
    return [loss_sum, float(correct), float(count)]


def _evaluate(rank: int, world: int, kind: str, batch_size: int) -> dict[str, float]:
    data, model = DATA[kind]()
    return evaluate(model, data, _ctx(rank, world), batch_size)


@pytest.mark.parametrize("kind, world", [("image", 1), ("image", 2), ("text", 1)])
def test_evaluate_sums_what_plain_python_sums(tmp_path, kind, world):
    """Totals accumulated on the device and all-reduced once give exactly the plain-Python sums."""
    results = run_ranks(_evaluate, world, kind, 8, tmp_path=tmp_path)
    loss_sum, correct, count = (
        sum(t) for t in zip(*(_plain_totals(kind, r, world, 8) for r in range(world)))
    )
    expected = {"test_loss": loss_sum / count, "test_accuracy": correct / count}
    if kind == "text":
        expected["test_perplexity"] = math.exp(min(loss_sum / count, 50.0))
    assert all(result == expected for result in results)
