"""Training-input throughput: decoding in process against the DataLoader path with 0, 1, 2 workers.

    PYTHONPATH=. .venv/bin/python benchmarks/data/bench_loader.py            # writes data_loader.md
    PYTHONPATH=. .venv/bin/python benchmarks/data/bench_loader.py --no-write --batches 10

Two sources: CIFAR-10 (the decoded cache, a uint8 tensor in memory: a batch is an index and a
normalisation) and an ImageNet-shaped folder of JPEGs made here (``--images`` random-noise JPEGs of
500 x 375, ImageNet's typical size, in 10 class folders; the train transform: random resized crop
to 224 and flip, decoded by ``--decode-threads`` threads per process). For each, the batches of one
epoch's sampler (batch 32, seed 0) are read ``--batches`` at a time: in process
(``get_batch``, the loop's default), and through ``trainer.data.loader.epoch_loader`` with 0, 1 and 2
worker processes. Nothing trains: this is the input side alone, on this machine's cores.
Reported: images per second (median of ``--repeats``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "comm"))
from _bench_util import git_sha, load_average, now_iso, write_markdown

from trainer.data import epoch_batches, load_dataset
from trainer.data.imagefolder import DECODE_THREADS_ENV
from trainer.data.loader import epoch_loader


def make_jpegs(root: Path, count: int) -> None:
    rng = np.random.default_rng(0)
    for k in range(count):
        folder = root / "train" / f"n{k % 10:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (375, 500, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"img_{k}.JPEG", quality=90)
    for k in range(10):  # the layout wants every validation class folder to hold an image
        folder = root / "val" / f"n{k:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (375, 500, 3), dtype=np.uint8)).save(folder / "val.JPEG")


def rate(dataset, batches: list[torch.Tensor], workers: int | None, repeats: int) -> float:
    images = sum(len(b) for b in batches)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        if workers is None:
            for b in batches:
                dataset.get_batch(b)
        else:
            for _ in epoch_loader(dataset, batches, workers=workers):
                pass
        seconds.append(time.perf_counter() - start)
    return images / statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--images", type=int, default=800)
    parser.add_argument("--decode-threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines = [
        "# Training input: in process against the DataLoader path (images / s)",
        "",
        f"`{' '.join(['python', *sys.argv])}` at git {git_sha()}, {now_iso()}, load {load_average()}, "
        f"{os.cpu_count()} CPUs; the script's docstring says what is read. Batch 32, {args.batches} "
        f"batches, median of {args.repeats}.",
        "",
        "| source | in process | loader, 0 workers | 1 worker | 2 workers |",
        "|---|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        make_jpegs(Path(tmp) / "ilsvrc", args.images)
        os.environ["THINWIRE_IMAGENET"] = str(Path(tmp) / "ilsvrc")
        os.environ[DECODE_THREADS_ENV] = str(args.decode_threads)
        for name in ("cifar10", "imagenet"):
            if name == "imagenet":  # its index into the temporary folder, not the repository's cache
                os.environ["THINWIRE_CACHE"] = str(Path(tmp) / "cache")
            dataset = load_dataset(name, "train")
            batches = epoch_batches(len(dataset), 32, rank=0, world_size=1, seed=0, epoch=0)[: args.batches]
            rates = [rate(dataset, batches, workers, args.repeats) for workers in (None, 0, 1, 2)]
            label = "CIFAR-10 (cached tensor)" if name == "cifar10" else (
                f"ImageNet-shaped JPEGs, 224 crop, {args.decode_threads} decode thread(s)")  # fmt: skip
            row = f"| {label} | " + " | ".join(f"{r:,.0f}" for r in rates) + " |"
            print(row, flush=True)
            lines.append(row)
    write_markdown("data_loader.md", lines, no_write=args.no_write)


if __name__ == "__main__":
    main()
