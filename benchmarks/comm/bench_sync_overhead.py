"""Training-step overhead of thinwire's GradientSync(identity) against DDP's built-in all-reduce.

Run from the repository root (once per world size; ``benchmarks/comm/run_all.sh`` does 2 and 4)::

    PYTHONPATH=. .venv/bin/torchrun --standalone --nproc_per_node 2 benchmarks/comm/bench_sync_overhead.py
    PYTHONPATH=. .venv/bin/torchrun --standalone --nproc_per_node 4 benchmarks/comm/bench_sync_overhead.py

One training step = zero_grad + forward + backward + gradient averaging + SGD step, on a fixed
random batch of 32 per rank (ResNet-20 on 3x32x32, the MLP on 1x28x28). Variants, all from the same
initial parameters:

- ``ddp`` (a): ``DistributedDataParallel`` with its built-in bucketed all-reduce (25 MiB buckets,
  1 MiB first bucket), which overlaps the all-reduce of a bucket with the rest of the backward.
- ``sync_per_tensor`` / ``sync_bucketed`` (b): plain model, ``GradientSync(identity)`` called after
  ``backward()`` (``sync_gradients``), one all-reduce per tensor or per ~25 MiB bucket. No overlap:
  communication starts only when the whole backward is done.
- ``ddp_hook`` (c): DDP + ``install_ddp_hook(model, "identity", error_feedback=False)``.

Diagnostic variants (``--diagnostics``, on by default) that split the overhead into its causes and
try the fixes suggested in the report, with local code only (nothing in ``common/`` changes):

- ``explicit_torch_per_tensor`` / ``explicit_torch``: the explicit path written with torch alone
  (cat, ``dist.all_reduce``, divide, copy back), per tensor or bucketed: what (b) costs without
  thinwire's wrapper, i.e. the price of the number of collectives and of not overlapping.
- ``ddp_hook_async``: (c) with a hook that launches the all-reduce with ``async_op=True`` and
  decompresses in the future's callback, so DDP can overlap it with the backward.
- ``sync_overlap``: (b) with the bucket all-reduces launched from post-accumulate-grad hooks during
  the backward and waited for before the optimizer step (DDP's bucket caps).

Each rank times each step after a barrier; a step's time is the slowest rank's. After warm-up, the
variants take turns step by step: in cycle ``c`` every variant runs one step, in an order rotated by
``c``. Load from other processes on a shared 2-core machine then falls on all variants alike, and
each cycle gives a paired ratio (variant step / ``ddp`` step of the same cycle). Reported: the
median and IQR of the step times, and the median and IQR of the paired ratios (the headline ratio)
next to the plain ratio of medians.
Rank 0 appends rows to ``benchmarks/results/comm_sync_overhead.csv`` and writes
``benchmarks/results/comm_sync_overhead.md`` (the latest run of each world size in the CSV).
"""

# No ``from __future__ import annotations``: DDP checks a comm hook's annotations at run time.
import argparse
import copy
import functools
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _bench_util import (
    REPO_ROOT,
    RESULTS_DIR,
    append_rows,
    git_sha,
    init_gloo,
    load_average,
    log0,
    max_over_ranks,
    now_iso,
    quartiles,
    read_rows,
)
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from common.comm import GradientSync, install_ddp_hook
from common.comm.stats import PHASES
from common.compressors import Compressor, Payload, build_compressor
from trainer.models import build_model

