"""The examples run as a user runs them (torchrun, 2 gloo ranks) and do what their docstrings say.

One torchrun launch per script; the resume checks call the scripts' own training functions on the
session's 2 gloo ranks (``tests.distributed``), three runs each, without a launch's ~15 s of start-up.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.distributed import run_ranks
from tests.helpers.processes import run_group
from trainer.paths import REPO_ROOT

TORCHRUN = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node=2"]


def _examples(script: str, *args: str) -> list[dict]:
    """Every JSON line the script printed (rank 0: one per trained method)."""
    result = run_group([*TORCHRUN, str(REPO_ROOT / "examples" / script), *args], cwd=REPO_ROOT, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def _example(script: str, *args: str) -> dict:
    return _examples(script, *args)[-1]


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", REPO_ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ddp_hook_runs(rank: int, world: int, runs: list[list[str]]) -> list[dict]:
    """``ddp_hook_mnist.train`` once per argument list, one after the other, on these ranks."""
    script = _script("ddp_hook_mnist")
    return [script.train(script.parse_args(argv), rank, world) for argv in runs]


def _plain_loop_runs(rank: int, world: int, runs: list[tuple[int, str]]) -> list[dict]:
    """``strategy_mnist.train_one`` (DEF-A) for each (steps, checkpoint), as its ``main`` calls it."""
    script = _script("strategy_mnist")
    return [script.train_one("def_a", steps, Path(f"{ckpt}.rank{rank}"), rank, world) for steps, ckpt in runs]


@pytest.mark.parametrize(
    "args, factor",
    [
        (["--compressor", "terngrad"], 10),  # 2-bit codes and one scaler per tensor against fp32
        # each rank's residuals are its own: a resume must give every rank its own file
        (["--compressor", "topk", "--options", '{"density": 0.05}', "--error-feedback"], 5),
    ],
    ids=["terngrad", "topk-ef"],
)
def test_the_ddp_hook_example_trains_compressed_and_resumes_bit_exactly(tmp_path, args, factor):
    straight, split = tmp_path / "straight.pt", tmp_path / "split.pt"
    args = [*args, "--steps"]
    runs = [[*args, "12", "--checkpoint", str(split)]] * 2 + [[*args, "24", "--checkpoint", str(straight)]]
    first, resumed, whole = run_ranks(_ddp_hook_runs, 2, runs, tmp_path=tmp_path, timeout=300)[0]
    assert first["steps"] == 12 and resumed["steps"] == whole["steps"] == 24
    assert whole["test_accuracy"] > 0.5  # chance is 0.1
    assert whole["compression_factor"] > factor
    for rank in range(2):
        a = torch.load(f"{straight}.rank{rank}", weights_only=False)
        b = torch.load(f"{split}.rank{rank}", weights_only=False)
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert resumed["test_accuracy"] == whole["test_accuracy"]


# DEF-A in the resume test below
STRATEGY_METHODS = ("terngrad", "qsgd", "dgc", "def", "exdyna", "matcha", "sparse_axonn")


def test_every_method_trains_in_a_plain_loop():
    results = _examples("strategy_mnist.py", "--method", ",".join(STRATEGY_METHODS), "--steps", "30")
    assert [r["method"] for r in results] == list(STRATEGY_METHODS)  # one launch, one after the other
    for result in results:
        assert result["steps"] == 30
        assert result["test_accuracy"] > 0.3, result  # chance is 0.1
        assert result["bits_per_step"] > 0
        if result["method"] != "matcha":  # gossip sends whole models to its neighbours
            assert result["compression_factor"] > 1.5, result


def test_a_plain_loop_resumes_bit_exactly(tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    runs = [(10, str(split)), (10, str(split)), (20, str(straight))]
    _, resumed, whole = run_ranks(_plain_loop_runs, 2, runs, tmp_path=tmp_path, timeout=300)[0]
    assert resumed["steps"] == whole["steps"] == 20
    for rank in (0, 1):
        a = torch.load(f"{straight}.rank{rank}", weights_only=False)
        b = torch.load(f"{split}.rank{rank}", weights_only=False)
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert resumed["test_accuracy"] == whole["test_accuracy"]


def test_dgc_runs_its_whole_step_inside_ddp():
    result = _example("ddp_hook_mnist.py", "--dgc-step", "--options", '{"density": 0.01}', "--steps", "30")
    assert result["compressor"] == "dgc-step"
    assert result["test_accuracy"] > 0.3 and result["compression_factor"] > 10, result
