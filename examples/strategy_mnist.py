"""Every method of the six papers in a plain PyTorch loop (not thinwire's), two lines each.

    torchrun --standalone --nproc_per_node 2 examples/strategy_mnist.py --method def
    torchrun --standalone --nproc_per_node 2 examples/strategy_mnist.py --method dgc --steps 300
    torchrun --standalone --nproc_per_node 4 examples/strategy_mnist.py --method matcha
    torchrun --standalone --nproc_per_node 2 examples/strategy_mnist.py --method terngrad,def,exdyna
    torchrun --standalone --nproc_per_node 2 examples/strategy_mnist.py --method def --lr 0.02 \
        --steps 2000 --eval-every 100 --def-eval-at virtual

Methods (the arguments of docs/library.md's method table): ``fp32`` (plain averaging, for
reference), ``terngrad``, ``qsgd`` (4 bits), ``dgc`` (1 %, momentum correction, masking, 47 steps
of warm-up), ``def`` and ``def_a`` (random block 1/16, mu 0.3, lr 0.01, evaluated at ``x``; DEF-A
averages every 4 steps), ``exdyna`` (0.1 %), ``matcha`` (gossip over the complete graph, or a ring
from 3 ranks, budget 0.5) and ``sparse_axonn`` (80 % pruned, compact AdamW and all-reduce over the
unpruned entries); SGD at lr 0.05 unless said. The model is the user's own plain module, not
wrapped in DDP: the method makes every exchange. The thinwire lines are the method's constructor
(:func:`build_method`; every strategy takes ``(compressor or None, *, options, seed, **parts)``)
and ``strategy.optimizer(model, torch.optim.SGD, ...)``; each
``optimizer.step()`` then averages (or compresses, or gossips) and updates as the thinwire loop
does, and ``with strategy.evaluating(model):`` evaluates what the method defines as the model (DEF's
``x`` here, ``--def-eval-at virtual`` for its virtual iterate; the average of the gossiping
workers' models). Real MNIST (``../shared/data``), a small CNN, SGD with momentum (AdamW for sparse
AxoNN). Prints test accuracy (every ``--eval-every`` steps too: ``curve``) and the bits each rank
sent against fp32's. ``--checkpoint`` saves model, optimizer and method state per rank at the end
and resumes from them: the continued run equals an uninterrupted one bit for bit.

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
from common.strategies import (
    DataParallel,
    DetachedEFDataParallel,
    DGCDataParallel,
    SparseDataParallel,
    SyncStrategy,
)
from papers.matcha.gossip import GossipStrategy
from papers.sparse_axonn.pruning import magnitude_masks
from papers.sparse_axonn.strategies import CompactDataParallel
from trainer.data import load_dataset

METHODS = ("fp32", "terngrad", "qsgd", "dgc", "def", "def_a", "exdyna", "matcha", "sparse_axonn")


#: SGD's learning rate per method where it is not 0.05 (DEF's gradients are taken at a point that
#: lags its update by ~(1 - mu) / density steps: 0.05 diverges, docs/library.md), AdamW's for sparse AxoNN.
LEARNING_RATES = {"def": 0.01, "def_a": 0.01, "sparse_axonn": 1e-3}


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10),
    )  # fmt: skip


def build_method(name: str, model: nn.Module, world: int, def_eval_at: str = "global") -> SyncStrategy:
    """The one line that picks the method (``model``: sparse AxoNN prunes it)."""
    if name == "fp32":
        return DataParallel()  # no compressor: plain averaging
    if name == "terngrad":
        return DataParallel(build_compressor("terngrad"))
    if name == "qsgd":
        return DataParallel(build_compressor("qsgd", bits=4))
    if name == "dgc":
        warmup = [0.25, 0.0625, 0.015625]  # the paper's first densities, over 0.1 epoch (47 steps)
        dgc = build_compressor("dgc", density=0.01)
        return DGCDataParallel(
            dgc, momentum=0.9, weight_decay=5e-4, options={"warmup": warmup, "warmup_epochs": 0.1}
        )
    if name in ("def", "def_a"):
        options = {"mu": 0.3, "average_every": 4 if name == "def_a" else None, "eval_at": def_eval_at}
        block = build_compressor("random_block", density=1 / 16)
        return DetachedEFDataParallel(block, momentum=0.9, weight_decay=5e-4, options=options)
    if name == "exdyna":
        return SparseDataParallel(options={"selector": "exdyna", "density": 0.001})
    if name == "matcha":
        graph = {"graph": "erdos_renyi", "edge_prob": 1.0} if world < 3 else {"graph": "ring"}
        return GossipStrategy(options={"mode": "matcha", "budget": 0.5, **graph})
    if name == "sparse_axonn":
        weights = {n: p for n, p in model.named_parameters() if p.dim() > 1}
        return CompactDataParallel(masks=magnitude_masks(weights, 0.8), weight_decay=0.01)
    raise ValueError(f"unknown method {name!r}; valid: {', '.join(METHODS)}")


def test_accuracy(strategy: SyncStrategy, model: nn.Module, rank: int, world: int) -> float:
    """Accuracy on the whole MNIST test split (each rank a half) at the method's evaluation point."""
    test = load_dataset("mnist", "test")
    with torch.no_grad(), strategy.evaluating(model):
        x, y = test.get_batch(torch.arange(rank, len(test), world))
        correct = torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)], dtype=torch.float64)
    dist.all_reduce(correct)
    return float(correct[0] / correct[1])


