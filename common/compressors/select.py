"""The k largest entries of every tensor of a bucket, in a fixed number of launches.

``segmented_topk(abs_N, segments, k)`` returns, for each segment s, the positions of its ``k[s]``
largest entries (ties at the k-th magnitude broken by lowest position) as one flat ``[K]`` index
tensor (``K = sum(k)``, segment s's slots at ``sum(k[:s])``), with no host read and a number of ops
that does not depend on how many segments there are. It is the per-tensor ``topk_indices``' rule
(``common.compressors.topk``) for a whole bucket at once:

1. Per segment, a threshold ``t_s`` from a sample of its magnitudes: the whole segment when it is
   small (fewer than ``SAMPLED_MIN_NUMEL`` entries, or ``k > n / 4``; then ``t_s`` is the exact k-th
   largest), else ``m = 128 / density`` entries at the positions ``(i * 1000003) mod n`` and the
   magnitude that ``2 k m / n`` of them reach (about 2k entries of the tensor reach it). The
   sample's r-th largest per segment is read off one sort of ``(segment, -magnitude)`` keys.
2. Candidates: every entry above ``t_s``, then entries equal to it by position, up to a capacity
   ``cap_s`` (k for a whole segment, ``4 k + 64`` for a sampled one), compacted by a cumulative sum
   into a buffer of ``sum(cap)`` slots.
3. The k largest candidates of each segment: one sort of the candidates' ``(segment, -magnitude)``
   keys; segment s's first ``k_s`` are its top k.

The result is exact (the tensor's k largest, ties aside) unless a sampled threshold misses by more
than the capacity allows: fewer than k entries reach it, or more than ``4 k + 64`` exceed it, each
a deviation of about 8 standard deviations of the sample's count for the sample sizes above (the
per-tensor rule's fallback to a full ``topk`` cannot be taken without reading the count on the
host). Such a segment still sends k valid entries (the largest of those it holds; slots it
cannot fill are marked invalid), and ``inexact`` counts it on the device.

Legend: N entries, M sampled entries, C candidate slots, K kept slots, S segments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .segments import Segments

SAMPLED_MIN_NUMEL = 1 << 15  # as common.compressors.topk
SAMPLED_TOP = 256
CANDIDATE_FACTOR = 2.0
_STRIDE_PRIME = 1_000_003
_LOW31 = 0x7FFFFFFF
_LOW32 = 0xFFFFFFFF


@dataclass(frozen=True)
class _Plan:
    """A layout's tables for one ``k`` (built once): the sample's positions and segment ids, each
    segment's rank within its sample and first sample slot, the candidate capacities' slots, and
    the kept slots' positions in the sorted candidates."""

    sample_pos_M: Tensor
    sample_seg_M: Tensor
    rank_pos_S: Tensor  # position in the sorted sample of each segment's threshold
    cap_S: Tensor
    cand_start_S: Tensor
    cand_seg_C: Tensor
    kept_slot_K: Tensor  # slot in the sorted candidates of each kept entry
    k_S: Tensor
    num_candidates: int


def sample_plan(n: int, k: int) -> tuple[int, int, int]:
    """``(samples, rank, capacity)`` of one tensor: ``samples == n`` (sampled whole, rank k,
    capacity k) or a strided sample whose ``rank``-th largest is the threshold."""
    if n < SAMPLED_MIN_NUMEL or 4 * k > n:
        return n, k, k
    samples = min(n, math.ceil(SAMPLED_TOP * n / (CANDIDATE_FACTOR * k)))
    rank = max(1, math.ceil(CANDIDATE_FACTOR * k * samples / n))
    if samples >= n // 4 or rank >= samples:
        return n, k, k
    return samples, rank, min(n, 4 * k + 64)


def _plan(segments: Segments, k: tuple[int, ...]) -> _Plan:
    device = segments.device
    positions, seg_ids, rank_pos, caps, kept = [], [], [], [], []
    sample_start = cand_start = 0
    cand_starts = []
    for s, (start, n, k_s) in enumerate(zip(segments.starts, segments.sizes, k, strict=True)):
        samples, rank, cap = sample_plan(n, k_s)
        if samples == n:
            positions.append(torch.arange(start, start + n))
        else:
            positions.append(torch.arange(samples).mul_(_STRIDE_PRIME).remainder_(n).add_(start))
        seg_ids.append(torch.full((samples,), s))
        rank_pos.append(sample_start + rank - 1)
        caps.append(cap)
        cand_starts.append(cand_start)
        kept.append(torch.arange(cand_start, cand_start + k_s))
        sample_start += samples
        cand_start += cap
    return _Plan(
        sample_pos_M=torch.cat(positions).to(device),
        sample_seg_M=torch.cat(seg_ids).to(device),
        rank_pos_S=torch.tensor(rank_pos).to(device),
        cap_S=torch.tensor(caps).to(device),
        cand_start_S=torch.tensor(cand_starts).to(device),
        cand_seg_C=torch.repeat_interleave(torch.arange(len(caps)), torch.tensor(caps)).to(device),
        kept_slot_K=torch.cat(kept).to(device),
        k_S=torch.tensor(k).to(device),
        num_candidates=cand_start,
    )


