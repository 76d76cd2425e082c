"""A DDP training step with every compression method against DDP without a hook, with its host overhead.

On a GPU machine (NCCL, one process per GPU; the defaults are sized to finish in under 5 minutes
on one H200, both models, every variant; ``benchmarks/gpu/run_all.sh`` runs it so):

    PYTHONPATH=. torchrun --standalone --nproc_per_node 1 benchmarks/gpu/bench_ddp_step.py
    PYTHONPATH=. torchrun --standalone --nproc_per_node 1 benchmarks/gpu/bench_ddp_step.py \\
        --models gpt2_small --variants topk dgc --out /tmp/ddp_step      # a hand run, results elsewhere

and on a CPU, to check the script itself (gloo, tiny models, seconds):

    PYTHONPATH=. torchrun --standalone --nproc_per_node 2 benchmarks/gpu/bench_ddp_step.py \\
        --tiny --cycles 2 --warmup 1 --no-write

A step: ``zero_grad``, forward under bf16 autocast (on CUDA), cross-entropy in fp32, backward (DDP
runs the variant's comm hook on each bucket), the optimizer's step; on a fixed synthetic batch on
the device. Models: ResNet-50 (batch 64 per GPU, 3 x 224 x 224, channels_last, 1000 classes) and
GPT-2 small (untied, 12 layers x 768, 4 x 1,024 tokens, vocabulary 50,257). ``--tiny`` builds a
CIFAR ResNet-20 on 2 x 3 x 32 x 32 in place of ResNet-50 (whose 25M parameters, once per variant,
would not fit a small CPU machine's memory) and a 2-layer GPT-2 of width 32 on 2 x 8 tokens.

Every variant is its own ``DistributedDataParallel`` model from the same initial parameters, with
DDP's defaults (bucket size: ``--bucket-cap-mb``), and SGD (lr 1e-3, momentum 0.9):

- ``none``: no hook, DDP's built-in fp32 all-reduce, the baseline of every ratio;
- ``torch_fp16``, ``torch_bf16``: PyTorch's ``fp16_compress_hook`` / ``bf16_compress_hook``;
- ``torch_powersgd_r2`` (``_batched``): PyTorch's ``powerSGD_hook``, rank 2, error feedback, warm
  start, ``start_powerSGD_iter=2`` (the warm-up runs it past its two plain all-reduces); batched:
  ``batch_tensors_with_same_shape=True``;
- ``fp16`` ... ``powersgd``: thinwire's compressors through ``install_ddp_hook`` (options in
  ``THINWIRE`` below: top-k 1 % + EF, random-k 1 %, random block 1 % + EF, TernGrad and QSGD 4-bit
  with the noise drawn in the kernel, EF-signSGD, PowerSGD rank 2 + EF);
- ``dgc``: DGC at density 0.1 % through ``DGCDataParallel.install`` (its hook and its SGD).

A variant that raises while it is built or in any step is reported as failed with the first line
of its error, and the run goes on without it (all ranks agree on it before the next step). Torch's
PowerSGD variants are not run on gloo with several ranks, where its hook aborts the process. All
variants of a model are held at once (GPT-2 small: parameters, gradients, DDP buckets, momentum
and residuals of 15 models, some tens of GB), the models one after the other.

Timing: ``--warmup`` untimed steps of every variant, then ``--cycles`` cycles in which each
variant takes one step, in an order rotated every cycle, so that drift falls on all alike. A step
is timed on the host from ``torch.cuda.synchronize()`` before it to one after it (only here, around
the whole step: the library is never synchronised for the benchmark); a step's time is the slowest
rank's. Then each variant runs one more step under ``torch.profiler`` (CPU and CUDA activities;
CPU only without CUDA), rank 0's, whose events are counted.

Columns of ``benchmarks/results/gpu_ddp_step.md`` (one table per model; rank 0 rewrites it after
each model, and appends the same rows to ``gpu_ddp_step.csv``; ``--out DIR`` writes there instead,
``--no-write`` only prints):

- step ms: the median step time over the cycles;
- ratio to none [IQR]: the median over cycles of the step's time over ``none``'s in the same cycle,
  with the quartiles of those ratios;
- launches: kernel launches issued by the host in the profiled step (``cudaLaunchKernel*``,
  ``cuLaunchKernel*``, ``cudaLaunchCooperativeKernel``, ``cudaGraphLaunch`` runtime/driver events;
  the device's kernel events when no such name is recorded); the CSV has both as ``launches``
  and ``kernels``;
- device syncs, stream syncs, event syncs: ``cudaDeviceSynchronize``, ``cudaStreamSynchronize``,
  ``cudaEventSynchronize`` calls (host events from the benchmark's closing sync on, its own and the
  profiler's, are not counted);
- memcpy: ``cudaMemcpy*`` / ``cuMemcpy*`` calls (a device-to-host copy that the host waits for is
  one of these and a stream sync);
- item: host reads of a device scalar (``aten::_local_scalar_dense``: ``.item()``, ``int()``,
  ``float()``, ``bool()`` of a tensor; ``aten::item`` where the former is not recorded);
- nonzero: ``aten::nonzero`` calls (a data-dependent shape: a host wait on CUDA);
- self CPU ms, self CUDA ms: the profiled step's total self time of host events (ops, runtime
  calls, waits included) and of device events (kernels, copies), as ``torch.profiler``'s table
  totals them; host times carry the profiler's overhead: compare them across variants, not with
  step ms.

Counts are the whole step's, the model's own included: compare a variant with ``none`` (e.g.
GPT-2's ``transformers`` code reads one device scalar per forward on a CPU).

The CSV also has ``mbit_per_step``: what a thinwire variant's ``CommStats`` counts it handed to
collectives per step (0 at world size 1, where its collectives do nothing). Every variant prints
one JSON line to stdout (rank 0); progress goes to stderr. ``--list-events`` prints the profiled
events' names (the first variant's most frequent, then names new in each later one) to check the
name matching on a new torch. Runtime event names differ across torch and CUDA versions, hence
the tolerant patterns in ``EVENT_PATTERNS``.
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.metadata
import inspect
import json
import math
import os
import re
import shlex
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "comm"))
from _bench_util import REPO_ROOT, RESULTS_DIR, append_rows, git_sha, now_iso, quartiles

from common.comm import install_ddp_hook
from common.compressors import build_compressor
from common.strategies import DGCDataParallel
from trainer.models import build_model

TORCH_HOOKS = ("torch_fp16", "torch_bf16", "torch_powersgd_r2", "torch_powersgd_r2_batched")
# thinwire's methods through install_ddp_hook(model, name, **options)
THINWIRE: dict[str, dict[str, Any]] = {
    "fp16": {},
    "bf16": {},
    "topk": {"density": 0.01, "error_feedback": True},
    "randomk": {"density": 0.01},
    "random_block": {"density": 0.01, "error_feedback": True},
    "terngrad": {"fused_rng": True},
    "qsgd": {"bits": 4, "fused_rng": True},
    "signsgd": {"scaled": True, "error_feedback": True},  # EF-signSGD
    "powersgd": {"rank": 2, "error_feedback": True},
}
VARIANTS = ("none", *TORCH_HOOKS, *THINWIRE, "dgc")
LR, MOMENTUM = 1e-3, 0.9

# Profiler event names (host events), matched from the start: runtime and driver API names vary
# across torch/CUDA versions (cudaLaunchKernelExC, cuLaunchKernelEx, some with a _v<N> suffix).
EVENT_PATTERNS = {
    "launches": re.compile(r"^(cuda|cu)(LaunchKernel|LaunchCooperativeKernel|GraphLaunch)"),
    "device_syncs": re.compile(r"^(cuda|cu)(DeviceSynchronize|CtxSynchronize)"),
    "stream_syncs": re.compile(r"^(cuda|cu)StreamSynchronize"),
    "event_syncs": re.compile(r"^(cuda|cu)EventSynchronize"),
    "memcpy": re.compile(r"^(cuda|cu)Memcpy"),
    "local_scalar": re.compile(r"^aten::_local_scalar_dense$"),
    "item_op": re.compile(r"^aten::item$"),
    "nonzero": re.compile(r"^aten::nonzero$"),
}
PROFILE_FIELDS = (
    "launches",
    "kernels",
    "device_syncs",
    "stream_syncs",
    "event_syncs",
    "memcpy",
    "item",
    "nonzero",
    "self_cpu_ms",
    "self_cuda_ms",
)
COLUMNS = (
    "date",
    "git_sha",
    "device",
    "torch",
    "triton",
    "backend",
    "world_size",
    "model",
    "num_params",
    "batch",
    "bucket_cap_mb",
    "variant",
    "status",
    "error",
    "warmup",
    "cycles",
    "median_ms",
    "ratio_vs_none",
    "ratio_q1",
    "ratio_q3",
    *PROFILE_FIELDS,
    "mbit_per_step",
    "command",
)
CLOSE_MARK = "bench_ddp_step::close"  # record_function range around the profiled step's closing sync
START = time.perf_counter()


# ------------------------------------------------------------------------------------ setup


@dataclass
class Setup:
    rank: int
    world: int
    device: torch.device
    backend: str
    args: argparse.Namespace

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def log(setup: Setup, message: str) -> None:
    """Progress on stderr (rank 0), with the seconds since the start."""
    if setup.rank == 0:
        print(f"[{time.perf_counter() - START:7.1f} s] {message}", file=sys.stderr, flush=True)


def init_distributed(args: argparse.Namespace) -> Setup:
    if "RANK" not in os.environ:
        raise SystemExit("launch with torchrun --standalone --nproc_per_node <GPUs> (see the docstring)")
    cuda = torch.cuda.is_available()
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)  # a CPU check on a small machine: one intra-op thread per rank
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend)
    return Setup(dist.get_rank(), dist.get_world_size(), device, backend, args)


def model_specs(tiny: bool) -> dict[str, dict[str, Any]]:
    """Per model: what ``build_model`` builds and the batch (images or tokens) per rank."""
    if tiny:
        return {
            "resnet50": {"build": "resnet20", "options": {"num_classes": 10, "in_channels": 3},
                         "images": (2, 3, 32, 32), "classes": 10},
            "gpt2_small": {"build": "gpt2_small", "options": {"vocab_size": 100, "n_layer": 2, "n_head": 2,
                           "n_embd": 32, "n_positions": 8, "tied": False}, "tokens": (2, 8), "classes": 100},
        }  # fmt: skip
    return {
        "resnet50": {"build": "resnet50", "options": {"num_classes": 1000, "in_channels": 3, "image_size": 224},
                     "images": (64, 3, 224, 224), "classes": 1000},
        "gpt2_small": {"build": "gpt2_small", "options": {"vocab_size": 50257, "n_layer": 12, "n_head": 12,
                       "n_embd": 768, "n_positions": 1024, "tied": False}, "tokens": (4, 1024), "classes": 50257},
    }  # fmt: skip


def build_base(spec: dict[str, Any], setup: Setup) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The model every variant copies (seed 0) and this rank's synthetic batch, on the device."""
    torch.manual_seed(0)
    model = build_model(spec["build"], **spec["options"]).to(setup.device)
    g = torch.Generator(device=setup.device).manual_seed(1 + setup.rank)
    if "images" in spec:
        model = model.to(memory_format=torch.channels_last)
        x = torch.randn(spec["images"], generator=g, device=setup.device)
        x = x.contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, spec["classes"], spec["images"][:1], generator=g, device=setup.device)
    else:
        x = torch.randint(0, spec["classes"], spec["tokens"], generator=g, device=setup.device)
        y = torch.randint(0, spec["classes"], spec["tokens"], generator=g, device=setup.device)
    return model, (x, y)


