"""QSGD: bucketed stochastic s-level quantization (Alistarh et al., NeurIPS 2017), two wire encodings.

Legend: N entries (x read flat), D ``bucket_size``, B = ceil(N / D) buckets, s = 2**(bits-1) - 1
levels, K nonzero levels, M packed bytes, T bits of an Elias stream.

Quantizer (the paper's Eq. for Q_s, practical variant: per bucket, l2 or max norm): for entry i of
bucket b with norm ``n_b``, ``xi_i = min(floor(s |v_i| / n_b + u_i), s)`` with ``u_i`` uniform in
[0, 1) drawn from ``rng.local`` (stochastic rounding), and ``Q(v)_i = n_b * sign(v_i) * xi_i / s``.
Unbiased: E[Q(v)] = v (Lemma 3.1); with the l2 norm ``E||Q(v_b) - v_b||^2 <= min(D/s^2, sqrt(D)/s)
||v_b||^2`` per bucket. Quantization and fixed-width packing are ``kernels.qsgd_quantize`` (Triton
on CUDA, the pure-torch reference elsewhere); the Elias coder runs on the CPU.

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

import functools
from collections.abc import Sequence

import torch
from torch import Tensor

from kernels import pack_bits, qsgd_dequantize, qsgd_dequantize_accumulate, qsgd_quantize, unpack_bits
from kernels._buckets import NORMS, Norm
from kernels._dispatch import rand
from kernels.qsgd_quantize import ALLOWED_BITS, num_levels
from kernels.qsgd_quantize import reference as qsgd_reference

from .base import CompressorRNG, Payload, check_fused_rng
from .decoders import DenseDecoder
from .segments import SegmentDraws, Segments

ENCODINGS = ("fixed", "elias")
#: Elias omega values handled here are < 2**31 (gaps are at most N <= 2**31 - 2**16, levels <= 127):
#: an omega code is then at most 42 bits and a (gap, sign, level) triple at most 56, one int64 word.
OMEGA_LIMIT = 2**31
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ------------------------------------------------------------------------------ Elias omega coding
# Vectorized both ways. Encoding: code words from a table of the codes of 1 .. 2**16 - 1, then one
# scatter of bytes. Decoding is speculative: an omega code is decoded at every bit position at once
# (a table of the code at the head of each 16-bit pattern, the rare longer codes group by group), and
# the real code boundaries are the chain 0 -> next(0) -> ... followed with pointer doubling
# (``_follow``). Timings are in QSGD's docstring.
TABLE_BITS = 16


def _omega_words_general(n: Tensor) -> tuple[Tensor, Tensor]:
    """Right to left: a terminating 0, then while n > 1, prepend n in binary, n <- bit_length(n) - 1."""
    words = torch.zeros_like(n)
    lengths = torch.ones_like(n)
    active = n > 1
    while bool(active.any()):
        # frexp's exponent is the bit length, exact for integers below 2**53
        bit_length = torch.frexp(n.to(torch.float64)).exponent.to(torch.int64)
        words = torch.where(active, words | (n << lengths), words)
        lengths = torch.where(active, lengths + bit_length, lengths)
        n = torch.where(active, bit_length - 1, n)
        active = n > 1
    return words, lengths


@functools.cache
def _code_table() -> tuple[Tensor, Tensor]:
    """Omega words and lengths of 0 .. 2**16 - 1 (entry 0 is unused)."""
    return _omega_words_general(torch.arange(2**TABLE_BITS, dtype=torch.int64))


def omega_words(values: Tensor) -> tuple[Tensor, Tensor]:
    """Elias omega codes of int64 ``values`` (each in [1, 2**31)) as ``(code words, lengths)``.

    The code's bits are the low ``length`` bits of the word, most significant first:
    1 -> "0", 2 -> "100", 3 -> "110", 4 -> "101000", 16 -> "10100100000".
    """
    values = values.to(torch.int64)
    table_words, table_lengths = _code_table()
    small = values.clamp(max=2**TABLE_BITS - 1)
    words, lengths = table_words[small], table_lengths[small]
    large = torch.nonzero(values >= 2**TABLE_BITS).reshape(-1)
    if large.numel():
        words[large], lengths[large] = _omega_words_general(values[large])
    return words, lengths


def pack_words(words: Tensor, lengths: Tensor) -> tuple[Tensor, int]:
    """Concatenate variable-length codes (each <= 56 bits) into ``(uint8 stream, number of bits)``.

    Bits most significant first within a byte; the last byte is padded with ones.
    """
    ends = torch.cumsum(lengths, 0)
    num_bits = int(ends[-1]) if ends.numel() else 0
    num_bytes = -(-num_bits // 8)
    starts = ends - lengths
    # Each code lands in the 8 bytes from its first one: its top bit at bit 63 - offset of a big-endian
    # word (offset + length <= 63, so the sign bit stays clear). The codes' bits are disjoint, so
    # adding the bytes is OR-ing them.
    aligned = words << (64 - (starts & 7) - lengths)
    first_byte = starts >> 3
    out = torch.zeros(num_bytes + 8, dtype=torch.int64)
    for j in range(8):
        out.index_add_(0, first_byte + j, (aligned >> (56 - 8 * j)) & 0xFF)
    if num_bits % 8:
        out[num_bytes - 1] |= (1 << (8 * num_bytes - num_bits)) - 1
    return out[:num_bytes].to(torch.uint8), num_bits


def elias_omega_encode(values: Tensor | Sequence[int]) -> tuple[Tensor, int]:
    """The concatenated Elias omega codes of ``values`` (integers in [1, 2**31)): ``(stream, nbits)``.

    ``stream`` is a 1-D uint8 tensor of ``ceil(nbits / 8)`` bytes, MSB first, padded with ones;
    ``nbits`` is the exact code length.
    """
    values_K = torch.as_tensor(values, dtype=torch.int64).reshape(-1).cpu()
    bad = values_K[(values_K < 1) | (values_K >= OMEGA_LIMIT)]
    if bad.numel():
        raise ValueError(f"Elias omega codes integers in [1, 2**31), got {int(bad[0])}")
    return pack_words(*omega_words(values_K))


def _bits_at(stream_M: Tensor, pos: Tensor) -> Tensor:
    """The bit at each position (MSB first within a byte)."""
    return (stream_M[pos >> 3].to(torch.int64) >> (7 - (pos & 7))) & 1


def _omega_decode_at(stream_M: Tensor, start: Tensor, limit: Tensor) -> tuple[Tensor, Tensor]:
    """``(ends, values)`` (int64) of the omega codes starting at bit positions ``start``, group by
    group; ``end = -1`` where the code does not complete before bit ``limit`` (per start) or is
    not one of ours (a group longer than 32 bits)."""
    start = start.to(torch.int64)
    padded = torch.cat([stream_M.to(torch.int64), torch.zeros(5, dtype=torch.int64)])
    windows = padded[:-5] << 32  # windows[m]: bytes m .. m + 4, enough for 32 bits at any offset
    for j in range(1, 5):
        windows |= padded[j : j - 5] << (32 - 8 * j)

    def read(pos: Tensor, count: Tensor | int) -> Tensor:
        return (windows[pos >> 3] >> (40 - (pos & 7) - count)) & ((torch.ones_like(pos) << count) - 1)

    ends, values = torch.full_like(start, -1), torch.zeros_like(start)
    index = torch.arange(start.numel())
    pos, n = start.clone(), torch.ones_like(start)
    # A value < 2**31 has at most 4 groups, then the terminating bit: 5 rounds; one more is harmless.
    for _ in range(6):
        inside = pos < limit[index]  # a group that ran past the data: no complete code here
        index, pos, n = index[inside], pos[inside], n[inside]
        if index.numel() == 0:
            break
        stop = read(pos, 1) == 0
        ends[index[stop]], values[index[stop]] = pos[stop] + 1, n[stop]
        go = ~stop & (n < 32)  # the next group has n + 1 <= 32 bits; longer ones are not ours
        index, pos, n = index[go], pos[go], n[go]
        n, pos = read(pos, n + 1), pos + n + 1
    return ends, values


@functools.cache
def _prefix_table() -> Tensor:
    """int32 ``value << 5 | length`` of the omega code at the head of each 16-bit pattern; 0 where
    the code is longer than 16 bits (values >= 512)."""
    patterns = torch.arange(2**TABLE_BITS, dtype=torch.int64)
    stream = torch.stack([patterns >> 8, patterns & 0xFF], 1).reshape(-1).to(torch.uint8)
    start = TABLE_BITS * patterns
    ends, values = _omega_decode_at(stream, start, start + TABLE_BITS)
    return torch.where(ends >= 0, (values << 5) | (ends - start), 0).to(torch.int32)


def _table_entries(stream_M: Tensor, pos: Tensor | None, limit: int) -> Tensor:
    """The prefix-table entry of the 16 bits from each position ``pos`` (default: 0 .. limit - 1)."""
    padded = torch.cat([stream_M.to(torch.int32), torch.zeros(3, dtype=torch.int32)])
    windows = (padded[:-3] << 16) | (padded[1:-2] << 8) | padded[2:-1]  # bytes m .. m + 2
    if pos is None:
        shifts = torch.arange(8, 0, -1, dtype=torch.int32)
        heads = ((windows[:, None] >> shifts) & 0xFFFF).reshape(-1)[:limit]
    else:
        heads = (windows[pos >> 3] >> (8 - (pos & 7)).to(torch.int32)) & 0xFFFF
    return _prefix_table().index_select(0, heads)


def _omega_ends_everywhere(stream_M: Tensor, limit: int) -> Tensor:
    """Where an omega code starting at each bit position of the first ``limit`` bits would end.

    ``limit + 2`` entries: ``ends[t]`` is the position after the code starting at t, or the sink
    ``limit + 1`` where no complete code starts there within ``limit`` bits (also at t = limit and
    t = limit + 1, so that ``ends`` can be indexed with its own values). int32 while that fits.
    """
    dtype = torch.int32 if limit + 2 < 2**31 else torch.int64
    lengths = (_table_entries(stream_M, None, limit) & 31).to(dtype)
    ends = torch.arange(limit, dtype=dtype) + lengths
    ends = torch.where((lengths > 0) & (ends <= limit), ends, limit + 1)
    longer = torch.nonzero(lengths == 0).reshape(-1)
    if longer.numel():  # codes of values >= 512, or garbage: decoded group by group
        ends_L, _ = _omega_decode_at(stream_M, longer, torch.tensor([limit]).expand(longer.numel()))
        ends[longer] = torch.where(ends_L >= 0, ends_L, limit + 1).to(dtype)
    return torch.cat([ends, torch.full((2,), limit + 1, dtype=dtype)])


def _omega_values_at(stream_M: Tensor, pos: Tensor, limit: int) -> Tensor:
    """int64 values of the (complete) omega codes starting at ``pos``."""
    entries = _table_entries(stream_M, pos, limit)
    values = (entries >> 5).to(torch.int64)
    longer = torch.nonzero(entries == 0).reshape(-1)
    if longer.numel():
        _, values[longer] = _omega_decode_at(
            stream_M, pos[longer], torch.tensor([limit]).expand(longer.numel())
        )
    return values


# Pointer doubling costs a gather over every bit position, a Python step ~1 us per head: strides of
# 2**4 codes were the fastest of 2**1 .. 2**8 (10**6 entries at 8 bits, 1 thread of a 2-core VM).
_JUMPS = 4


def _follow(next_T: Tensor, sink: int) -> Tensor:
    """The chain 0, next(0), next(next(0)), ... up to (not including) the first t with next(t) == sink.

    ``next_T`` maps every position to a later one or to ``sink`` (``next[sink] == sink``). Walked in
    Python in strides of 2**_JUMPS (pointer doubling), then the strides are filled in together.
    Returns int64 positions.
    """
    stride = next_T
    for _ in range(_JUMPS):
        stride = stride.index_select(0, stride)
    stride_list = stride.numpy().data  # a memoryview: indexing it gives Python ints, fast
    heads = [0]
    while (head := stride_list[heads[-1]]) != sink:
        heads.append(head)
    current = torch.tensor(heads, dtype=next_T.dtype)
    chain = torch.empty(len(heads), 2**_JUMPS, dtype=next_T.dtype)
    for j in range(2**_JUMPS):
        chain[:, j] = current
        current = next_T.index_select(0, current)
    chain_C = chain.reshape(-1)
    return chain_C[next_T.index_select(0, chain_C) != sink].to(torch.int64)


def _check_padding(stream_M: Tensor, num_bits: int) -> None:
    """The bits after the last code are the ones-padding of the last byte (else a corrupt stream)."""
    num_pad = 8 * stream_M.numel() - num_bits
    if num_pad >= 8 or (num_pad and int(stream_M[-1]) & ((1 << num_pad) - 1) != (1 << num_pad) - 1):
        raise ValueError(
            f"not a complete Elias omega stream: the codes end at bit {num_bits} of {8 * stream_M.numel()} "
            "and the rest is not the padding of ones"
        )


def elias_omega_decode(stream: Tensor, nbits: int | None = None) -> Tensor:
    """Inverse of :func:`elias_omega_encode`: the int64 values coded in ``stream``.

    With ``nbits`` the codes must end exactly at bit ``nbits``; without it, at the padding of ones.
    """
    stream_M = stream.reshape(-1).cpu()
    if stream_M.dtype != torch.uint8:
        raise ValueError(f"stream must be uint8, got {stream_M.dtype}")
    limit = 8 * stream_M.numel() if nbits is None else nbits
    if not 0 <= limit <= 8 * stream_M.numel():
        raise ValueError(f"nbits must be in [0, {8 * stream_M.numel()}] for this stream, got {nbits}")
    ends = _omega_ends_everywhere(stream_M, limit)
    starts = _follow(ends, limit + 1)
    end = int(ends[starts[-1]]) if starts.numel() else 0
    if nbits is None:
        _check_padding(stream_M, end)
    elif end != nbits:
        raise ValueError(f"the Elias omega codes end at bit {end}, not at nbits={nbits}")
    return _omega_values_at(stream_M, starts, limit)


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
        encoding: str = "fixed",
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
        ends = _omega_ends_everywhere(stream_M, limit)
        # next triple: the gap code's end holds the sign bit, the level code follows it
        sign_at = ends[: limit + 1]
        level_at = torch.where(sign_at < limit, sign_at + 1, limit + 1)
        next_T = torch.cat([ends.index_select(0, level_at), ends[-1:]])
        starts_K = _follow(next_T, limit + 1)
        _check_padding(stream_M, int(next_T[starts_K[-1]]) if starts_K.numel() else 0)
        signs_at_K = sign_at[starts_K].to(torch.int64)
        indices_K = torch.cumsum(_omega_values_at(stream_M, starts_K, limit), 0) - 1
        levels_K = _omega_values_at(stream_M, signs_at_K + 1, limit)
        if starts_K.numel() and (int(indices_K[-1]) >= numel or int(levels_K.max()) > self.num_levels):
            raise ValueError(
                f"Elias stream decodes to index {int(indices_K[-1])} (numel {numel}) or level "
                f"{int(levels_K.max())} (s = {self.num_levels}): not a QSGD payload of this shape"
            )
        negative_K = _bits_at(stream_M, signs_at_K)
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