def _descending_keys(seg: Tensor, abs_values: Tensor) -> Tensor:
    """int64 keys that sort by segment, then by magnitude from the largest (a non-negative fp32's
    bits order as its value does)."""
    bits = abs_values.contiguous().view(torch.int32).to(torch.int64)
    return (seg << 32) | (_LOW31 - bits)


def kth_largest(abs_M: Tensor, seg_M: Tensor, rank_pos_S: Tensor) -> Tensor:
    """fp32 ``[S]``: each segment's r-th largest of the non-negative ``abs_M`` (its entries
    consecutive, ``seg_M`` their segments): one sort of ``(segment, -magnitude)`` keys, read at
    ``rank_pos_S`` (the segment's first slot + r - 1)."""
    sorted_M = torch.sort(_descending_keys(seg_M, abs_M)).values
    bits_S = _LOW31 - (sorted_M.index_select(0, rank_pos_S) & _LOW32)
    return bits_S.to(torch.int32).view(torch.float32)


def segmented_topk(abs_N: Tensor, segments: Segments, k: tuple[int, ...]) -> tuple[Tensor, Tensor, Tensor]:
    """``(indices_K, valid_K, inexact_S)``: the bucket positions of each segment's ``k[s]`` largest
    entries of the non-negative fp32 ``abs_N`` (module docstring), which slots hold one (all, but
    where a sampled threshold missed), and which segments' thresholds missed (bool ``[S]``).
    Invalid slots hold the position ``N`` (one past the bucket)."""
    plan: _Plan = segments.cached(("topk-plan", k), lambda: _plan(segments, k))
    numel = segments.numel
    # 1. the threshold of each segment: the rank-th largest of its sample
    t_S = kth_largest(abs_N.index_select(0, plan.sample_pos_M), plan.sample_seg_M, plan.rank_pos_S)
    # 2. the candidates: above the threshold, then ties by position, up to the capacity
    t_N = segments.expand(t_S)
    above_N = abs_N > t_N
    tie_N = abs_N == t_N
    above_S = _counts(segments, above_N)
    ties_S = _counts(segments, tie_N)
    room_N = segments.expand(plan.cap_S - above_S)
    candidate_N = above_N | (tie_N & (segments.segment_cumsum(tie_N) <= room_N))
    rank_N = segments.segment_cumsum(candidate_N)
    candidate_N &= rank_N <= segments.expand(plan.cap_S)
    dump = plan.num_candidates
    slot_N = torch.where(candidate_N, segments.expand(plan.cand_start_S) + rank_N - 1, dump)
    cand_abs = torch.full((dump + 1,), -1.0, dtype=torch.float32, device=abs_N.device)
    cand_abs.scatter_(0, slot_N, abs_N)
    cand_pos = torch.full((dump + 1,), numel, dtype=torch.int64, device=abs_N.device)
    cand_pos.scatter_(0, slot_N, torch.arange(numel, device=abs_N.device))
    cand_abs, cand_pos = cand_abs[:dump], cand_pos[:dump]
    # 3. the k largest candidates of each segment (empty slots sort last in their segment)
    filled_C = cand_pos < numel
    keys_C = torch.where(
        filled_C, _descending_keys(plan.cand_seg_C, cand_abs.clamp(min=0.0)), (plan.cand_seg_C << 32) | _LOW32
    )
    order_C = torch.sort(keys_C).indices
    chosen_K = order_C.index_select(0, plan.kept_slot_K)
    indices_K = cand_pos.index_select(0, chosen_K)
    inexact_S = (above_S > plan.cap_S) | (above_S + ties_S < plan.k_S)
    return indices_K, indices_K < numel, inexact_S


def _counts(segments: Segments, mask_N: Tensor) -> Tensor:
    """int64 ``[S]``: set entries per segment (exact at any size, unlike an fp32 sum)."""
    total_N = torch.cumsum(mask_N, 0, dtype=torch.int64)
    ends_S = segments.offsets + segments.lengths - 1
    end_totals = total_N.index_select(0, ends_S)
    return end_totals - torch.cat([end_totals.new_zeros(1), end_totals[:-1]])
