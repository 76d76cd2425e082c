"""A bucket's tensors laid end to end, compressed in a fixed number of launches (the fused path).

A DDP bucket (or a GradientSync bucket) holds many tensors; the papers specify their methods per
tensor (one TernGrad scaler, one top-k, one random block per layer). Compressing each tensor on
its own costs a few kernel launches per tensor: on a GPU the step becomes host-bound (3,900
launches per ResNet-50 step with top-k per tensor, measured on an H200). Here the bucket is one
flat tensor cut into *segments*, one per tensor, and every per-tensor quantity (a scaler, a norm,
a threshold, a block's offset) is a tensor of S entries on the device, so a bucket is compressed in
a number of launches that does not grow with the number of tensors it holds, and no device value
is read on the host.

Legend: N entries of the bucket, S segments (tensors), ``_N`` / ``_S`` / ``_K`` suffixes: per
entry / per segment / per kept entry.

:class:`Segments` is the layout (names, sizes and offsets on the host, their device tables built
once per layout: DDP rebuilds its buckets once, after the first step). :class:`SegmentDraws` is a
step's randomness per segment, derived from the segment's name and how many times it was
compressed, never from the order of buckets (resume is exact whatever DDP's layout), on the host
without reading the device: two 32-bit keys per segment and stream, and from them the counter
hash of ``kernels._native`` (``u = (h(h(i ^ k1) ^ k2) >> 8) / 2^24`` at the entry's index ``i``
within its tensor), the same numbers on every device.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from kernels.segment_noise import segment_noise
from kernels.segment_noise.reference import hash32 as hash32_tensor

_MASK32 = 0xFFFFFFFF
_HASH_MULTIPLIERS = (0x21F0AAAD, 0x735A2D97)  # kernels._native's lowbias32, on Python ints


class Segments:
    """The layout of one bucket: ``names[s]`` has ``sizes[s]`` entries starting at ``starts[s]``.

    Device tables are built on first use and kept (``ids``: the segment of each entry,
    ``lengths`` / ``offsets``), as are the tables a
    compressor derives from the layout (:meth:`cached`): nothing per step is rebuilt.
    """

    def __init__(self, names: Sequence[str], sizes: Sequence[int], device: torch.device | str) -> None:
        if len(names) != len(sizes) or not names:
            raise ValueError(
                f"a bucket needs one size per name, got {len(names)} names and {len(sizes)} sizes"
            )
        if any(int(n) < 1 for n in sizes):
            raise ValueError(f"every tensor of a bucket needs at least one entry, got sizes {list(sizes)}")
        self.names = tuple(names)
        self.sizes = tuple(int(n) for n in sizes)
        starts = [0]
        for size in self.sizes[:-1]:
            starts.append(starts[-1] + size)
        self.starts = tuple(starts)
        self.numel = sum(self.sizes)
        self.device = torch.device(device)
        self._cache: dict[Any, Any] = {}

    def __len__(self) -> int:
        return len(self.names)

    def __repr__(self) -> str:
        return f"Segments({len(self)} tensors, {self.numel} entries, {self.device})"

    def cached(self, key: Any, build: Callable[[], Any]) -> Any:
        """``build()`` once per layout and key (a compressor's tables: kept counts, sample plans)."""
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def host_table(self, values: Sequence[int | float], dtype: torch.dtype = torch.int64) -> Tensor:
        """A per-segment (or any) host list as a device tensor (built once per layout by the callers,
        through :meth:`cached`)."""
        return torch.tensor(list(values), dtype=dtype).to(self.device)

    @property
    def lengths(self) -> Tensor:
        """int64 ``[S]``: entries per segment."""
        return self.cached("lengths", lambda: self.host_table(self.sizes))

    @property
    def offsets(self) -> Tensor:
        """int64 ``[S]``: each segment's first entry in the bucket."""
        return self.cached("offsets", lambda: self.host_table(self.starts))

    @property
    def ids(self) -> Tensor:
        """int32 ``[N]``: the segment of each entry (half an int64 table's memory and reads)."""
        return self.cached(
            "ids",
            lambda: torch.repeat_interleave(
                torch.arange(len(self), device=self.device, dtype=torch.int32),
                self.lengths,
                output_size=self.numel,
            ),
        )

    # -- segmented arithmetic: one launch each, whatever S is ------------------------------------

    def reduce(self, x_N: Tensor, op: str) -> Tensor:
        """``op`` ("sum", "max", "min", "mean") of each segment of flat ``x_N``: ``[S]``."""
        return torch.segment_reduce(x_N, op, lengths=self.lengths, unsafe=True)

    def expand(self, v_S: Tensor) -> Tensor:
        """``v_S[segment of each entry]``: ``[N]``."""
        return v_S.index_select(0, self.ids)

    def segment_cumsum(self, mask_N: Tensor) -> Tensor:
        """int64 ``[N]``: within each segment, how many of the entries up to and including this one
        are set (one cumulative sum over the bucket, less the count before the segment)."""
        total_N = torch.cumsum(mask_N, 0, dtype=torch.int64)
        before_S = total_N.index_select(0, self.offsets) - mask_N.index_select(0, self.offsets).to(
            torch.int64
        )
        return total_N - before_S.index_select(0, self.ids)


def key_seed(text: str) -> int:
    """A 64-bit integer from ``text``, the same in every process (Python's hash() is not)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def hash32(x: int) -> int:
    """``kernels._native``'s 32-bit hash (lowbias32) of a Python int in [0, 2^32)."""
    c1, c2 = _HASH_MULTIPLIERS
    x ^= x >> 16
    x = (x * c1) & _MASK32
    x ^= x >> 15
    x = (x * c2) & _MASK32
    return x ^ (x >> 15)


class SegmentDraws:
    """One compression's randomness for every segment of a bucket, on the device, never read back.

    Keys: per segment and stream (``"shared"``: the same on every rank; ``"local"``: per rank), a
    64-bit base from the tensor's name (blake2b, host, once per layout) mixed on the device with how
    many times the tensor was compressed (``counts``, host ints): ``k1 = h(lo ^ h(c)), k2 = h(hi ^
    h(c ^ 0x9E3779B9))``. Draws therefore depend only on (seed, rank for "local", name, count), as
    the per-tensor path's ``CompressorRNG.reseed`` does; the numbers differ from that path's
    (another generator), which is why the fused path of a stochastic compressor is a documented
    deviation of its stream, not of its arithmetic.
    """

    def __init__(self, segments: Segments, seed: int, rank: int, counts: Sequence[int]) -> None:
        self.segments = segments
        self.seed, self.rank = seed, rank
        self.counts = tuple(counts)
        self._keys: dict[str, tuple[Tensor, Tensor]] = {}

    def _base(self, stream: str) -> tuple[Tensor, Tensor]:
        seg = self.segments
        tag = "shared" if stream == "shared" else f"rank{self.rank}"

        def build() -> tuple[Tensor, Tensor]:
            bases = [key_seed(f"{self.seed}/{tag}/{name}") for name in seg.names]
            return seg.host_table([b & _MASK32 for b in bases]), seg.host_table([b >> 32 for b in bases])

        return seg.cached(("draw-base", self.seed, tag), build)

    def keys(self, stream: str) -> tuple[Tensor, Tensor]:
        """int64 ``[S]`` key pairs of ``stream`` ("shared" or "local") for this compression."""
        if stream not in ("shared", "local"):
            raise ValueError(f"unknown stream {stream!r}; valid: shared, local")
        if stream not in self._keys:
            lo_S, hi_S = self._base(stream)
            if len(set(self.counts)) == 1:  # every tensor compressed as often: one scalar for all
                c = self.counts[0]
                k1 = hash32_tensor(lo_S ^ hash32(c & _MASK32))
                k2 = hash32_tensor(hi_S ^ hash32((c ^ 0x9E3779B9) & _MASK32))
            else:
                counts_S = self.segments.host_table(self.counts)
                k1 = hash32_tensor(lo_S ^ hash32_tensor(counts_S & _MASK32))
                k2 = hash32_tensor(hi_S ^ hash32_tensor((counts_S ^ 0x9E3779B9) & _MASK32))
            self._keys[stream] = (k1, k2)
        return self._keys[stream]

    def uniform(self, stream: str = "local") -> Tensor:
        """fp32 ``[N]`` uniform [0, 1): the counter hash at each entry's index within its tensor,
        keyed by its segment's keys (24 bits, as ``torch.rand``; ``kernels.segment_noise``: one
        launch on CUDA, one compiled loop on a CPU)."""
        k1_S, k2_S = self.keys(stream)
        return segment_noise(self.segments.ids, self.segments.offsets, k1_S, k2_S, "uniform")

    def priorities(self, stream: str = "shared") -> Tensor:
        """fp32 ``[N]``, positive and finite, each entry's 30 hash bits as a normal float's (the
        bits order as the values do): the largest k of a segment are a uniform k-subset, ties
        2^6 times rarer than among :meth:`uniform`'s 24-bit numbers."""
        k1_S, k2_S = self.keys(stream)
        return segment_noise(self.segments.ids, self.segments.offsets, k1_S, k2_S, "priority")

    def integers_below(self, bounds_S: Tensor, stream: str = "shared") -> Tensor:
        """int64 ``[S]``: one integer per segment, uniform in ``[0, bounds_S)`` (Lemire's multiply-
        shift of the segment's first key: bias below ``bound / 2^32``)."""
        k1_S, _ = self.keys(stream)
        return (hash32_tensor(k1_S ^ 0x5BD1E995) * bounds_S) >> 32


def num_kept_table(segments: Segments, density: float) -> tuple[int, ...]:
    """``ceil(density * n)`` (at least one) per segment: ``num_kept`` of each tensor."""
    return tuple(max(1, min(n, math.ceil(density * n - 1e-9))) for n in segments.sizes)