# ------------------------------------------------------------------------------------ variants


@dataclass
class Variant:
    name: str
    model: DDP | None = None
    optimizer: torch.optim.Optimizer | None = None
    stats: Any = None  # thinwire's CommStats, where the variant has one
    times: list[float] = field(default_factory=list)
    profile: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    def fail(self, error: str) -> None:
        """Drop the model (and its memory); the variant is reported with ``error``."""
        self.error, self.model, self.optimizer, self.stats, self.times = error, None, None, None, []


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def wrap_ddp(base: nn.Module, setup: Setup) -> DDP:
    kwargs: dict[str, Any] = {}
    if setup.args.bucket_cap_mb is not None:
        kwargs["bucket_cap_mb"] = setup.args.bucket_cap_mb
    if setup.cuda:
        kwargs["device_ids"] = [setup.device.index]
    return DDP(copy.deepcopy(base), **kwargs)


def attach_torch_hook(name: str, model: DDP) -> None:
    """PyTorch's own comm hooks (``TORCH_HOOKS``)."""
    if name in ("torch_fp16", "torch_bf16"):
        hook = getattr(default_hooks, f"{name[len('torch_') :]}_compress_hook", None)
        if hook is None:
            raise RuntimeError(
                f"this torch ({torch.__version__}) has no {name[len('torch_') :]}_compress_hook"
            )
        model.register_comm_hook(None, hook)
        return
    options: dict[str, Any] = {
        "process_group": None,
        "matrix_approximation_rank": 2,
        "start_powerSGD_iter": 2,
        "use_error_feedback": True,
        "warm_start": True,
    }
    if name.endswith("_batched"):
        if "batch_tensors_with_same_shape" not in inspect.signature(powerSGD_hook.PowerSGDState).parameters:
            raise RuntimeError(f"this torch ({torch.__version__}) has no batch_tensors_with_same_shape")
        options["batch_tensors_with_same_shape"] = True
    model.register_comm_hook(powerSGD_hook.PowerSGDState(**options), powerSGD_hook.powerSGD_hook)


