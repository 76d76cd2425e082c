"""Deep Gradient Compression's sparsifier: a sampled threshold, adapted, then at most k entries.

Lin, Han, Mao, Wang, Dally, "Deep Gradient Compression", ICLR 2018 (arXiv 1712.01887), sec. 3 and
the first author's code (``synxlin/deep-gradient-compression``, ``DGCCompressor._sparsify`` and
``initialize``), whose semantics this module follows. The momentum correction, momentum factor
masking and local clipping that the paper pairs with it are error-feedback state, not compression:
:class:`common.feedback.MomentumCorrection`.

Algorithm, for a flat tensor x of N entries at density d (k = ceil(d * N)):

1. Sample |x|: S = max(ceil(sample_ratio * N), ceil(2 / d)) entries at a stride (the code's
   ``stride = ceil(N / S / 32) * 32 + 1``, lowered by 8 until N // stride >= S) from a random start,
   or uniformly at random (``strided_sample=False``). The start / positions come from ``rng.local``.
2. ``thr`` = the smallest of the top ceil(S * d) sampled magnitudes; select ``|x| >= thr``.
3. Adapt, at most ``max_adaptation_iters`` times: more than ``upper_bound * k`` selected ->
   with ``resample`` take the exact top-k of the selected entries ("hierarchical top-k") and stop,
   else ``thr *= upper_bound``; fewer than ``lower_bound * k`` -> ``thr *= lower_bound``;
   otherwise stop.
4. Send at most k of the selected entries (see truncation below).

Tensors with N <= ceil(2 / d) (at d = 0.001: up to 2000 entries; k = 1 or 2, the code prints
"transmits 1 gradient element" for them) are sampled whole, as in the code; so is every tensor for
which the stride search ends at 1 (e.g. 4097 entries at d = 0.001), and every tensor when
``sample_ratio == 1``. The threshold is then the exact k-th largest magnitude, there is no
adaptation, and the k largest are sent (ties at the threshold are truncated like any surplus).

Truncation to k. The official code ends with ``indices[:num_selects]``: when the count lands in
(k, upper_bound * k] it keeps the k selected entries of *lowest position*, not the largest, so the
tail of every tensor is systematically sent later. Here ``truncation="magnitude"`` (default) keeps
the k largest of the selected entries instead. Since every entry with ``|x| >= thr`` is selected,
that is the exact top-k of x whenever at least k are selected (and the exact top-``count``
otherwise): the sampled threshold only saves the full sort. ``truncation="position"`` reproduces
the code (lowest positions first, on every backend).

Other deviations from the code, all documented here: ``sample_ratio`` is used as given in (0, 1]
(the code silently raises it to at least 0.01, so the paper's 0.1 % could not be asked for); the
strided sample has exactly S entries (the code's slice ``x[start::stride]`` may hold S + 1) and its
random start comes from ``rng.local``, not Python's global ``random``; the code's fp16 values
option is not offered (indices are int32 here as with its ``int32_indices``).

Warm-up (the paper's "warm-up training"): the density follows 25 %, 6.25 %, 1.5625 %, 0.390625 %, then the final
0.1 %, one value per epoch (:func:`common.compressors.dgc_warmup.warmup_density`; apply it with
:meth:`DGC.set_density`).

Payload ``wire`` (1-D): ``"values"`` (x's dtype) and ``"indices"`` (int32 below 2**31 entries),
one entry each per sent element. Bits on the wire: ``num_sent * (8 * element_size + 32)``, i.e.
64 per entry for fp32, with ``num_sent <= k`` and varying between ranks and steps
(``fixed_size = False``: the all-gather exchanges counts first). Biased, not linear (every rank
sends its own indices: all-gather), local RNG only.

Legend: ``_N`` the tensor, ``_S`` the sample, ``_C`` every selected entry, ``_K`` the sent ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from torch import Tensor

from kernels._dispatch import use_native, use_triton
from kernels.threshold_select import estimate_threshold, threshold_select

from .base import CompressorRNG, Payload, check_density, check_flag, index_dtype, num_kept
from .decoders import SparseCompressor, scatter_sum_into
from .segments import SegmentDraws, Segments, num_kept_table
from .select import kth_largest, segmented_topk
from .topk import sparse_payload

Truncation = Literal["magnitude", "position"]
TRUNCATIONS: tuple[str, ...] = get_args(Truncation)

#: ``(values_C, indices_C, count)``: the entries a round selected, and how many.
Selection = tuple[Tensor, Tensor, int]
#: A round's selection at a threshold, and the kept round's made ready to send.
Rounds = tuple[Callable[[Tensor], Selection], Callable[[Selection], Selection]]

#: Values of ``DGC.last_selection["branch"]``.
BRANCHES = ("exact", "within_bounds", "hierarchical_topk", "max_iterations")


def _check_fraction(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 < value <= 1.0:
        raise ValueError(f"{name} must be a number in (0, 1], got {value!r}")
    return float(value)


class DGC(SparseCompressor):
    """DGC's sampled-threshold sparsifier (Lin et al., ICLR 2018; code ``DGCCompressor._sparsify``).

    Options (the code's names in brackets): ``density`` [compress_ratio] in (0, 1];
    ``sample_ratio`` in (0, 1]; ``strided_sample``; ``upper_bound`` >= 1 and ``lower_bound`` in
    (0, 1] [compress_upper/lower_bound]; ``max_adaptation_iters`` >= 0; ``resample``;
    ``truncation`` ``"magnitude"`` (default) or ``"position"`` (the code). See the module docstring
    for the algorithm and the deviations.

    Biased (use with :class:`~common.feedback.MomentumCorrection` or error feedback), not linear
    (all-gather), variable size, RNG: ``rng.local`` (the sample's start or positions). Bits on the
    wire: ``num_sent * (8 * element_size + 32)``, ``num_sent <= ceil(density * numel)``.

    ``last_selection`` records the latest :meth:`compress` call (diagnostics only; it never changes
    a result): ``numel``, ``k``, ``num_samples``, ``threshold`` (final), ``selected`` (entries
    ``>= threshold``), ``sent``, ``iterations`` (adaptation rounds run), ``branch`` (one of
    :data:`BRANCHES`: the tensor was sampled whole / the count ended within the bounds / the
    hierarchical top-k fallback ran / the rounds ran out) and ``fallback`` (``branch ==
    "hierarchical_topk"``). ``sent / numel`` is the actual density to log.
    """

    name = "dgc"
    linear = False
    unbiased = False
    fixed_size = False
    density: float

    def __init__(
        self,
        density: float = 0.001,
        *,
        sample_ratio: float = 0.01,
        strided_sample: bool = True,
        upper_bound: float = 1.3,
        lower_bound: float = 0.8,
        max_adaptation_iters: int = 10,
        resample: bool = True,
        truncation: Truncation = "magnitude",
    ) -> None:
        self.density = check_density(density)
        self.sample_ratio = _check_fraction("sample_ratio", sample_ratio)
        if isinstance(upper_bound, bool) or not isinstance(upper_bound, int | float) or not upper_bound >= 1:
            raise ValueError(f"upper_bound must be a number >= 1 (times k), got {upper_bound!r}")
        self.upper_bound = float(upper_bound)
        self.lower_bound = _check_fraction("lower_bound", lower_bound)
        if (
            isinstance(max_adaptation_iters, bool)
            or not isinstance(max_adaptation_iters, int)
            or max_adaptation_iters < 0
        ):
            raise ValueError(f"max_adaptation_iters must be an int >= 0, got {max_adaptation_iters!r}")
        self.max_adaptation_iters = max_adaptation_iters
        if truncation not in TRUNCATIONS:
            raise ValueError(f"truncation must be one of {', '.join(TRUNCATIONS)}, got {truncation!r}")
        self.truncation = truncation
        self.strided_sample = check_flag("strided_sample", strided_sample)
        self.resample = check_flag("resample", resample)
        self.last_selection: dict[str, Any] = {}

    def sample_plan(self, numel: int) -> tuple[int, int]:
        """``(num_samples, stride)`` for a tensor of ``numel`` entries (the code's ``initialize``);
        ``(numel, 1)`` when the tensor is sampled whole."""
        if self.sample_ratio >= 1.0:
            return numel, 1
        wanted = max(math.ceil(numel * self.sample_ratio), math.ceil(2 / self.density))
        if numel <= math.ceil(2 / self.density):
            return numel, 1
        stride = math.ceil(numel / wanted / 32) * 32 + 1
        while numel // stride < wanted:
            stride -= 8  # reaches 1 at the latest (stride is 32 m + 1), where numel // 1 >= wanted
        return numel // stride, stride

    def _threshold(self, x_N: Tensor, num_samples: int, stride: int, rng: CompressorRNG) -> Tensor:
        """fp32 0-dim: the smallest of the top ceil(S * d) sampled magnitudes."""
        numel = x_N.numel()
        if num_samples < numel and not self.strided_sample:
            return estimate_threshold(x_N, self.density, sample_size=num_samples, generator=rng.local)
        if num_samples < numel:
            start = int(torch.randint(stride, (1,), generator=rng.local, device=x_N.device))
            sample_S = x_N[start : start + stride * num_samples : stride]
        else:
            sample_S = x_N
        top = num_kept(num_samples, self.density)
        return torch.topk(sample_S.to(torch.float32).abs(), top, sorted=False).values.min()

    def compress(self, x: Tensor, rng: CompressorRNG) -> Payload:
        x_N = x.reshape(-1)
        numel = x_N.numel()
        k = num_kept(numel, self.density)
        num_samples, stride = self.sample_plan(numel)
        threshold = self._threshold(x_N, num_samples, stride, rng)
        threshold, selection, branch, iterations = self._adapt(x_N, threshold, k, num_samples == numel)
        values_K, indices_K = self._truncate(selection, k, branch)
        self.last_selection = {
            "numel": numel,
            "k": k,
            "num_samples": num_samples,
            "threshold": float(threshold),
            "selected": selection[2],
            "sent": int(values_K.numel()),
            "iterations": iterations,
            "branch": branch,
            "fallback": branch == "hierarchical_topk",
        }
        return Payload(
            wire={"values": values_K, "indices": indices_K.to(index_dtype(numel))},
            shape=x.shape,
            dtype=x.dtype,
        )

    def _adapt(
        self, x_N: Tensor, threshold: Tensor, k: int, whole: bool, fused: bool | None = None
    ) -> tuple[Tensor, Selection, str, int]:
        """The code's adaptation loop: ``(threshold, (values_C, indices_C, count), branch, rounds)``,
        ``values_C`` / ``indices_C`` every entry with ``|x| >= threshold``.

        As the code: ``|x|`` once (in fp32), then a comparison and a ``nonzero`` per round, the
        values listed once at the end (position order). ``fused`` (default: on CUDA with Triton, and
        on fp32 CPU tensors where the compiled kernels build): ``kernels.threshold_select`` takes the
        place of each round instead (no |x| or mask in memory; buffers of ``upper_bound * k`` slots,
        read again only on overflow; the CPU kernel lists in position order, so the selection is the
        mask rounds' bit for bit).
        """
        if fused is None:  # the fused kernel on CUDA, or the compiled one on a CPU (the same selection)
            cpu_kernel = x_N.dtype == torch.float32 and use_native("auto", x_N.device)
            fused = use_triton("auto", x_N.device) or cpu_kernel
        select, listed = self._fused_rounds(x_N, k) if fused else self._mask_rounds(x_N)
        selection = select(threshold)
        if whole:
            return threshold, listed(selection), "exact", 0
        for iterations in range(self.max_adaptation_iters):
            selected = selection[2]
            if selected > self.upper_bound * k and self.resample:
                return threshold, listed(selection), "hierarchical_topk", iterations
            if selected > self.upper_bound * k:
                threshold = threshold * self.upper_bound
            elif selected < self.lower_bound * k:
                threshold = threshold * self.lower_bound
            else:
                return threshold, listed(selection), "within_bounds", iterations
            selection = select(threshold)
        within = self.lower_bound * k <= selection[2] <= self.upper_bound * k
        branch = "within_bounds" if within else "max_iterations"
        return threshold, listed(selection), branch, self.max_adaptation_iters

    @staticmethod
    def _mask_rounds(x_N: Tensor) -> Rounds:
        """A round: ``nonzero(|x| >= threshold)`` (a host sync, as the code's); the values are read
        only for the selection that is kept."""
        importance_N = x_N.to(torch.float32).abs()

        def select(threshold: Tensor) -> Selection:
            indices_C = torch.nonzero(importance_N >= threshold).view(-1)
            return indices_C, indices_C, indices_C.numel()

        def listed(selection: Selection) -> Selection:
            indices_C = selection[0]
            return x_N[indices_C], indices_C.to(torch.int32), selection[2]

        return select, listed

    def _fused_rounds(self, x_N: Tensor, k: int) -> Rounds:
        """A round: the fused kernel into buffers of ``upper_bound * k`` slots; on overflow the
        selection is taken again whole."""
        capacity = max(k, math.floor(self.upper_bound * k))

        def select(threshold: Tensor) -> Selection:
            values_C, indices_C, count = threshold_select(x_N, threshold, capacity)
            count_ = int(count)  # a host sync, as the code's nonzero()
            if count_ > capacity:
                values_C, indices_C, _ = threshold_select(x_N, threshold, count_)
            return values_C[:count_], indices_C[:count_], count_

        return select, lambda selection: selection

    def _truncate(self, selection: Selection, k: int, branch: str) -> tuple[Tensor, Tensor]:
        """At most k of the selected entries: the largest (fallback, or ``truncation="magnitude"``)
        or those of lowest position (the code's ``indices[:num_selects]``)."""
        values_C, indices_C, count = selection
        if count <= k:
            return values_C, indices_C
        if branch == "hierarchical_topk" or self.truncation == "magnitude":
            keep_K = torch.topk(values_C.to(torch.float32).abs(), k, sorted=False).indices
        else:  # sorted explicitly: the Triton kernel's buffer is not in position order
            keep_K = torch.argsort(indices_C)[:k]
        return values_C[keep_K], indices_C[keep_K]

    # -- the fused path: every tensor of a bucket at once ----------------------------------------

    def fuses(self) -> bool:
        """The default rule (magnitude truncation, strided sample, hierarchical top-k on
        overshoot); the code's position truncation and the other variants run per tensor."""
        return self.truncation == "magnitude" and self.strided_sample and self.resample

    def compress_segments(self, flat: Tensor, segments: Segments, draws: SegmentDraws) -> Payload:
        """Every tensor's DGC selection at once, with no host read.

        Per tensor, the rule above sends the ``min(count, k)`` largest entries of those at or
        above the adapted threshold ``T_j* = T_0 * lower_bound ** j*``: the tensor's top k,
        less those below ``T_j*``. ``j*`` is the first round whose count reaches ``lower_bound *
        k`` (or the last): a count reaches ``q = ceil(lower_bound * k)`` exactly when the q-th
        largest magnitude is at or above the round's threshold, and the q-th largest is read off
        the tensor's top k (``segmented_topk``, sorted within each tensor). So the adaptation's
        rounds are compared on S x (rounds + 1) numbers, not on the tensor. ``T_0`` is the
        code's strided sample's threshold, its start drawn from ``draws``' local stream (per
        tensor: ``rng.local``). Wire: values and int32 bucket positions, k slots per tensor
        whatever is sent (the all-gather needs no count exchange: a fixed capacity instead of the
        code's data-dependent sizes); an unsent slot holds position N and the value 0 and is
        counted on the wire. ``local["num_sent"]``: entries sent (a device int64).
        """
        plan = segments.cached(
            ("dgc-plan", self.density, self.sample_ratio, self.lower_bound), lambda: self._plan(segments)
        )
        abs_N = flat.float().abs()
        starts_S = draws.integers_below(plan.stride_S, "local")
        positions_M = plan.base_M + starts_S.index_select(0, plan.seg_M) + plan.step_M
        thresholds = [kth_largest(abs_N.index_select(0, positions_M), plan.seg_M, plan.rank_pos_S)]
        for _ in range(self.max_adaptation_iters):  # rounds, not tensors: S numbers each
            thresholds.append(thresholds[-1] * self.lower_bound)
        t_S_J = torch.stack(thresholds, 1)
        indices_K, valid_K, inexact_S = segmented_topk(abs_N, segments, plan.k)
        top_K = torch.where(valid_K, abs_N.index_select(0, indices_K.clamp(max=flat.numel() - 1)), -1.0)
        rounds = self.max_adaptation_iters
        first_S = torch.zeros(len(segments), dtype=torch.int64, device=flat.device)
        if rounds:  # the first round whose count reaches q, else the last
            reached_S_J = t_S_J[:, :-1] <= top_K.index_select(0, plan.q_slot_S).unsqueeze(1)
            first_S = torch.where(reached_S_J.any(1), reached_S_J.to(torch.int8).argmax(1), rounds)
            first_S = torch.where(plan.whole_S, 0, first_S)
        threshold_K = t_S_J.gather(1, first_S.unsqueeze(1)).squeeze(1).index_select(0, plan.seg_K)
        sent_K = valid_K & (top_K >= threshold_K)
        payload = sparse_payload(
            flat, segments, torch.where(sent_K, indices_K, flat.numel()), sent_K, inexact_S
        )
        payload.local["num_sent"] = sent_K.sum()
        self.last_selection = {"fused": True}
        return payload

    def _plan(self, segments: Segments) -> _FusedPlan:
        k = num_kept_table(segments, self.density)
        seg_M, step_M, base_M, stride_S, rank_pos, q_slot, whole, seg_K = [], [], [], [], [], [], [], []
        sampled = kept = 0
        for s, (start, n, k_s) in enumerate(zip(segments.starts, segments.sizes, k, strict=True)):
            num_samples, stride = self.sample_plan(n)
            seg_M.append(torch.full((num_samples,), s))
            step_M.append(torch.arange(num_samples) * stride)
            base_M.append(torch.full((num_samples,), start))
            stride_S.append(stride)
            rank_pos.append(sampled + num_kept(num_samples, self.density) - 1)
            q_slot.append(kept + max(1, math.ceil(self.lower_bound * k_s)) - 1)
            whole.append(num_samples == n)
            seg_K.append(torch.full((k_s,), s))
            sampled += num_samples
            kept += k_s
        device = segments.device
        return _FusedPlan(
            k=k,
            seg_M=torch.cat(seg_M).to(device),
            step_M=torch.cat(step_M).to(device),
            base_M=torch.cat(base_M).to(device),
            stride_S=torch.tensor(stride_S).to(device),
            rank_pos_S=torch.tensor(rank_pos).to(device),
            q_slot_S=torch.tensor(q_slot).to(device),
            whole_S=torch.tensor(whole).to(device),
            seg_K=torch.cat(seg_K).to(device),
        )

    def decode_segments_into(self, payloads: Sequence[Payload], out: Tensor) -> Tensor:
        return scatter_sum_into(payloads, out)


@dataclass(frozen=True)
class _FusedPlan:
    """A layout's tables for the fused DGC (built once per layout and density)."""

    k: tuple[int, ...]
    seg_M: Tensor  # the sample's segments
    step_M: Tensor  # i * stride of each sample
    base_M: Tensor  # its segment's first entry in the bucket
    stride_S: Tensor
    rank_pos_S: Tensor  # position of each segment's threshold in the sorted sample
    q_slot_S: Tensor  # slot of each segment's ceil(lower_bound * k)-th largest among its kept
    whole_S: Tensor  # sampled whole: the threshold is exact, no adaptation
    seg_K: Tensor  # segment of each kept slot
