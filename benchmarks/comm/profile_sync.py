"""Where GradientSync's explicit-path time goes: the sync alone, against the same sync in plain torch.

Run from the repository root::

    PYTHONPATH=. .venv/bin/torchrun --standalone --nproc_per_node 2 benchmarks/comm/profile_sync.py
    PYTHONPATH=. .venv/bin/torchrun --standalone --nproc_per_node 4 benchmarks/comm/profile_sync.py

Companion of ``bench_sync_overhead.py``: there the sync is one part of a training step, here it is
timed on its own (gradients computed once, then synchronised over and over), so the few hundred
microseconds thinwire adds are not lost in the step's noise. Timed, taking turns call by call:

- ``thinwire_per_tensor`` / ``thinwire_bucketed``: ``GradientSync(identity).sync_gradients(model)``
  with ``bucket_numel=None`` / ~25 MiB buckets;
- ``torch_per_tensor``: ``dist.all_reduce(g); g.div_(W)`` for every gradient;
- ``torch_bucketed``: cat, ``dist.all_reduce``, ``div_``, copy back (one bucket here);
- ``collectives_only``: ``dist.all_reduce`` on a preallocated flat buffer of all gradients: the
  floor of the bucketed variants;
- ``inplace_per_tensor`` / ``inplace_bucketed``: :class:`InPlaceMeanSync`, a local sketch of the
  change this profile suggests for ``common/comm/sync.py`` (average in place, no self-copy).

Then ``torch.profiler`` on rank 0 lists the operators of a few thinwire syncs (self CPU time), and
the CommStats phase seconds per call are printed. Rank 0 writes all of it to
``benchmarks/results/comm_sync_profile.md`` (overwritten; give ``--append`` to the second world
size's run, as ``run_all.sh`` does).
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _bench_util import (
    RESULTS_DIR,
    git_sha,
    init_gloo,
    load_average,
    log0,
    max_over_ranks,
    now_iso,
    quartiles,
)

from common.comm import GradientSync, all_reduce_sum_, get_world_size
from common.comm.stats import PHASES
from common.compressors import build_compressor
from trainer.models import build_model

MODEL_SHAPES = {"resnet20": (3, 32), "mlp": (1, 28)}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODEL_SHAPES), choices=list(MODEL_SHAPES))
    parser.add_argument("--repeats", type=int, default=100, help="timed calls per variant")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    parser.add_argument("--md", type=Path, default=RESULTS_DIR / "comm_sync_profile.md")
    parser.add_argument("--append", action="store_true", help="append to --md instead of overwriting it")
    parser.add_argument("--no-write", action="store_true")
    return parser.parse_args()


class InPlaceMeanSync(GradientSync):
    """GradientSync that averages in place and skips copying a result onto itself.

    The library's ``reduce_flat`` ends with ``mean = total.reshape(-1).to(flat.dtype) / world``: a
    new tensor per bucket (a fresh allocation the size of the bucket, i.e. page faults, and one
    more pass over memory), and ``sync`` then copies it back into the gradients, even when a
    bucket is one tensor whose all-reduced buffer already *is* the gradient. Here the sum is divided
    in place (it is the all-reduced wire tensor or a fresh decompression, which the docstring of
    ``reduce_flat`` already allows to overwrite) and the copy is skipped where source and target
    are the same memory. Sketch for the no-error-feedback all-reduce path only.
    """

    def reduce_flat(self, names: Sequence[str], flat: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
        if self.error_feedback is not None or not self.use_allreduce:
            return super().reduce_flat(names, flat, sizes)
        device = flat.device
        with self.stats.phase("compress", device):
            payload = self.compressor.compress(flat, self.rng(device))
        with self.stats.phase("communicate", device):
            for tensor in payload.wire.values():
                all_reduce_sum_(tensor, stats=self.stats, group=self.group)
        with self.stats.phase("decompress", device):
            mean = self.compressor.decompress(payload).reshape(-1).to(flat.dtype)
            mean.div_(get_world_size(self.group))
        if get_world_size(self.group) > 1:
            self.stats.dense_bits += flat.numel() * 32
        return mean

    def sync(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        for bucket in self.buckets(list(named_tensors)):
            tensors = [t for _, t in bucket]
            sizes = [t.numel() for t in tensors]
            flat = (
                tensors[0].reshape(-1) if len(tensors) == 1 else torch.cat([t.reshape(-1) for t in tensors])
            )
            mean = self.reduce_flat([name for name, _ in bucket], flat, sizes)
            for t, part in zip(tensors, mean.split(sizes), strict=True):
                if part.data_ptr() != t.data_ptr():
                    t.copy_(part.view_as(t))
        self.stats.steps += 1


def torch_per_tensor(grads: list[torch.Tensor], world: int) -> None:
    for g in grads:
        dist.all_reduce(g)
        g.div_(world)


def torch_bucketed(grads: list[torch.Tensor], world: int) -> None:
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat.div_(world)
    for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        g.copy_(part.view_as(g))


def check_same_result(grads: list[torch.Tensor], reference: GradientSync, candidate: GradientSync) -> None:
    """``candidate`` averages a copy of ``grads`` to exactly what ``reference`` gives."""
    outs = []
    for sync in (reference, candidate):
        copies = [(f"g{i}", g.clone()) for i, g in enumerate(grads)]
        sync.sync(copies)
        outs.append([t for _, t in copies])
    assert all(torch.equal(a, b) for a, b in zip(*outs, strict=True)), "InPlaceMeanSync changed the result"


def profile_model(model_name: str, args: argparse.Namespace, rank: int, world: int) -> list[str]:
    in_channels, image_size = MODEL_SHAPES[model_name]
    torch.manual_seed(0)
    model = build_model(model_name, in_channels=in_channels, image_size=image_size)
    gen = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(32, in_channels, image_size, image_size, generator=gen)
    y = torch.randint(0, 10, (32,), generator=gen)
    F.cross_entropy(model(x), y).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    identity = build_compressor("identity")
    per_tensor = GradientSync(identity, bucket_numel=None)
    bucket_numel = int(args.bucket_mb * 2**20) // 4
    bucketed = GradientSync(identity, bucket_numel=bucket_numel)
    inplace_per_tensor = InPlaceMeanSync(identity, bucket_numel=None)
    inplace_bucketed = InPlaceMeanSync(identity, bucket_numel=bucket_numel)
    calls: dict[str, Callable[[], object]] = {
        "collectives_only": functools.partial(dist.all_reduce, flat),
        "torch_per_tensor": functools.partial(torch_per_tensor, grads, world),
        "thinwire_per_tensor": functools.partial(per_tensor.sync_gradients, model),
        "torch_bucketed": functools.partial(torch_bucketed, grads, world),
        "thinwire_bucketed": functools.partial(bucketed.sync_gradients, model),
        "inplace_per_tensor": functools.partial(inplace_per_tensor.sync_gradients, model),
        "inplace_bucketed": functools.partial(inplace_bucketed.sync_gradients, model),
    }
    check_same_result(grads, per_tensor, inplace_per_tensor)
    check_same_result(grads, bucketed, inplace_bucketed)
    for _ in range(args.warmup):
        for call in calls.values():
            call()
    syncs = {
        "thinwire_per_tensor": per_tensor,
        "thinwire_bucketed": bucketed,
        "inplace_per_tensor": inplace_per_tensor,
        "inplace_bucketed": inplace_bucketed,
    }
    for sync in syncs.values():  # phase seconds of the timed calls only
        sync.stats.seconds = dict.fromkeys(PHASES, 0.0)
        sync.stats.steps = 0
    samples: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for i in range(args.repeats):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            dist.barrier()
            start = time.perf_counter()
            calls[name]()
            samples[name].append(time.perf_counter() - start)
    times = {name: max_over_ranks(s) for name, s in samples.items()}

    num_params = sum(g.numel() for g in grads)
    lines = [
        f"## {model_name}, W={world}: {len(grads)} gradient tensors, {num_params} entries "
        f"({num_params * 4 / 2**20:.2f} MiB)",
        "",
        "| sync variant | median ms | IQR ms | vs torch same bucketing | collectives per call |",
        "|---|---|---|---|---|",
    ]
    medians = {name: quartiles(t)[1] for name, t in times.items()}
    num_calls = {name: 1 for name in calls if not name.endswith("per_tensor")}
    for name, t in times.items():
        q1, median, q3 = quartiles(t)
        ref = "torch_per_tensor" if "per_tensor" in name else "torch_bucketed"
        ratio = median / medians[ref] if name.startswith(("thinwire", "inplace")) else float("nan")
        lines.append(
            f"| `{name}` | {median * 1e3:.3f} | {(q3 - q1) * 1e3:.3f} | "
            f"{'' if ratio != ratio else f'{ratio:.3f}'} | {num_calls.get(name, len(grads))} |"
        )
    lines += ["", "CommStats phase seconds per sync call (rank 0, timed calls):", ""]
    for name, sync in syncs.items():
        per_call = ", ".join(
            f"{p} {sync.stats.seconds[p] / max(sync.stats.steps, 1) * 1e3:.3f} ms" for p in PHASES
        )
        lines.append(f"- `{name}`: {per_call}")

    # Operator-level view of a few thinwire syncs (rank 0's table; every rank must call the syncs).
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            per_tensor.sync_gradients(model)
            bucketed.sync_gradients(model)
    if rank == 0:
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)
        lines += [
            "",
            "torch.profiler, 10 x (per-tensor + bucketed) thinwire syncs, rank 0:",
            "",
            "```",
            table,
            "```",
        ]
    log0("\n".join(lines))
    return lines


def main() -> None:
    args = parse_args()
    rank, world = init_gloo()
    try:
        load_start = load_average()
        sections = [
            f"# GradientSync sync-only profile, W={world} ({now_iso()}, git {git_sha()})",
            "",
            f"Command: `PYTHONPATH=. torchrun --standalone --nproc_per_node {world} "
            f"benchmarks/comm/profile_sync.py`. Time of a call = slowest rank; calls of the variants take "
            f"turns; {args.repeats} timed calls each. Load average at start: {load_start}.",
            "",
        ]
        for model_name in args.models:
            sections += [*profile_model(model_name, args, rank, world), ""]
        sections.append(f"Load average at end: {load_average()}.")
        if rank == 0 and not args.no_write:
            mode = "a" if args.append else "w"
            with args.md.open(mode) as f:
                f.write("\n".join(sections) + "\n\n")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
