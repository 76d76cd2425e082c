"""The examples run as a user runs them (torchrun, 2 gloo ranks) and do what their docstrings say."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from common.paths import REPO_ROOT
from tests.helpers.processes import run_group

TORCHRUN = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node=2"]


def _examples(script: str, *args: str) -> list[dict]:
    """Every JSON line the script printed (rank 0: one per trained method)."""
    result = run_group([*TORCHRUN, str(REPO_ROOT / "examples" / script), *args], cwd=REPO_ROOT, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def _example(script: str, *args: str) -> dict:
    return _examples(script, *args)[-1]


def test_the_ddp_hook_example_trains_compressed_and_resumes_bit_exactly(tmp_path):
    straight, split = tmp_path / "straight.pt", tmp_path / "split.pt"
    args = ["--compressor", "terngrad", "--steps"]
    first = _example("ddp_hook_mnist.py", *args, "12", "--checkpoint", str(split))
    resumed = _example("ddp_hook_mnist.py", *args, "12", "--checkpoint", str(split))
    whole = _example("ddp_hook_mnist.py", *args, "24", "--checkpoint", str(straight))
    assert first["steps"] == 12 and resumed["steps"] == whole["steps"] == 24
    assert whole["test_accuracy"] > 0.5  # chance is 0.1
    assert whole["compression_factor"] > 10  # 2-bit codes and one scaler per tensor against fp32
    a, b = torch.load(straight, weights_only=False), torch.load(split, weights_only=False)
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
    args = ["--method", "def_a", "--steps"]
    _example("strategy_mnist.py", *args, "10", "--checkpoint", str(split))
    resumed = _example("strategy_mnist.py", *args, "10", "--checkpoint", str(split))
    whole = _example("strategy_mnist.py", *args, "20", "--checkpoint", str(straight))
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