def train_one(
    method: str,
    steps: int,
    checkpoint: Path | None,
    rank: int,
    world: int,
    lr: float | None = None,
    eval_every: int = 0,
    def_eval_at: str = "global",
) -> dict:
    """Train ``method`` from the same initial model for ``steps`` (resuming from ``checkpoint``
    if it exists, saving there at the end), at ``lr`` (None: the method's in :data:`LEARNING_RATES`),
    evaluating every ``eval_every`` steps too (0: at the end only); returns what rank 0 prints."""
    torch.manual_seed(0)
    model = small_cnn()
    strategy = build_method(method, model, world, def_eval_at)
    lr = LEARNING_RATES.get(method, 0.05) if lr is None else lr
    if method == "sparse_axonn":
        optimizer = strategy.optimizer(model, torch.optim.AdamW, lr=lr)
    else:
        optimizer = strategy.optimizer(model, torch.optim.SGD, lr=lr, momentum=0.9, weight_decay=5e-4)
    start = 0
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        strategy.load_state_dict(state["strategy"])
        start = state["step"]
    curve: list[list[float]] = []

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
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < start + steps:
            curve.append([step + 1, test_accuracy(strategy, model, rank, world)])

    accuracy = test_accuracy(strategy, model, rank, world)
    if checkpoint is not None:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "strategy": strategy.state_dict(), "step": start + steps}  # fmt: skip
        torch.save(state, checkpoint)
    summary = strategy.stats.summary()
    result = {
        "method": method, "steps": start + steps, "world_size": world, "lr": lr,
        "test_accuracy": accuracy,
        "bits_per_step": summary["bits_per_step"], "compression_factor": summary["compression_factor"],
    }  # fmt: skip
    if method in ("def", "def_a"):
        result["eval_at"] = def_eval_at
    if eval_every:
        result["curve"] = [*curve, [start + steps, accuracy]]  # [step, test accuracy]
    return result


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
    parser.add_argument("--lr", type=float, default=None, help="override the method's learning rate")
    parser.add_argument("--eval-every", type=int, default=0, help="also evaluate every N steps (a curve)")
    parser.add_argument(
        "--def-eval-at", default="global", choices=("global", "virtual"),
        help="DEF's evaluation point: x (global, the table's) or the virtual iterate x - mean(e)",
    )  # fmt: skip
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
        result = train_one(
            method, args.steps, checkpoint, rank, world, args.lr, args.eval_every, args.def_eval_at
        )
        if rank == 0:
            print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
