"""A plain PyTorch DDP script (not thinwire's loop) with any thinwire compressor as its comm hook.

    torchrun --standalone --nproc_per_node 2 examples/ddp_hook_mnist.py --compressor terngrad
    torchrun --standalone --nproc_per_node 2 examples/ddp_hook_mnist.py --compressor topk \\
        --options '{"density": 0.01}' --error-feedback
    torchrun --standalone --nproc_per_node 2 examples/ddp_hook_mnist.py --compressor qsgd \\
        --options '{"bits": 4}' --steps 200
    torchrun --standalone --nproc_per_node 2 examples/ddp_hook_mnist.py --dgc-step \\
        --options '{"density": 0.001}'

Real MNIST (``../shared/data``, decoded once into the cache), a small CNN of the user's own, SGD
with momentum; the one thinwire line is ``install_ddp_hook``. With ``--dgc-step`` it is DGC's whole
step instead (momentum correction, masking, local weight decay; ``--compressor`` is then DGC's
sparsifier): ``DGCDataParallel(...).install(ddp_model, lr)`` registers the hook and returns the
optimizer. Prints test accuracy and the bits
the hook sent against fp32's. ``--checkpoint PATH`` saves model, optimizer and hook state at the end,
one file per rank (``PATH.rank<r>``: error-feedback residuals and random streams differ between
ranks), and resumes from them when they exist: the continued run equals an uninterrupted one bit
for bit (the hook's random draws are keyed by parameter, not by DDP's bucket order).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from common.comm import GradientSync, install_ddp_hook
from common.compressors import build_compressor
from common.strategies import DGCDataParallel
from trainer.data import load_dataset


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10),
    )  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--compressor", default=None, help="a thinwire compressor name (terngrad; dgc with --dgc-step)"
    )
    parser.add_argument("--options", default="{}", help="its options as JSON, e.g. '{\"density\": 0.01}'")
    parser.add_argument("--error-feedback", action="store_true", help="keep what compression left out")
    parser.add_argument("--steps", type=int, default=100, help="training steps (batches of 64 per rank)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="save at the end (PATH.rank<r>, one file per rank); resume from them if they exist",
    )
    parser.add_argument("--dgc-step", action="store_true", help="DGC's step (momentum correction) in DDP")
    return parser.parse_args(argv)


def train(args: argparse.Namespace, rank: int, world: int) -> dict:
    """Train (resuming from ``args.checkpoint`` if it exists, saving there at the end) in the
    process group this process has joined; returns what rank 0 prints."""
    torch.manual_seed(0)
    model = DistributedDataParallel(small_cnn())
    sync: DGCDataParallel | GradientSync
    if args.dgc_step:
        compressor = build_compressor(args.compressor or "dgc", **json.loads(args.options))
        sync = DGCDataParallel(compressor, momentum=0.9, weight_decay=5e-4)
        optimizer = sync.install(model, lr=args.lr)  # the hook, and SGD with DGC's local weight decay
    else:
        sync = install_ddp_hook(
            model,
            args.compressor or "terngrad",
            error_feedback=args.error_feedback,
            seed=0,
            **json.loads(args.options),
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start = 0
    checkpoint = Path(f"{args.checkpoint}.rank{rank}") if args.checkpoint else None
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        sync.load_state_dict(state["sync"])
        start = state["step"]

    train = load_dataset("mnist", "train")
    for step in range(start, start + args.steps):
        # this rank's batch: a seeded permutation per step, each rank its own slice
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(step))
        x, y = train.get_batch(order[rank * 64 : (rank + 1) * 64])
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()  # the hook averages the compressed gradients
        optimizer.step()

    test = load_dataset("mnist", "test")
    with torch.no_grad():
        x, y = test.get_batch(torch.arange(rank, len(test), world))
        correct = torch.tensor([(model.module(x).argmax(1) == y).sum().item(), len(y)], dtype=torch.float64)
    dist.all_reduce(correct)
    if checkpoint is not None:  # every rank its own file: its residuals are its own
        torch.save(
            {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
             "sync": sync.state_dict(), "step": start + args.steps},
            checkpoint,
        )  # fmt: skip
    dist.barrier()  # the checkpoint is whole before any rank returns (and may start again from it)
    summary = sync.stats.summary()
    return {
        "compressor": "dgc-step" if args.dgc_step else args.compressor or "terngrad", "steps": start + args.steps, "world_size": world,
        "test_accuracy": float(correct[0] / correct[1]),
        "bits_per_step": summary["bits_per_step"], "compression_factor": summary["compression_factor"],
    }  # fmt: skip


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")  # NCCL on GPUs
    result = train(args, dist.get_rank(), dist.get_world_size())
    if dist.get_rank() == 0:
        print(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
