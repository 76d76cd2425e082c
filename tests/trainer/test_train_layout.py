"""The loop reads its config once: run assembly (trainer/run.py) builds every component, and
the step functions of trainer/loop.py take those built objects, never a ``RunConfig`` or
anything that holds one. Every function of trainer under 60 lines, every module under 400."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import typing
from pathlib import Path
from typing import Any

import torch

import trainer.loop as loop_module
from common.config import RunConfig
from trainer import evaluate
from trainer.data.base import DatasetInfo
from trainer.data.images import ImageDataset
from trainer.distributed import DistContext
from trainer.paths import REPO_ROOT
from trainer.plan import Loop
from trainer.run import build_loop

TRAIN = REPO_ROOT / "trainer"
LOOP = TRAIN / "loop.py"


def _functions(path: Path) -> list[ast.FunctionDef]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]


def test_the_loop_module_never_reads_a_config():
    """No ``.config`` attribute, no ``RunConfig`` and no parameter named ``config`` in loop.py."""
    tree = ast.parse(LOOP.read_text(), filename=str(LOOP))
    reads = [
        f"line {node.lineno}: .config"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "config"
    ]
    names = [
        f"line {node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if (isinstance(node, ast.Name) and node.id == "RunConfig")
        or (isinstance(node, ast.alias) and node.name == "RunConfig")
    ]
    parameters = [
        f"{function.name}({arg.arg})"
        for function in _functions(LOOP)
        for arg in [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]
        if "config" in arg.arg.lower()
        or (arg.annotation is not None and "Config" in ast.unparse(arg.annotation))
    ]
    assert reads == [] and names == [] and parameters == []


def _holds_a_config(hint: Any, seen: set[type]) -> bool:
    """Whether the type ``hint`` is, or (through dataclass fields, unions and generics) holds, a RunConfig."""
    if hint is RunConfig:
        return True
    if isinstance(hint, type) and dataclasses.is_dataclass(hint) and hint not in seen:
        seen.add(hint)
        return any(_holds_a_config(h, seen) for h in typing.get_type_hints(hint).values())
    return any(_holds_a_config(arg, seen) for arg in typing.get_args(hint))


def test_the_step_functions_take_only_built_objects():
    """By signature: the step, the log and evaluation steps and the loop over them take the plan,
    the state and values, none of which is or holds a RunConfig."""
    steps = [
        loop_module.run_steps,
        loop_module._train_step,
        loop_module._after_step,
        loop_module._log_step,
        loop_module._evaluate_step,
        loop_module._Batches.__init__,
        loop_module._Batches.at,
        evaluate,
    ]
    for function in steps:
        hints = typing.get_type_hints(function)
        assert set(inspect.signature(function).parameters) - {"self"} <= set(hints), function.__name__
        offenders = [name for name, hint in hints.items() if _holds_a_config(hint, set())]
        assert offenders == [], f"{function.__qualname__} takes a config through {offenders}"


def _reachable_configs(root: object) -> list[str]:
    """Paths from ``root`` to every RunConfig it holds: through dataclass fields, containers,
    closures, partials and the attributes of this repository's objects (strategies, data sets)."""
    found: list[str] = []
    seen: set[int] = set()
    stack: list[tuple[str, object]] = [("loop", root)]
    while stack:
        path, value = stack.pop()
        if id(value) in seen or isinstance(value, (str, bytes, int, float, bool, torch.Tensor, type(None))):
            continue
        seen.add(id(value))
        if isinstance(value, RunConfig):
            found.append(path)
            continue
        children: list[tuple[str, object]] = []
        if isinstance(value, dict):
            children = [(f"{path}[{k!r}]", v) for k, v in value.items()]
        elif isinstance(value, (list, tuple, set)):
            children = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
        elif isinstance(value, functools.partial):
            children = [(f"{path}.args", value.args), (f"{path}.keywords", value.keywords)]
        elif inspect.ismethod(value):
            children = [(f"{path}.__self__", value.__self__), (f"{path}.__func__", value.__func__)]
        elif inspect.isfunction(value):
            cells = value.__closure__ or ()
            children = [(f"{path}<{n}>", c.cell_contents) for n, c in zip(value.__code__.co_freevars, cells)]
        elif hasattr(value, "__dict__") and (
            type(value).__module__.startswith(("common.", "trainer.", "torch.optim"))
            or isinstance(value, torch.nn.Module)
        ):
            children = [(f"{path}.{k}", v) for k, v in vars(value).items()]
        stack.extend(children)
    return found


def _built_loop(tmp_path: Path, overrides: dict[str, Any]) -> Loop:
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (64, 1, 8, 8), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 3, (64,), generator=generator)
    info = DatasetInfo("synthetic", "image", num_classes=3, input_shape=(1, 8, 8))
    data = ImageDataset(info, images, labels, mean=(0.5,), std=(0.25,), classes=("a", "b", "c"))
    config = RunConfig.from_dict(
        {"model": "mlp", "batch_size": 8, "world_size": 1, "lr_schedule": "cosine", **overrides}
    )
    ctx = DistContext(rank=0, world_size=1, local_rank=0, backend="gloo", device=torch.device("cpu"))
    return build_loop(config, ctx, None, (data, data), "fp32", artifacts_dir=tmp_path)


def test_the_built_loop_holds_no_config(tmp_path):
    """What run assembly hands the loop (plan, batch source, schedule closure, strategy, optimizer)
    holds values and callables made from the config, never the config itself."""
    for overrides in (
        {"compressor": "randomk", "compressor_options": {"density": 0.1}, "error_feedback": True},
        {"augment": "crop_flip", "grad_clip_norm": 1.0, "precision": "fp16", "sampling": "draws"},
        {"strategy": "dgc", "compressor": "topk", "compressor_options": {"density": 0.1}},
    ):
        loop = _built_loop(tmp_path, overrides)
        assert _reachable_configs(loop) == [], overrides


def test_functions_and_modules_of_the_training_package_are_small():
    long_functions = [
        f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sorted(TRAIN.glob("*.py"))
        for node in _functions(path)
        if node.end_lineno is not None and node.end_lineno - node.lineno + 1 > 60
    ]
    long_modules = [p.name for p in TRAIN.glob("*.py") if len(p.read_text().splitlines()) > 400]
    assert long_functions == [] and long_modules == []
