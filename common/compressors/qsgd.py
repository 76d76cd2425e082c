"""QSGD: bucketed stochastic s-level quantization (Alistarh et al., NeurIPS 2017), two wire encodings.

Legend: N entries (x read flat), D ``bucket_size``, B = ceil(N / D) buckets, s = 2**(bits-1) - 1
levels, K nonzero levels, M packed bytes, T bits of an Elias stream.

Quantizer (the paper's Eq. for Q_s, practical variant: per bucket, l2 or max norm): for entry i of
bucket b with norm ``n_b``, ``xi_i = min(floor(s |v_i| / n_b + u_i), s)`` with ``u_i`` uniform in
[0, 1) drawn from ``rng.local`` (stochastic rounding), and ``Q(v)_i = n_b * sign(v_i) * xi_i / s``.
Unbiased: E[Q(v)] = v (Lemma 3.1); with the l2 norm ``E||Q(v_b) - v_b||^2 <= min(D/s^2, sqrt(D)/s)
||v_b||^2`` per bucket. Quantization and fixed-width packing are ``kernels.qsgd_quantize`` (Triton
on CUDA, the pure-torch reference elsewhere); the Elias coder (:mod:`common.compressors.elias`) runs
on the CPU.

Wire (both 1-D, ``"norms"`` first so that it stays 4-byte aligned in an all-gather buffer):

- ``encoding="fixed"``: ``"norms"`` fp32 [B] and ``"codes"`` uint8 [M], one ``bits``-bit code
  ``sign << (bits-1) | xi`` per entry packed ``8 // bits`` per byte (``kernels.pack_bits`` layout).
  Bits: ``8 * ceil(N * bits / 8) + 32 * B``, i.e. ``bits + 32 / D`` per entry. Same for every rank.
- ``encoding="elias"`` (the paper's Section 3.2 code): ``"norms"`` fp32 [B] (the 32-bit norm of each
  bucket) and ``"stream"`` uint8 [ceil(T / 8)]: for each nonzero entry, in index order, the Elias
  omega code of its gap ``i_k - i_{k-1}`` (``i_{-1} = -1``, so gaps are >= 1; gaps run across bucket
  borders, the bucket follows from the index), one sign bit (1 = negative), and the omega code of
  xi >= 1. T is exactly the sum of these code lengths; the stream is T bits rounded up to whole
  bytes, bits most significant first within a byte, the last byte padded with ones (no omega code
  ends in a one, so the padding never decodes as a code). Bits: ``8 * ceil(T / 8) + 32 * B``,
  variable per rank (the all-gather exchanges sizes first).

Not linear (each rank has its own norms: payloads are all-gathered and every rank sums the
decompressions, :meth:`QSGD.aggregate`). Both encodings carry the same codes, so with the same
generator state they decode to the same tensor bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import torch
from torch import Tensor

from kernels import pack_bits, qsgd_dequantize, qsgd_dequantize_accumulate, qsgd_quantize, unpack_bits
from kernels._buckets import NORMS, Norm
from kernels._dispatch import rand
from kernels.qsgd_quantize import ALLOWED_BITS, num_levels
from kernels.qsgd_quantize import reference as qsgd_reference

from .base import CompressorRNG, Payload, check_fused_rng
from .decoders import DenseDecoder
from .elias import (
    bits_at,
    check_padding,
    follow,
    omega_ends_everywhere,
    omega_values_at,
    omega_words,
    pack_words,
)
from .segments import SegmentDraws, Segments

Encoding = Literal["fixed", "elias"]
ENCODINGS: tuple[str, ...] = get_args(Encoding)
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ------------------------------------------------------------------------------------- compressor
class QSGD(DenseDecoder):
    """QSGD (Alistarh et al. 2017, Lemma 3.1 and Section 3.2): ``bits``-bit stochastic quantization.

    ``bits`` in {2, 4, 8}: one sign bit and ``bits - 1`` level bits, s = 2**(bits-1) - 1 levels
    (1, 7, 127). ``bucket_size``: entries per bucket, each with its own fp32 norm (default 512).
    ``norm``: ``"l2"`` (the paper's) or ``"max"`` (lower variance in practice, still unbiased).
    ``encoding``: ``"fixed"`` (``bits`` per entry + 32 per bucket) or ``"elias"`` (the paper's
    recursive Elias code of the nonzeros + 32 per bucket); see the module docstring for the layouts.
    ``fused_rng``: draw the rounding noise inside the quantizing kernel (a counter hash keyed from
    ``rng.local`` on CPU, Philox on CUDA; ``kernels._native``) instead of ``torch.rand``: the same
    distribution, another stream, several times faster on a CPU (default False: the ``torch.rand``
    stream the cross-checks with GRACE and the official code share).

    Unbiased, not linear (all-gather transport; every rank sums the decompressions), randomness
    only from the local generator. ``fixed_size`` is True for the fixed encoding only.

    Measured on a Gaussian tensor of 10**6 entries, D = 512 (CPU time, one thread of a 2-core VM):

    ==========  ==================  ==================  ==================
    bits        2                   4                   8
    ==========  ==================  ==================  ==================
    fixed       2.06 bits/entry     4.06                8.06
    elias, l2   0.46 (3% nonzero)   1.54                6.37
    elias, max  1.54                4.14                11.9
    ==========  ==================  ==================  ==================

    so Elias pays with the l2 norm (few, small levels), not with the max norm (larger levels, longer
    codes). Time per 10**6 entries, compress + decompress: fixed ~0.01 s; Elias with l2 0.04 / 0.12 /
    0.59 s (decoding is 3/4 of it), with max 0.12 / 0.33 / 1.06 s.
    """

    name = "qsgd"
    linear = False
    unbiased = True

    def __init__(
        self,
        bits: int = 4,
        bucket_size: int = 512,
        norm: Norm = "l2",
        encoding: Encoding = "fixed",
        fused_rng: bool = False,
    ) -> None:
        if isinstance(bits, bool) or bits not in ALLOWED_BITS:
            raise ValueError(
                f"bits must be one of {', '.join(map(str, ALLOWED_BITS))} (1 sign bit + level bits), got {bits!r}"
            )
        if isinstance(bucket_size, bool) or not isinstance(bucket_size, int) or bucket_size < 1:
            raise ValueError(f"bucket_size must be an integer >= 1 (entries per norm), got {bucket_size!r}")
        if norm not in NORMS:
            raise ValueError(f"unknown norm {norm!r}; valid norms: {', '.join(NORMS)}")
        if encoding not in ENCODINGS:
            raise ValueError(f"unknown encoding {encoding!r}; valid encodings: {', '.join(ENCODINGS)}")
        self.fused_rng = check_fused_rng(fused_rng)
        self.bits = bits
        self.bucket_size = bucket_size
        self.norm: Norm = norm
        self.encoding = encoding
        # Every rank's fixed-width payload has the same size; an Elias stream's depends on the draw.
        self.fixed_size = encoding == "fixed"  # type: ignore[misc]

    @property
    def num_levels(self) -> int:
        """s = 2**(bits-1) - 1."""
        return num_levels(self.bits)

    # ----------------------------------------------------------------------------------- encoder
    def compress(self, x: Tensor, rng: CompressorRNG) -> Payload:
        v_N = x.reshape(-1)
        if v_N.dtype not in _FLOAT_DTYPES:
            v_N = v_N.to(torch.float32)
        generator = rng.local
        noise_N = None
        if generator.device != v_N.device:  # e.g. a CPU generator with CUDA tensors: draw there, move
            noise_N = rand(v_N.numel(), generator).to(v_N.device)
        packed_M, norms_B = qsgd_quantize(
            v_N,
            bits=self.bits,
            bucket_size=self.bucket_size,
            norm=self.norm,
            noise=noise_N,
            generator=generator if noise_N is None else None,
            fused_rng=self.fused_rng and noise_N is None,
        )
        local = {"numel": v_N.numel()}
        if self.encoding == "fixed":
            wire = {"norms": norms_B, "codes": packed_M}
        else:
            codes_N = unpack_bits(packed_M, self.bits, v_N.numel()).cpu()
            wire = {"norms": norms_B, "stream": self.elias_encode(codes_N).to(v_N.device)}
        return Payload(wire=wire, shape=x.shape, dtype=x.dtype, local=local)

    def elias_encode(self, codes_N: Tensor) -> Tensor:
        """The Elias stream (uint8) of the unpacked ``sign << (bits-1) | level`` codes of one tensor."""
        s = self.num_levels
        levels_N = (codes_N & s).to(torch.int64)
        indices_K = torch.nonzero(levels_N).reshape(-1)
        gaps_K = torch.diff(indices_K, prepend=indices_K.new_full((1,), -1))
        negative_K = (codes_N[indices_K] >> (self.bits - 1)).to(torch.int64)
        gap_words, gap_lengths = omega_words(gaps_K)
        level_words, level_lengths = omega_words(levels_N[indices_K])
        words = (gap_words << (level_lengths + 1)) | (negative_K << level_lengths) | level_words
        stream_M, _ = pack_words(words, gap_lengths + 1 + level_lengths)
        return stream_M

    # ----------------------------------------------------------------------------------- decoder
    def elias_decode(self, stream: Tensor, numel: int) -> Tensor:
        """Inverse of :meth:`elias_encode`: the ``numel`` uint8 codes; ValueError on a corrupt stream."""
        stream_M = stream.reshape(-1).cpu()
        limit = 8 * stream_M.numel()
        ends = omega_ends_everywhere(stream_M, limit)
        # next triple: the gap code's end holds the sign bit, the level code follows it
        sign_at = ends[: limit + 1]
        level_at = torch.where(sign_at < limit, sign_at + 1, limit + 1)
        next_T = torch.cat([ends.index_select(0, level_at), ends[-1:]])
        starts_K = follow(next_T, limit + 1)
        check_padding(stream_M, int(next_T[starts_K[-1]]) if starts_K.numel() else 0)
        signs_at_K = sign_at[starts_K].to(torch.int64)
        indices_K = torch.cumsum(omega_values_at(stream_M, starts_K, limit), 0) - 1
        levels_K = omega_values_at(stream_M, signs_at_K + 1, limit)
        if starts_K.numel() and (int(indices_K[-1]) >= numel or int(levels_K.max()) > self.num_levels):
            raise ValueError(
                f"Elias stream decodes to index {int(indices_K[-1])} (numel {numel}) or level "
                f"{int(levels_K.max())} (s = {self.num_levels}): not a QSGD payload of this shape"
            )
        negative_K = bits_at(stream_M, signs_at_K)
        codes_N = torch.zeros(numel, dtype=torch.uint8)
        codes_N[indices_K] = (levels_K + (negative_K << (self.bits - 1))).to(torch.uint8)
        return codes_N

    def packed_codes(self, payload: Payload) -> Tensor:
        """The fixed-width packed codes of a payload (decoding the Elias stream if need be)."""
        if self.encoding == "fixed":
            return payload.wire["codes"]
        stream = payload.wire["stream"]
        return pack_bits(self.elias_decode(stream, payload.numel).to(stream.device), self.bits)

    def _decode(self, payload: Payload, out: Tensor | None = None) -> Tensor:
        """``Q(v)``, flat fp32 (``DenseDecoder`` gives ``decompress`` and the rest from it)."""
        return qsgd_dequantize(
            self.packed_codes(payload),
            payload.wire["norms"],
            payload.numel,
            bits=self.bits,
            bucket_size=self.bucket_size,
            out=out,
        )

    def _decode_all(self, payloads: Sequence[Payload], out: Tensor | None = None) -> Tensor:
        packed_W_M = torch.stack([self.packed_codes(p) for p in payloads])
        norms_W_B = torch.stack([p.wire["norms"].float() for p in payloads])
        return qsgd_dequantize_accumulate(
            packed_W_M, norms_W_B, payloads[0].numel, bits=self.bits, bucket_size=self.bucket_size, out=out
        )

    # -- the fused path: a whole bucket, QSGD's buckets within each tensor -----------------------

    def fuses(self) -> bool:
        return self.encoding == "fixed"

    def compress_segments(self, flat: Tensor, segments: Segments, draws: SegmentDraws) -> Payload:
        """Every tensor's QSGD at once: each tensor cut into buckets of ``bucket_size`` from its
        own first entry (as per tensor), one norm per bucket by a segmented reduction, the levels
        of the whole bucket in one pass with ``draws``' local noise, packed together. Wire:
        ``"norms"`` fp32 ``[Q]`` (Q: the tensors' buckets) and ``"codes"`` (``ceil(N bits / 8)``
        bytes). Given the same norms and noise, the codes are :meth:`compress`'s bit for bit (the
        norms' rounding may differ from the per-tensor reduction's in the last bit)."""
        plan = segments.cached(
            ("qsgd-plan", self.bucket_size), lambda: _qsgd_plan(segments, self.bucket_size)
        )
        v_N = flat if flat.dtype == torch.float32 else flat.float()
        if self.norm == "l2":
            norms_Q = torch.segment_reduce(v_N * v_N, "sum", lengths=plan.lengths_Q, unsafe=True).sqrt_()
        else:
            norms_Q = torch.segment_reduce(v_N.abs(), "max", lengths=plan.lengths_Q, unsafe=True)
        scales_N = qsgd_reference.level_scales(norms_Q, self.bits).index_select(0, plan.qid_N)
        codes_N = qsgd_reference.qsgd_codes(v_N, scales_N, 1, draws.uniform("local"), self.bits)
        wire = {"norms": norms_Q, "codes": pack_bits(codes_N, self.bits)}
        return Payload(
            wire=wire, shape=flat.shape, dtype=flat.dtype, local={"segments": segments, "numel": flat.numel()}
        )

    def decode_segments_into(self, payloads: Sequence[Payload], out: Tensor) -> Tensor:
        """The payloads decoded and summed in rank order (fp32), as :meth:`aggregate` per tensor."""
        segments: Segments = payloads[0].local["segments"]
        plan = segments.cached(
            ("qsgd-plan", self.bucket_size), lambda: _qsgd_plan(segments, self.bucket_size)
        )
        packed_W_M = torch.stack([p.wire["codes"] for p in payloads])
        norms_W_N = torch.stack([p.wire["norms"].float() for p in payloads]).index_select(1, plan.qid_N)
        if out.dtype == torch.float32 and out.is_contiguous():
            qsgd_dequantize_accumulate(
                packed_W_M, norms_W_N, segments.numel, bits=self.bits, bucket_size=1, out=out.view(-1)
            )
            return out
        decoded = qsgd_dequantize_accumulate(
            packed_W_M, norms_W_N, segments.numel, bits=self.bits, bucket_size=1
        )
        out.view(-1).copy_(decoded)
        return out


class _QSGDPlan:
    """A layout's QSGD buckets: entries per bucket ``[Q]`` and the bucket of each entry ``[N]``."""

    def __init__(self, lengths_Q: Tensor, qid_N: Tensor) -> None:
        self.lengths_Q, self.qid_N = lengths_Q, qid_N


def _qsgd_plan(segments: Segments, bucket_size: int) -> _QSGDPlan:
    lengths: list[int] = []
    for n in segments.sizes:
        full, rest = divmod(n, bucket_size)
        lengths += [bucket_size] * full + ([rest] if rest else [])
    lengths_Q = torch.tensor(lengths)
    qid_N = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), lengths_Q)
    return _QSGDPlan(lengths_Q.to(segments.device), qid_N.to(segments.device))
