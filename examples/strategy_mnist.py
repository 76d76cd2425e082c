"""Every method of the six papers in a plain PyTorch loop (not thinwire's), two lines each.

    torchrun --standalone --nproc_per_node 2 examples/strategy_mnist.py --method def
    torchrun --standalone --nproc_per_node 2 examples/strategy_mnist.py --method dgc --steps 300
    torchrun --standalone --nproc_per_node 4 examples/strategy_mnist.py --method matcha
    torchrun --standalone --nproc_per_node 2 examples/strategy_mnist.py --method terngrad,def,exdyna

Methods: ``terngrad``, ``qsgd`` (4 bits), ``dgc`` (0.1 %, momentum correction, masking, warm-up),
``def`` and ``def_a`` (random block 1/16, mu 0.3; DEF-A averages every 4 steps), ``exdyna`` (1 %),
``matcha`` (gossip over the 2-node graph or a ring, budget 0.5) and ``sparse_axonn`` (80 % pruned,
compact AdamW and all-reduce over the unpruned entries). The model is the user's own plain module,
not wrapped in DDP: the method makes every exchange. The thinwire lines are the method's
constructor (:func:`build_method`; every strategy takes ``(compressor or None, *, options, seed,
**parts)``) and ``strategy.optimizer(model, torch.optim.SGD, ...)``; each
``optimizer.step()`` then averages (or compresses, or gossips) and updates as the thinwire loop
does, and ``with strategy.evaluating(model):`` evaluates what the method defines as the model (DEF's
virtual iterate, the average of the gossiping workers' models). Real MNIST
(``../shared/data``), a small CNN, SGD with momentum (AdamW for sparse AxoNN). Prints test
accuracy and the bits each rank sent against fp32's. ``--checkpoint`` saves model, optimizer and
method state per rank at the end and resumes from them: the continued run equals an uninterrupted
one bit for bit.

Sparse AxoNN's masks here prune the freshly initialised weights by magnitude; its pipeline prunes a
trained model (``papers/sparse_axonn/prune.py``) and loads the masks with
``papers.sparse_axonn.pruning.load_masks`` (sparse AxoNN's own code lives in its paper's folder).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from common.compressors import build_compressor
from common.data import load_dataset
from common.gossip import GossipStrategy
from common.strategies import (
    DataParallel,
    DetachedEFDataParallel,
    DGCDataParallel,
    SparseDataParallel,
    SyncStrategy,
)
from papers.sparse_axonn.pruning import magnitude_masks
from papers.sparse_axonn.strategies import CompactDataParallel

METHODS = ("terngrad", "qsgd", "dgc", "def", "def_a", "exdyna", "matcha", "sparse_axonn")


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10),
    )  # fmt: skip


def build_method(name: str, model: nn.Module, world: int) -> SyncStrategy:
    """The one line that picks the method (``model``: sparse AxoNN prunes it)."""
    if name == "terngrad":
        return DataParallel(build_compressor("terngrad"))
    if name == "qsgd":
        return DataParallel(build_compressor("qsgd", bits=4))
    if name == "dgc":
        warmup = [0.25, 0.0625, 0.015625, 0.004]  # the paper's densities over the first epochs
        dgc = build_compressor("dgc", density=0.001)
        return DGCDataParallel(
            dgc, momentum=0.9, weight_decay=5e-4, options={"warmup": warmup, "warmup_epochs": 0.5}
        )
    if name in ("def", "def_a"):
        options = {"mu": 0.3, "average_every": 4 if name == "def_a" else None}
        block = build_compressor("random_block", density=1 / 16)
        return DetachedEFDataParallel(block, momentum=0.9, weight_decay=5e-4, options=options)
    if name == "exdyna":
        return SparseDataParallel(options={"selector": "exdyna", "density": 0.01})
    if name == "matcha":
        graph = {"graph": "erdos_renyi", "edge_prob": 1.0} if world < 3 else {"graph": "ring"}
        return GossipStrategy(options={"mode": "matcha", "budget": 0.5, **graph})
    if name == "sparse_axonn":
        weights = {n: p for n, p in model.named_parameters() if p.dim() > 1}
        return CompactDataParallel(masks=magnitude_masks(weights, 0.8), weight_decay=0.01)
    raise ValueError(f"unknown method {name!r}; valid: {', '.join(METHODS)}")


def train_one(method: str, steps: int, checkpoint: Path | None, rank: int, world: int) -> dict:
    """Train ``method`` from the same initial model for ``steps`` (resuming from ``checkpoint``
    if it exists, saving there at the end); returns what rank 0 prints."""
    torch.manual_seed(0)
    model = small_cnn()
    strategy = build_method(method, model, world)
    if method == "sparse_axonn":
        optimizer = strategy.optimizer(model, torch.optim.AdamW, lr=1e-3)
    else:
        optimizer = strategy.optimizer(model, torch.optim.SGD, lr=0.05, momentum=0.9, weight_decay=5e-4)
    start = 0
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        strategy.load_state_dict(state["strategy"])
        start = state["step"]

    train = load_dataset("mnist", "train")
    steps_per_epoch = len(train) // (64 * world)
    for step in range(start, start + steps):
        # this rank's batch: a seeded permutation per step, each rank its own slice
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(step))
        x, y = train.get_batch(order[rank * 64 : (rank + 1) * 64])
        strategy.set_epoch(step / steps_per_epoch)  # DGC's warm-up reads it
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()  # the method's exchange and update

    test = load_dataset("mnist", "test")
    with torch.no_grad(), strategy.evaluating(model):
        x, y = test.get_batch(torch.arange(rank, len(test), world))
        correct = torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)], dtype=torch.float64)
    dist.all_reduce(correct)
    if checkpoint is not None:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "strategy": strategy.state_dict(), "step": start + steps}  # fmt: skip
        torch.save(state, checkpoint)
    summary = strategy.stats.summary()
    return {
        "method": method, "steps": start + steps, "world_size": world,
        "test_accuracy": float(correct[0] / correct[1]),
        "bits_per_step": summary["bits_per_step"], "compression_factor": summary["compression_factor"],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--method", default="def", help=f"one of {', '.join(METHODS)}, or several (a,b), one after the other"
    )
    parser.add_argument("--steps", type=int, default=100, help="training steps (batches of 64 per rank)")
    parser.add_argument(
        "--checkpoint", default=None, help="save at the end (one file per rank); resume if there"
    )
    args = parser.parse_args()
    methods = args.method.split(",")
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        parser.error(f"unknown method(s) {', '.join(unknown)}; valid: {', '.join(METHODS)}")
    if args.checkpoint and len(methods) > 1:
        parser.error("--checkpoint holds one method's state: name one --method")

    dist.init_process_group("gloo")  # NCCL on GPUs
    rank, world = dist.get_rank(), dist.get_world_size()
    checkpoint = Path(f"{args.checkpoint}.rank{rank}") if args.checkpoint else None
    for method in methods:
        result = train_one(method, args.steps, checkpoint, rank, world)
        if rank == 0:
            print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