def build_variant(name: str, base: nn.Module, setup: Setup) -> Variant:
    """``name``'s DDP model (a copy of ``base``), its hook and its optimizer."""
    if name.startswith("torch_powersgd") and setup.backend == "gloo" and setup.world > 1:
        # Not run, not caught: it kills the process (gloo::EnforceNotMet "Received data size doesn't
        # match expected size", torch 2.14, 2 ranks, DDP's default buckets; the batched one hangs).
        raise RuntimeError("not run: torch's powerSGD_hook aborts gloo with several ranks (use NCCL)")
    model = wrap_ddp(base, setup)
    variant = Variant(name, model)
    if name in TORCH_HOOKS:
        attach_torch_hook(name, model)
    elif name in THINWIRE:
        variant.stats = install_ddp_hook(model, name, **THINWIRE[name]).stats
    elif name == "dgc":  # DGC's whole step: its hook (momentum correction, masking) and its SGD
        dgc = DGCDataParallel(build_compressor("dgc", density=0.001), momentum=MOMENTUM, weight_decay=5e-4)
        variant.optimizer = dgc.install(model, lr=LR)
        variant.stats = dgc.stats
    elif name != "none":
        raise ValueError(f"unknown variant {name!r}; valid: {', '.join(VARIANTS)}")
    if variant.optimizer is None:
        variant.optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    return variant