MODEL_SHAPES = {"resnet20": (3, 32), "mlp": (1, 28)}  # in_channels, image_size
BASELINE = "ddp"
MAIN_VARIANTS = ("ddp", "sync_per_tensor", "sync_bucketed", "ddp_hook")
DIAGNOSTIC_VARIANTS = ("explicit_torch_per_tensor", "explicit_torch", "ddp_hook_async", "sync_overlap")
# A ResNet-20 step takes ~0.5 s on 2 oversubscribed cores, an MLP step ~20 ms: more MLP steps.
DEFAULT_STEPS = {"resnet20": 40, "mlp": 300}
DDP_DEFAULT_BUCKET_MB = 25.0
DDP_FIRST_BUCKET_BYTES = 1 << 20  # dist._DEFAULT_FIRST_BUCKET_BYTES: DDP's first bucket, by default
COLUMNS = (
    "date",
    "git_sha",
    "backend",
    "world_size",
    "model",
    "num_params",
    "num_tensors",
    "variant",
    "bucket_numel",
    "ddp_bucket_bytes",
    "batch_per_rank",
    "steps",
    "median_s",
    "q1_s",
    "q3_s",
    "iqr_s",
    "ratio_vs_ddp",
    "ratio_q1",
    "ratio_q3",
    "ratio_of_medians",
    "fwd_bwd_median_s",
    "sync_median_s",
    "optim_median_s",
    "compress_s_per_step",
    "communicate_s_per_step",
    "decompress_s_per_step",
    "loadavg_start",
    "loadavg_end",
    "command",
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODEL_SHAPES), choices=list(MODEL_SHAPES))
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--warmup", type=int, default=3, help="untimed cycles before the timed ones")
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"timed steps (cycles) per variant (default per model: {DEFAULT_STEPS})",
    )
    parser.add_argument(
        "--bucket-mb",
        type=float,
        default=DDP_DEFAULT_BUCKET_MB,
        help="bucket size (MiB) of every bucketed variant, DDP included (DDP's default: 25, with a "
        "1 MiB first bucket; any other value also caps the first bucket, as in DDP)",
    )
    parser.add_argument(
        "--forward-sync-buffers",
        action="store_true",
        help="let DDP broadcast BatchNorm buffers every forward (its default); off so that every "
        "variant communicates only gradients",
    )
    parser.add_argument(
        "--diagnostics",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run explicit_torch, ddp_hook_async and sync_overlap",
    )
    parser.add_argument("--csv", type=Path, default=RESULTS_DIR / "comm_sync_overhead.csv")
    parser.add_argument("--md", type=Path, default=RESULTS_DIR / "comm_sync_overhead.md")
    parser.add_argument("--no-write", action="store_true", help="print only; write no CSV or markdown")
    args = parser.parse_args()
    if (args.steps is not None and args.steps < 1) or args.warmup < 0:
        parser.error("need --steps >= 1 and --warmup >= 0")
    return args


# ------------------------------------------------------------------------ local fixes under test


