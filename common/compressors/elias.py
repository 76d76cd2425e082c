"""Elias omega coding (Elias 1975), vectorized both ways: the integer code of QSGD's Section 3.2
stream (:mod:`common.compressors.qsgd` has the stream's layout and the timings).

Legend: K values, M bytes of a stream, T bit positions, L positions decoded group by group.

Encoding: code words from a table of the codes of 1 .. 2**16 - 1, then one scatter of bytes.
Decoding is speculative: an omega code is decoded at every bit position at once (a table of the
code at the head of each 16-bit pattern, the rare longer codes group by group), and the real code
boundaries are the chain 0 -> next(0) -> ... followed with pointer doubling (:func:`follow`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import Tensor

#: Elias omega values handled here are < 2**31 (gaps are at most N <= 2**31 - 2**16, levels <= 127):
#: an omega code is then at most 42 bits and a (gap, sign, level) triple at most 56, one int64 word.
OMEGA_LIMIT = 2**31
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


def bits_at(stream_M: Tensor, pos: Tensor) -> Tensor:
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


def omega_ends_everywhere(stream_M: Tensor, limit: int) -> Tensor:
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


def omega_values_at(stream_M: Tensor, pos: Tensor, limit: int) -> Tensor:
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


def follow(next_T: Tensor, sink: int) -> Tensor:
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


def check_padding(stream_M: Tensor, num_bits: int) -> None:
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
    ends = omega_ends_everywhere(stream_M, limit)
    starts = follow(ends, limit + 1)
    end = int(ends[starts[-1]]) if starts.numel() else 0
    if nbits is None:
        check_padding(stream_M, end)
    elif end != nbits:
        raise ValueError(f"the Elias omega codes end at bit {end}, not at nbits={nbits}")
    return omega_values_at(stream_M, starts, limit)