def all_ok(ok: bool, setup: Setup) -> bool:
    """Whether every rank is ``ok`` (outside the timed region: this waits for the device)."""
    if setup.world == 1:
        return ok
    flag = torch.tensor([int(ok)], device=setup.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def build_variants(names: list[str], base: nn.Module, setup: Setup) -> list[Variant]:
    variants = []
    for name in names:
        try:
            variant = build_variant(name, base, setup)
        except Exception as error:  # reported as the variant's result
            variant = Variant(name, error=first_line(error))
        if not all_ok(variant.error is None, setup) and variant.error is None:
            variant.fail("failed to build on another rank")
        variants.append(variant)
    return variants


# ------------------------------------------------------------------------------------ steps


def train_step(variant: Variant, batch: tuple[torch.Tensor, torch.Tensor], setup: Setup) -> None:
    """One step (the docstring's): never reads a device value on the host."""
    assert variant.model is not None and variant.optimizer is not None
    x, y = batch
    variant.optimizer.zero_grad(set_to_none=True)
    with torch.autocast(setup.device.type, dtype=torch.bfloat16, enabled=setup.cuda):
        out = variant.model(x)
    loss = nn.functional.cross_entropy(out.float().reshape(-1, out.shape[-1]), y.reshape(-1))
    loss.backward()
    variant.optimizer.step()


def timed_step(variant: Variant, batch: tuple[torch.Tensor, torch.Tensor], setup: Setup) -> float:
    if setup.world > 1 and setup.cuda:
        dist.barrier(device_ids=[setup.device.index])
    elif setup.world > 1:
        dist.barrier()
    if setup.cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    train_step(variant, batch, setup)
    if setup.cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def guarded_step(
    variant: Variant, batch: tuple[torch.Tensor, torch.Tensor], setup: Setup, where: str
) -> float | None:
    """A timed step, or None when it raised here or on another rank (the variant is then failed,
    its error prefixed with ``where``, e.g. "warm-up step 1").

    A rank that raises inside DDP's backward while the others wait in its all-reduce cannot be
    rescued; a failure that every rank meets alike (the usual kind) is.
    """
    seconds, error = None, None
    try:
        seconds = timed_step(variant, batch, setup)
    except Exception as exc:  # reported as the variant's result
        error = first_line(exc)
    if not all_ok(error is None, setup):
        variant.fail(f"{where}: {error or 'failed on another rank'}")
        log(setup, f"  {variant.name}: failed: {variant.error}")
        gc.collect()
        if setup.cuda:
            torch.cuda.empty_cache()
        return None
    return seconds


def run_cycles(variants: list[Variant], batch: tuple[torch.Tensor, torch.Tensor], setup: Setup) -> None:
    """Warm-up steps, then the timed cycles in a rotated order (module docstring)."""
    args = setup.args
    for step in range(args.warmup):
        for v in variants:
            if v.error is None:
                guarded_step(v, batch, setup, f"warm-up step {step + 1}")
        log(setup, f"  warm-up step {step + 1}/{args.warmup}")
    for cycle in range(args.cycles):
        shift = cycle % len(variants)
        for v in variants[shift:] + variants[:shift]:
            if v.error is None:
                seconds = guarded_step(v, batch, setup, f"cycle {cycle + 1}")
                if seconds is not None:
                    v.times.append(seconds)
        if (cycle + 1) % max(1, args.cycles // 5) == 0 or cycle + 1 == args.cycles:
            log(setup, f"  cycle {cycle + 1}/{args.cycles}")
    alive = [v for v in variants if v.error is None]
    if alive:  # a step is done when its slowest rank is
        times = torch.tensor([v.times for v in alive], dtype=torch.float64, device=setup.device)
        if setup.world > 1:
            dist.all_reduce(times, op=dist.ReduceOp.MAX)
        for v, row in zip(alive, times.tolist(), strict=True):
            v.times = row


# ------------------------------------------------------------------------------------ profile


def profile_step(
    variant: Variant, batch: tuple[torch.Tensor, torch.Tensor], setup: Setup, seen: set[str]
) -> None:
    """One more step under torch.profiler; its event counts into ``variant.profile``."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if setup.cuda else [])
    try:
        if setup.cuda:
            torch.cuda.synchronize()
        with profile(activities=activities) as prof:
            train_step(variant, batch, setup)
            with record_function(CLOSE_MARK):  # the step's kernels end inside the profile
                if setup.cuda:
                    torch.cuda.synchronize()
        host, device = step_events(list(prof.events()))
    except Exception as exc:  # the timing stands; the counts are reported missing
        log(setup, f"  {variant.name}: profiling failed: {first_line(exc)}")
        return
    variant.profile = count_events(host, device)
    if setup.args.list_events and setup.rank == 0:
        print_event_names(variant.name, host + device, seen)


def step_events(events: list[Any]) -> tuple[list[Any], list[Any]]:
    """The step's host events and device events (kernels, copies) from ``prof.events()``.

    Host events from ``CLOSE_MARK`` on are the benchmark's: its closing ``cuda.synchronize()`` and
    the one the profiler issues when it stops; they are left out. So are device-side user
    annotations (a ``record_function`` range drawn over its kernels, not a kernel).
    """
    from torch.autograd import DeviceType

    close = min((e.time_range.start for e in events if e.name == CLOSE_MARK), default=math.inf)
    host = [e for e in events if e.device_type == DeviceType.CPU and e.time_range.start < close]
    device = [
        e for e in events if e.device_type != DeviceType.CPU and not getattr(e, "is_user_annotation", False)
    ]
    return host, device


def count_events(host: list[Any], device: list[Any]) -> dict[str, float]:
    """The docstring's profile columns from one step's events."""
    counts: Counter[str] = Counter()
    for event in host:
        for key, pattern in EVENT_PATTERNS.items():
            if pattern.match(event.name):
                counts[key] += 1
    kernels = [e for e in device if not re.match(r"^(Memcpy|Memset)", e.name)]
    self_cuda_us = sum(device_time_us(e) for e in device)
    return {
        "launches": counts["launches"] or len(kernels),
        "kernels": len(kernels),
        "device_syncs": counts["device_syncs"],
        "stream_syncs": counts["stream_syncs"],
        "event_syncs": counts["event_syncs"],
        "memcpy": counts["memcpy"],
        "item": counts["local_scalar"] or counts["item_op"],
        "nonzero": counts["nonzero"],
        "self_cpu_ms": sum(e.self_cpu_time_total for e in host) / 1e3,
        "self_cuda_ms": self_cuda_us / 1e3,
    }


def device_time_us(event: Any) -> float:
    """A device event's self time (``self_cuda_time_total`` before torch renamed it)."""
    value = getattr(event, "self_device_time_total", None)
    return getattr(event, "self_cuda_time_total", 0.0) if value is None else value


def print_event_names(name: str, events: list[Any], seen: set[str], top: int = 40) -> None:
    """``--list-events``: the first variant's most frequent event names, then each later one's new names."""
    counts = Counter((e.name, str(e.device_type).split(".")[-1]) for e in events)
    ranked = counts.most_common()
    shown = [item for item in ranked if item[0][0] not in seen] if seen else ranked[:top]
    print(f"--- profiled events, {name} ({'new names' if seen else f'top {top}'}): count, device, name",
          file=sys.stderr)  # fmt: skip
    for (event_name, device), count in shown:
        print(f"{count:8d}  {device:5}  {event_name}", file=sys.stderr)
    seen.update(event_name for event_name, _ in counts)
    sys.stderr.flush()


# ------------------------------------------------------------------------------------ results


def versions(setup: Setup) -> dict[str, str]:
    triton = "none"
    for dist_name in ("triton", "pytorch-triton"):
        try:
            triton = importlib.metadata.version(dist_name)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    device = torch.cuda.get_device_name(setup.device) if setup.cuda else "cpu"
    return {"device": device, "torch": torch.__version__, "triton": triton, "git_sha": git_sha()}


def command_line(setup: Setup) -> str:
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(REPO_ROOT) if script.is_relative_to(REPO_ROOT) else script
    return f"torchrun --standalone --nproc_per_node {setup.world} {shlex.join([str(shown), *sys.argv[1:]])}"


def rows_for(
    model: str, num_params: int, variants: list[Variant], setup: Setup, run: dict[str, Any]
) -> list[dict[str, Any]]:
    base = next((v.times for v in variants if v.name == "none" and v.error is None), None)
    rows = []
    for v in variants:
        row = {**run, "model": model, "num_params": num_params, "variant": v.name}
        row.update(dict.fromkeys(("median_ms", "ratio_vs_none", "ratio_q1", "ratio_q3", "mbit_per_step"), ""))
        row.update({key: v.profile.get(key, "") for key in PROFILE_FIELDS})
        row.update(status="failed" if v.error else "ok", error=v.error or "")
        if v.error is None and v.times:
            row["median_ms"] = statistics.median(v.times) * 1e3
            if base is not None:
                ratios = [a / b for a, b in zip(v.times, base, strict=True)]
                row["ratio_q1"], row["ratio_vs_none"], row["ratio_q3"] = quartiles(ratios)
            if v.stats is not None:
                row["mbit_per_step"] = v.stats.bits_sent / max(v.stats.steps, 1) / 1e6
        rows.append(row)
    return rows


def _fmt(value: Any, spec: str) -> str:
    return "" if value == "" else format(value, spec)


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    first = rows[0]
    lines = [
        "# A DDP step with every compression method, against no hook (synthetic batches)",
        "",
        f"`{first['command']}` on {first['world_size']} x {first['device']} ({first['backend']}), "
        f"torch {first['torch']}, Triton {first['triton']}, git {first['git_sha']}, {first['date']}; "
        f"{first['warmup']} warm-up steps, {first['cycles']} cycles, DDP bucket "
        f"{first['bucket_cap_mb'] or 'default'} MB. `benchmarks/gpu/bench_ddp_step.py`'s docstring says "
        "what a step is and what each column means (counts: one profiled step of rank 0).",
    ]
    for model in dict.fromkeys(r["model"] for r in rows):
        run = [r for r in rows if r["model"] == model]
        lines += [
            "",
            f"## {model} ({run[0]['num_params']:,} parameters, batch {run[0]['batch']} per rank)",
            "",
            "| variant | step ms | ratio to none [IQR] | launches | device syncs | stream syncs | event syncs "
            "| memcpy | item | nonzero | self CPU ms | self CUDA ms |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in run:
            if r["status"] != "ok":
                lines.append(f"| {r['variant']} | failed: {r['error'].replace('|', '/')} |" + " |" * 10)
                continue
            ratio = "" if r["ratio_vs_none"] == "" else (
                f"{r['ratio_vs_none']:.3f} [{r['ratio_q1']:.3f}, {r['ratio_q3']:.3f}]"
            )  # fmt: skip
            counts = " | ".join(_fmt(r[k], "d") for k in PROFILE_FIELDS[:1] + PROFILE_FIELDS[2:8])
            lines.append(
                f"| {r['variant']} | {_fmt(r['median_ms'], '.2f')} | {ratio} | {counts} | "
                f"{_fmt(r['self_cpu_ms'], '.1f')} | {_fmt(r['self_cuda_ms'], '.1f')} |"
            )
    return lines


def report(rows: list[dict[str, Any]], all_rows: list[dict[str, Any]], setup: Setup) -> None:
    """JSON lines and the table (stdout / stderr); the files unless ``--no-write``."""
    for row in rows:
        print(json.dumps({k: row[k] for k in COLUMNS if k not in ("command", "git_sha", "date")}), flush=True)
    print("\n".join(markdown(rows)), file=sys.stderr, flush=True)
    if setup.args.no_write:
        return
    out = Path(setup.args.out) if setup.args.out else RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    append_rows(out / "gpu_ddp_step.csv", COLUMNS, rows)
    (out / "gpu_ddp_step.md").write_text("\n".join(markdown(all_rows)) + "\n")
    log(setup, f"wrote {out / 'gpu_ddp_step.md'} and appended to {out / 'gpu_ddp_step.csv'}")


# ------------------------------------------------------------------------------------ main


def bench_model(model: str, names: list[str], setup: Setup, run: dict[str, Any]) -> list[dict[str, Any]]:
    spec = model_specs(setup.args.tiny)[model]
    base, batch = build_base(spec, setup)
    num_params = sum(p.numel() for p in base.parameters())
    run = {**run, "batch": "x".join(map(str, spec.get("images", spec.get("tokens"))))}
    log(setup, f"{model} ({spec['build']}, {num_params:,} parameters): building {len(names)} variants")
    variants = build_variants(names, base, setup)
    del base
    for v in variants:
        if v.error is not None:
            log(setup, f"  {v.name}: failed: {v.error}")
    log(setup, f"{model}: {setup.args.warmup} warm-up steps, {setup.args.cycles} cycles")
    run_cycles(variants, batch, setup)
    log(setup, f"{model}: profiling one step per variant")
    seen: set[str] = set()
    for v in variants:
        if v.error is None:
            profile_step(v, batch, setup, seen)
    rows = rows_for(model, num_params, variants, setup, run)
    del variants
    gc.collect()
    if setup.cuda:
        torch.cuda.empty_cache()
    return rows


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models", nargs="+", default=["resnet50", "gpt2_small"], choices=["resnet50", "gpt2_small"]
    )
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS, metavar="VARIANT",
                        help=f"{', '.join(VARIANTS)} (default: all; none always runs)")  # fmt: skip
    parser.add_argument(
        "--warmup", type=int, default=3, help="untimed steps per variant (torch PowerSGD: 2 plain)"
    )
    parser.add_argument("--cycles", type=int, default=10, help="timed steps per variant")
    parser.add_argument(
        "--bucket-cap-mb", type=float, default=None, help="DDP's bucket size (default: DDP's)"
    )
    parser.add_argument(
        "--tiny", action="store_true", help="tiny models and batches, to check the script on CPU"
    )
    parser.add_argument(
        "--list-events", action="store_true", help="print the profiled events' names (stderr)"
    )
    parser.add_argument(
        "--out", default=None, help="write the .md and .csv here (default: benchmarks/results)"
    )
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    if args.cycles < 1 or args.warmup < 0:
        parser.error("--cycles must be >= 1 and --warmup >= 0")
    return args


def main() -> None:
    args = parse_args()
    setup = init_distributed(args)
    names = ["none", *(v for v in VARIANTS if v in args.variants and v != "none")]
    run = {"date": now_iso(), **versions(setup), "backend": setup.backend, "world_size": setup.world,
           "bucket_cap_mb": args.bucket_cap_mb or "", "warmup": args.warmup, "cycles": args.cycles,
           "command": command_line(setup)}  # fmt: skip
    log(
        setup,
        f"{run['device']}, torch {run['torch']}, Triton {run['triton']}, {setup.world} rank(s), {setup.backend}",
    )
    all_rows: list[dict[str, Any]] = []
    for model in args.models:
        try:
            rows = bench_model(model, names, setup, run)
        except Exception as exc:  # e.g. transformers missing for GPT-2: the next model
            log(setup, f"{model}: failed: {first_line(exc)}")
            gc.collect()
            if setup.cuda:
                torch.cuda.empty_cache()
            continue
        all_rows += rows
        if setup.rank == 0:
            report(rows, all_rows, setup)
    log(setup, "done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