def async_allreduce_hook(state: GradientSync, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Like ``common.comm.compressed_allreduce_hook`` but returns the all-reduce's own future.

    The library hook runs ``reduce_flat`` (a blocking all-reduce) inside the hook and hands DDP a
    future that is already complete, so the backward waits for every bucket's communication. Here
    the wire tensors' all-reduces are launched with ``async_op=True`` and decompression runs in the
    future's callback. Valid for linear compressors without error feedback (the residual update
    would need the result before the next step only, so it could move into the callback too).
    """
    assert state.use_allreduce and state.error_feedback is None
    buffer = bucket.buffer()
    world = dist.get_world_size(state.group)
    payload = state.compressor.compress(buffer, state.rng(buffer.device))
    futures = []
    for wire in payload.wire.values():
        state.stats.add_call("all_reduce", wire.numel() * wire.element_size() * 8)
        work = dist.all_reduce(wire, group=state.group, async_op=True)
        assert work is not None
        futures.append(work.get_future())
    state.stats.dense_bits += buffer.numel() * 32
    if bucket.is_last():
        state.stats.steps += 1

    def decompress(_: torch.futures.Future[list[torch.futures.Future[list[Tensor]]]]) -> Tensor:
        # all_reduce summed the wire tensors in place, so the payload now holds the sum.
        total = state.compressor.decompress(payload).reshape(-1).to(buffer.dtype)
        return total.div_(world).view_as(buffer)

    return torch.futures.collect_all(futures).then(decompress)


class OverlappedGradientSync(GradientSync):
    """GradientSync whose bucket all-reduces start during ``backward()`` (as DDP's do).

    ``attach(module)`` groups parameters in reverse registration order (the order in which their
    gradients are usually ready, DDP's initial assumption) into a first bucket of
    ``first_bucket_numel`` entries and then buckets of ``bucket_numel``, and registers a
    post-accumulate-grad hook on each parameter. When a bucket's last gradient arrives, the bucket
    is flattened, compressed and its wire tensors all-reduced with ``async_op=True``; ``finish()``
    (call it after ``backward()``) waits, decompresses, averages and writes the gradients back.
    Every rank launches buckets in the same order because the autograd order is deterministic.
    Only for linear compressors without error feedback (a sketch of the proposed library change).
    """

    def __init__(self, compressor: Compressor, *, first_bucket_numel: int, bucket_numel: int) -> None:
        super().__init__(compressor, bucket_numel=bucket_numel)
        if not self.use_allreduce or self.error_feedback is not None:
            raise ValueError("OverlappedGradientSync supports linear compressors without error feedback")
        self.first_bucket_numel = first_bucket_numel
        self._param_buckets: list[list[nn.Parameter]] = []
        self._remaining: list[int] = []
        self._pending: list[tuple[int, Payload, list[dist.Work]]] = []

    def attach(self, module: nn.Module) -> None:
        params = [p for p in module.parameters() if p.requires_grad]
        current: list[nn.Parameter] = []
        numel = 0
        for p in reversed(params):
            current.append(p)
            numel += p.numel()
            cap = self.first_bucket_numel if not self._param_buckets else self.bucket_numel
            assert cap is not None
            if numel >= cap:
                self._param_buckets.append(current)
                current, numel = [], 0
        if current:
            self._param_buckets.append(current)
        self._remaining = [len(b) for b in self._param_buckets]
        for index, bucket in enumerate(self._param_buckets):
            for p in bucket:
                p.register_post_accumulate_grad_hook(functools.partial(self._grad_ready, index))

    def _grad_ready(self, index: int, param: Tensor) -> None:
        self._remaining[index] -= 1
        if self._remaining[index] == 0:
            grads = [p.grad for p in self._param_buckets[index]]
            assert all(g is not None for g in grads)
            flat = torch.cat([g.reshape(-1) for g in grads])  # type: ignore[union-attr]
            payload = self.compressor.compress(flat, self.rng(flat.device))
            works = []
            for wire in payload.wire.values():
                self.stats.add_call("all_reduce", wire.numel() * wire.element_size() * 8)
                work = dist.all_reduce(wire, group=self.group, async_op=True)
                assert work is not None
                works.append(work)
            self.stats.dense_bits += flat.numel() * 32
            self._pending.append((index, payload, works))

    def finish(self) -> None:
        if any(self._remaining):
            raise RuntimeError("some parameters received no gradient this step; their buckets never ran")
        world = dist.get_world_size(self.group)
        for index, payload, works in self._pending:
            for work in works:
                work.wait()
            mean = self.compressor.decompress(payload).reshape(-1).div_(world)
            params = self._param_buckets[index]
            for p, part in zip(params, mean.split([p.numel() for p in params]), strict=True):
                p.grad.copy_(part.view_as(p))  # type: ignore[union-attr]
        self._pending.clear()
        self._remaining = [len(b) for b in self._param_buckets]
        self.stats.steps += 1


def explicit_torch_allreduce(module: nn.Module, bucket_numel: int) -> None:
    """The bucketed explicit path with torch alone: cat, all_reduce, divide, copy back."""
    world = dist.get_world_size()
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    bucket: list[Tensor] = []
    numel = 0
    for i, g in enumerate(grads):
        bucket.append(g)
        numel += g.numel()
        if numel >= bucket_numel or i == len(grads) - 1:
            flat = torch.cat([t.reshape(-1) for t in bucket])
            dist.all_reduce(flat)
            flat.div_(world)
            for t, part in zip(bucket, flat.split([t.numel() for t in bucket]), strict=True):
                t.copy_(part.view_as(t))
            bucket, numel = [], 0


# ------------------------------------------------------------------------------ the harness


@dataclass
class Variant:
    """One way of training the same model; ``after_backward`` is the explicit gradient sync."""

    name: str
    model: nn.Module  # what is called (DDP wrapper or the plain module)
    optimizer: torch.optim.Optimizer
    after_backward: Callable[[], None] | None = None
    sync: GradientSync | None = None
    bucket_numel: int | None = None
    ddp_bucket_bytes: str = ""  # DDP's (rebuilt) bucket sizes, "/"-separated, read after the run
    total: list[float] = field(default_factory=list)
    fwd_bwd: list[float] = field(default_factory=list)
    sync_s: list[float] = field(default_factory=list)
    optim: list[float] = field(default_factory=list)

    def step(self, x: Tensor, y: Tensor, *, record: bool) -> None:
        dist.barrier()
        t0 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(self.model(x), y).backward()
        t1 = time.perf_counter()
        if self.after_backward is not None:
            self.after_backward()
        t2 = time.perf_counter()
        self.optimizer.step()
        t3 = time.perf_counter()
        if record:
            self.total.append(t3 - t0)
            self.fwd_bwd.append(t1 - t0)
            self.sync_s.append(t2 - t1)
            self.optim.append(t3 - t2)


def make_variant(name: str, base: nn.Module, args: argparse.Namespace) -> Variant:
    model = copy.deepcopy(base)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    bucket_numel = int(args.bucket_mb * 2**20) // 4
    default_buckets = args.bucket_mb == DDP_DEFAULT_BUCKET_MB
    identity = build_compressor("identity")
    if name in ("ddp", "ddp_hook", "ddp_hook_async"):
        ddp = DistributedDataParallel(
            model,
            forward_sync_buffers=args.forward_sync_buffers,
            bucket_cap_mb=None if default_buckets else args.bucket_mb,
        )
        sync = None
        if name == "ddp_hook":
            sync = install_ddp_hook(ddp, identity, error_feedback=False, compress_per_tensor=False)
        elif name == "ddp_hook_async":
            sync = GradientSync(identity)
            sync.name_parameters(model)
            ddp.register_comm_hook(sync, async_allreduce_hook)
        return Variant(name, ddp, optimizer, sync=sync, bucket_numel=bucket_numel)
    if name == "sync_per_tensor":
        sync = GradientSync(identity, bucket_numel=None)
        return Variant(name, model, optimizer, functools.partial(sync.sync_gradients, model), sync)
    if name == "sync_bucketed":
        sync = GradientSync(identity, bucket_numel=bucket_numel)
        after = functools.partial(sync.sync_gradients, model)
        return Variant(name, model, optimizer, after, sync, bucket_numel)
    if name in ("explicit_torch", "explicit_torch_per_tensor"):
        if name == "explicit_torch_per_tensor":
            bucket_numel = 1  # every tensor fills a bucket on its own
        after = functools.partial(explicit_torch_allreduce, model, bucket_numel)
        return Variant(name, model, optimizer, after, None, bucket_numel)
    if name == "sync_overlap":
        first_bucket_numel = DDP_FIRST_BUCKET_BYTES // 4 if default_buckets else bucket_numel
        overlapped = OverlappedGradientSync(
            identity, first_bucket_numel=first_bucket_numel, bucket_numel=bucket_numel
        )
        overlapped.attach(model)
        return Variant(name, model, optimizer, overlapped.finish, overlapped, bucket_numel)
    raise ValueError(f"unknown variant {name!r}; valid: {', '.join(MAIN_VARIANTS + DIAGNOSTIC_VARIANTS)}")


def plain_module(variant: Variant) -> nn.Module:
    return variant.model.module if isinstance(variant.model, DistributedDataParallel) else variant.model


def check_gradients_agree(variants: Sequence[Variant], x: Tensor, y: Tensor) -> None:
    """One backward + sync from the same parameters: every variant's averaged gradients match DDP's.

    Run before any optimizer step so that all copies still hold identical parameters.
    """
    reference: list[Tensor] | None = None
    for variant in variants:
        variant.optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(variant.model(x), y).backward()
        if variant.after_backward is not None:
            variant.after_backward()
        grads = [p.grad.clone() for p in plain_module(variant).parameters()]  # type: ignore[union-attr]
        variant.optimizer.zero_grad(set_to_none=True)
        if reference is None:
            reference = grads
            continue
        for g, r in zip(grads, reference, strict=True):
            if not torch.allclose(g, r, rtol=1e-4, atol=1e-6):
                raise AssertionError(f"{variant.name}: averaged gradients differ from {variants[0].name}")


def run_model(
    model_name: str, args: argparse.Namespace, rank: int, world: int, variant_names: Sequence[str]
) -> list[Variant]:
    in_channels, image_size = MODEL_SHAPES[model_name]
    torch.manual_seed(0)  # identical initial parameters on every rank and in every variant
    base = build_model(model_name, in_channels=in_channels, image_size=image_size)
    gen = torch.Generator().manual_seed(1000 + rank)  # a different batch on every rank
    x = torch.randn(args.batch_size, in_channels, image_size, image_size, generator=gen)
    y = torch.randint(0, 10, (args.batch_size,), generator=gen)
    variants = [make_variant(name, base, args) for name in variant_names]
    check_gradients_agree(variants, x, y)
    num_steps = args.steps if args.steps is not None else DEFAULT_STEPS[model_name]
    for cycle in range(-args.warmup, num_steps):
        shift = cycle % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            variant.step(x, y, record=cycle >= 0)
        if cycle >= 0 and (cycle + 1) % max(1, num_steps // 5) == 0:
            log0(f"  {model_name} cycle {cycle + 1}/{num_steps}, loadavg {load_average()}")
    for variant in variants:
        if isinstance(variant.model, DistributedDataParallel):
            # DDP starts with one bucket of everything and rebuilds its buckets (1 MiB first, then
            # bucket_cap_mb) in gradient-ready order after the first iteration, when W > 1.
            data = variant.model._get_ddp_logging_data()
            sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes", "")
            variant.ddp_bucket_bytes = str(sizes).replace(", ", "/")
        variant.total = max_over_ranks(variant.total)
        variant.fwd_bwd = max_over_ranks(variant.fwd_bwd)
        variant.sync_s = max_over_ranks(variant.sync_s)
        variant.optim = max_over_ranks(variant.optim)
    return variants


def summarise(
    model_name: str, variants: Sequence[Variant], run_fields: dict[str, object]
) -> list[dict[str, object]]:
    baseline = next(v for v in variants if v.name == BASELINE)
    base_median = quartiles(baseline.total)[1]
    module = plain_module(baseline)
    rows = []
    for v in variants:
        q1, median, q3 = quartiles(v.total)
        paired = [t / b for t, b in zip(v.total, baseline.total, strict=True)]
        ratio_q1, ratio_median, ratio_q3 = quartiles(paired)
        phases = dict.fromkeys(PHASES, float("nan"))
        if v.sync is not None and v.sync.stats.steps:
            phases = {p: v.sync.stats.seconds[p] / v.sync.stats.steps for p in PHASES}
        rows.append(
            {
                **run_fields,
                "model": model_name,
                "num_params": sum(p.numel() for p in module.parameters()),
                "num_tensors": len(list(module.parameters())),
                "variant": v.name,
                "bucket_numel": v.bucket_numel if v.bucket_numel is not None else "",
                "ddp_bucket_bytes": v.ddp_bucket_bytes,
                "steps": len(v.total),
                "median_s": f"{median:.5g}",
                "q1_s": f"{q1:.5g}",
                "q3_s": f"{q3:.5g}",
                "iqr_s": f"{q3 - q1:.4g}",
                "ratio_vs_ddp": f"{ratio_median:.4f}",
                "ratio_q1": f"{ratio_q1:.4f}",
                "ratio_q3": f"{ratio_q3:.4f}",
                "ratio_of_medians": f"{median / base_median:.4f}",
                "fwd_bwd_median_s": f"{quartiles(v.fwd_bwd)[1]:.5g}",
                "sync_median_s": f"{quartiles(v.sync_s)[1]:.5g}",
                "optim_median_s": f"{quartiles(v.optim)[1]:.5g}",
                # CommStats phases cover whole-run totals (warm-up and the check included) / its steps.
                **{f"{p}_s_per_step": f"{s:.4g}" for p, s in phases.items()},
            }
        )
    return rows


VARIANT_NOTES = {
    "ddp": "(a) DDP built-in all-reduce, overlapped with backward (when there is more than one bucket)",
    "sync_per_tensor": "(b) GradientSync explicit, one all-reduce per tensor, after backward",
    "sync_bucketed": "(b) GradientSync explicit, `--bucket-mb` buckets (25 MiB, DDP's cap, by default), after backward",
    "ddp_hook": "(c) DDP + install_ddp_hook(identity, error_feedback=False)",
    "explicit_torch_per_tensor": "diag: (b) per tensor in plain torch (no thinwire), after backward",
    "explicit_torch": "diag: (b) bucketed in plain torch (no thinwire), after backward",
    "ddp_hook_async": "diag: (c) with an async_op all-reduce hook (local)",
    "sync_overlap": "diag: (b) with all-reduces launched during backward (local)",
}


def _display_path(path: Path) -> str:
    """``path`` relative to the repository when it is inside it."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def write_markdown(csv_path: Path, md_path: Path) -> None:
    """A table of the latest run of every (model, world size) in the CSV, with the commands."""
    rows = read_rows(csv_path)
    latest: dict[tuple[str, str], str] = {}
    for row in rows:
        key = (row["model"], row["world_size"])
        latest[key] = max(latest.get(key, ""), row["date"])
    rows = [r for r in rows if latest[(r["model"], r["world_size"])] == r["date"]]
    rows.sort(key=lambda r: (r["model"], int(r["world_size"]), list(VARIANT_NOTES).index(r["variant"])))
    ms = 1e3
    lines = [
        "# GradientSync(identity) step-time overhead vs DDP (CPU, gloo)",
        "",
        f"Written by `benchmarks/comm/bench_sync_overhead.py` from `{_display_path(csv_path)}`",
        "(latest run of each model and world size). Step = zero_grad + forward + backward + sync + SGD step,",
        f"batch {'/'.join(sorted({r['batch_per_rank'] for r in rows}))} per rank, random data; time of a "
        "step = slowest rank; median and IQR over timed steps. The variants take",
        "turns step by step; ratio vs ddp = median over cycles of (this variant's step / ddp's step in the",
        "same cycle), with its IQR in brackets; 'of medians' = median step / ddp's median step.",
        "`fwd+bwd`, `sync` and `optim` are medians of the step's parts (DDP communicates inside fwd+bwd).",
        "",
        "| model | W | variant | median ms | IQR ms | ratio vs ddp | [IQR] | of medians | fwd+bwd ms | "
        "sync ms | optim ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['world_size']} | `{r['variant']}` | {float(r['median_s']) * ms:.1f} | "
            f"{float(r['iqr_s']) * ms:.1f} | **{float(r['ratio_vs_ddp']):.3f}** | "
            f"[{float(r['ratio_q1']):.2f}, {float(r['ratio_q3']):.2f}] | {float(r['ratio_of_medians']):.3f} | "
            f"{float(r['fwd_bwd_median_s']) * ms:.1f} | {float(r['sync_median_s']) * ms:.1f} | "
            f"{float(r['optim_median_s']) * ms:.1f} |"
        )
    runs = sorted(
        {
            (r["world_size"], r["date"], r["git_sha"], r["loadavg_start"], r["loadavg_end"], r["command"])
            for r in rows
        }
    )
    lines += ["", "Variants:", ""]
    lines += [f"- `{name}`: {note}" for name, note in VARIANT_NOTES.items()]
    lines += [
        "",
        "Notes:",
        "",
        "- DDP overlaps each bucket's all-reduce with the rest of the backward (gloo runs it on its own",
        "  thread); the explicit GradientSync path starts communicating only after `backward()` returns,",
        "  so its sync time adds to the step. For DDP variants the communication hides inside",
        "  `fwd+bwd ms`; `sync ms` is the explicit path's time after backward.",
        "- DDP's buckets in these runs (bytes, in reduction order; from `_get_ddp_logging_data()`): "
        + "; ".join(
            f"{r['model']} W={r['world_size']}: {r['ddp_bucket_bytes']}"
            for r in rows
            if r["variant"] == BASELINE
        )
        + ". A model that fits in one bucket leaves DDP nothing to overlap: its all-reduce starts when the",
        "  last gradient is ready, just like the explicit path's.",
        "- The library's DDP hook (`ddp_hook`) calls a blocking all-reduce inside the hook and returns a",
        "  completed future, so DDP cannot overlap it either.",
        "- DDP runs with `forward_sync_buffers=False` unless `--forward-sync-buffers` is given, so every",
        "  variant communicates gradients only (ResNet-20's BatchNorm buffers are not synchronised).",
        "- The machine is a shared 2-core VM: at W=4 the ranks are oversubscribed (4 processes, 2 cores)",
        "  and other jobs were running; compare ratios, not absolute times, with other machines.",
        "",
        "Runs (load average 1/5/15 min at start and end of the run):",
        "",
    ]
    for world, date, sha, load_start, load_end, command in runs:
        lines.append(f"- W={world}, {date}, git {sha}, load {load_start} -> {load_end}: `{command}`")
    md_path.write_text("\n".join(lines) + "\n")


def run(args: argparse.Namespace, rank: int, world: int) -> None:
    date, sha, backend = now_iso(), git_sha(), dist.get_backend()
    load_start = load_average()
    variant_names = MAIN_VARIANTS + (DIAGNOSTIC_VARIANTS if args.diagnostics else ())
    log0(f"[sync overhead] world_size={world} git={sha} loadavg(1,5,15)={load_start}")
    command = (
        f"PYTHONPATH=. torchrun --standalone --nproc_per_node {world} "
        f"{shlex.join([os.path.relpath(sys.argv[0]), *sys.argv[1:]])}"
    )
    all_rows: list[dict[str, object]] = []
    results = {}
    for model_name in args.models:
        results[model_name] = run_model(model_name, args, rank, world, variant_names)
    run_fields = {
        "date": date,
        "git_sha": sha,
        "backend": backend,
        "world_size": world,
        "batch_per_rank": args.batch_size,
        "loadavg_start": load_start,
        "loadavg_end": load_average(),
        "command": command,
    }
    for model_name, variants in results.items():
        rows = summarise(model_name, variants, run_fields)
        all_rows += rows
        for row in rows:
            log0(
                f"  {model_name:8s} W={world} {row['variant']:16s} median {float(row['median_s']) * 1e3:8.1f} ms"
                f"  IQR {float(row['iqr_s']) * 1e3:6.1f}  ratio {row['ratio_vs_ddp']}"
                f" [{row['ratio_q1']}, {row['ratio_q3']}] (of medians {row['ratio_of_medians']})"
                f"  sync {float(row['sync_median_s']) * 1e3:6.1f} ms"
            )
    log0(f"[sync overhead] done, loadavg(1,5,15)={run_fields['loadavg_end']}")
    if rank == 0 and not args.no_write:
        append_rows(args.csv, COLUMNS, all_rows)
        write_markdown(args.csv, args.md)
        log0(f"[sync overhead] appended {len(all_rows)} rows to {args.csv}; table {args.md}")


def main() -> None:
    args = parse_args()
    rank, world = init_gloo()
    try:
        run(args, rank, world)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
