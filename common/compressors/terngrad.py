"""TernGrad: stochastic ternarization with one scaler per tensor (Wen et al., NeurIPS 2017).

Algorithm, for a tensor x of N elements (float32 math whatever x's dtype):

1. Scaler and clipping (``clip = c``; the paper uses c = 2.5), in one of two rules (``clip_at``):

   - ``"shared"`` (default; the official code's ``gradient_binarizing_scalers`` +
     ``stochastical_binarize_gradients``): each worker's scaler is ``c * sigma`` with
     ``sigma = std(x)`` (population std); with scaler sharing every worker uses the max over workers.
     Nothing is clamped beforehand: an entry with ``|x| >= s`` becomes ``±s`` with probability 1 (the
     code's implicit clipping), so all workers clip at the same shared bound.
   - ``"own"`` (GRACE's ``TernGradCompressor`` and this library before 2026-12): ``g = clamp(x, -c*sigma,
     c*sigma)`` with the worker's own sigma, then ``s = max_i |g_i|`` (shared: the max over workers),
     so each worker clips at its own 2.5 sigma.

   The two agree without sharing whenever some entry lies beyond ``c * sigma`` (then
   ``max |clamped| = c * sigma``); with sharing they differ on the workers whose sigma is below the
   largest. When sigma == 0 (a 1-element or constant tensor) nothing is an outlier: nothing is
   clipped and ``s = max |x|`` (where the code's ``s = 0`` would erase the gradient).
   ``clip = None``: no clipping, ``s = max |x|``.
2. ``g`` is ``x`` (``"shared"``) or the clamped ``x`` (``"own"``); the scaler ``s`` as above (or a larger
   one agreed on by all workers, see below).
3. Ternarize: ``t_i = sign(g_i) * b_i`` with ``b_i ~ Bernoulli(|g_i| / s)`` drawn from ``rng.local``;
   the estimate is ``s * t``. Since ``E[s * t_i] = s * sign(g_i) * |g_i| / s = g_i``, the estimate is
   unbiased for g, hence for x exactly when nothing is clipped (``clip=None``); with clipping it is
   biased towards zero on the outliers only (the paper's variance-reduction trade-off). If s == 0
   (an all-zero tensor) every code is 0.

Payload layout (``wire``, both 1-D):

- ``"codes"``: uint8, ``ceil(N / 4)`` bytes, 2-bit codes packed four per byte little-endian
  (``kernels.pack_bits`` layout: element i in bits ``2 * (i % 4)`` of byte ``i // 4``), with the
  mapping ``0 -> 0, +1 -> 1, -1 -> 2`` (3 is never written and decodes to 0).
- ``"scaler"``: float32, 1 element.

Bits on the wire: ``8 * ceil(N / 4) + 32``, i.e. 2 bits per element plus 32 bits per tensor.
``local`` holds only ``numel`` (the same on every rank).

Scaler sharing (the paper's ``max_scalers``): if every worker ternarizes with the same scaler
``s = max_w s_w``, the integer codes of all workers can be summed directly (an int8 all-reduce of W
values in {-1, 0, 1} fits for W <= 127) and decoded once: ``s * sum_w t_w`` (:meth:`TernGrad.decode_sum`).
Agreeing on that scaler (one small max all-reduce of :meth:`TernGrad.scaler` before compressing) is
the transport's job (GradientSync), which then passes ``scaler=`` to :meth:`TernGrad.compress`. Without
it each rank uses its own scaler and the payloads are all-gathered (``linear = False``).

Sampling and packing are fused in ``kernels.ternarize`` (Triton on CUDA, compiled C on CPU);
decoding uses ``kernels.ternary_decode_accumulate``, and the integer route ``kernels.ternary_values``
and ``kernels.scale_values`` (compiled on CPU, the pure-torch reference elsewhere).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from kernels import scale_values, ternarize, ternary_decode_accumulate, ternary_values
from kernels._dispatch import rand

from .base import CompressorRNG, Needs, Payload, check_fused_rng
from .decoders import DenseDecoder
from .segments import SegmentDraws, Segments

CODE_TRANSPORTS = ("auto", "allgather", "allreduce")
CLIP_RULES = ("shared", "own")

#: Relative slack allowed when a given scaler is slightly below max|g| (float rounding in transit).
SCALER_SLACK = 1e-6


def check_clip(clip: float | None) -> float | None:
    """Validate the clipping factor c (clip at c * sigma): a positive finite number, or None."""
    if clip is None:
        return None
    if isinstance(clip, bool) or not isinstance(clip, int | float) or not math.isfinite(clip) or not clip > 0:
        raise ValueError(
            f"clip must be a positive finite number (c in c*sigma clipping) or None, got {clip!r}"
        )
    return float(clip)


class TernGrad(DenseDecoder):
    """TernGrad (Wen et al. 2017): 2-bit stochastic ternary codes and one fp32 scaler per tensor.

    ``clip``: c in the paper's clipping at c * sigma (default 2.5); ``None`` disables clipping.
    ``clip_at``: ``"shared"`` (the official code: scaler c * sigma, entries beyond the shared scaler
    saturate) or ``"own"`` (clamp at the worker's own c * sigma, scaler = max of the clamped); see
    the module docstring.
    ``unbiased`` is True exactly when nothing is clipped (``clip=None``). Not linear: the wire holds
    packed codes with a per-rank scaler; summing codes is valid only with a shared scaler, which
    the transport arranges (:meth:`scaler`, :meth:`codes`, :meth:`decode_sum`). Fixed size:
    ``8 * ceil(numel / 4) + 32`` bits for every rank.
    ``fused_rng``: draw the Bernoulli noise inside the ternarizing kernel (a counter hash keyed from
    ``rng.local`` on CPU, Philox on CUDA; ``kernels._native``) instead of ``torch.rand``: the same
    distribution, another stream, several times faster on a CPU (default False: the ``torch.rand``
    stream the cross-checks with the official code share).
    """

    name = "terngrad"
    linear = False
    fixed_size = True

    def __init__(
        self,
        clip: float | None = 2.5,
        shared_scaler: bool = True,
        clip_at: str = "shared",
        code_transport: str = "auto",
        fp32_below: int = 0,
        fp32_layers: Sequence[str] = (),
        fused_rng: bool = False,
    ) -> None:
        self.clip = check_clip(clip)
        self.fused_rng = check_fused_rng(fused_rng)
        self.unbiased = self.clip is None
        if clip_at not in CLIP_RULES:
            raise ValueError(
                f"unknown clip_at {clip_at!r}; valid: shared (the official code: scaler c*sigma, "
                "entries beyond the shared scaler saturate), own (clamp at each worker's c*sigma)"
            )
        self.clip_at = clip_at
        if not isinstance(shared_scaler, bool):
            raise ValueError(f"shared_scaler must be true or false, got {shared_scaler!r}")
        if code_transport not in CODE_TRANSPORTS:
            raise ValueError(
                f"unknown code_transport {code_transport!r}; valid: {', '.join(CODE_TRANSPORTS)} "
                "(auto picks per tensor the one that sends fewer bits)"
            )
        if code_transport == "allreduce" and not shared_scaler:
            raise ValueError("code_transport='allreduce' sums codes, which needs shared_scaler=True")
        if isinstance(fp32_below, bool) or not isinstance(fp32_below, int) or fp32_below < 0:
            raise ValueError(
                f"fp32_below must be an integer >= 0 (tensors with fewer entries stay fp32), got {fp32_below!r}"
            )
        if isinstance(fp32_layers, str) or not all(isinstance(n, str) for n in fp32_layers):
            raise ValueError(f"fp32_layers must be a list of parameter or module names, got {fp32_layers!r}")
        #: Workers agree on the max scaler per tensor (one small max all-reduce), so codes can be summed.
        self.shared_scaler = shared_scaler
        self.code_transport = code_transport
        self.fp32_below = fp32_below
        self.fp32_layers = tuple(fp32_layers)
        # Declared for the transport: one scaler per tensor, agreed by a max round when shared;
        # the fp32 exceptions go in a dense all-reduce beside the codes.
        self.needs = Needs(
            scaler_round="max" if shared_scaler else None,
            scaled_codes=True,
            dense_tensors=bool(self.fp32_below or self.fp32_layers),
        )

    def keeps_fp32(self, name: str, numel: int) -> bool:
        """The paper's exceptions: small tensors (< ``fp32_below`` entries) and the named layers
        (a parameter name, or a module name covering its weight and bias) are sent in fp32."""
        return numel < self.fp32_below or any(name == n or name.startswith(n + ".") for n in self.fp32_layers)

    # ----------------------------------------------------------------------------------- encoder
    def _bound(self, x32: Tensor) -> Tensor | None:
        """``c * sigma`` as a 0-dim tensor (inf when sigma == 0), or None without clipping."""
        if self.clip is None or x32.numel() == 0:
            return None
        sigma = x32.std(unbiased=False)
        return torch.where(sigma > 0, self.clip * sigma, torch.full_like(sigma, math.inf))

    def clip_tensor(self, x: Tensor) -> Tensor:
        """What is ternarized, as float32: ``x`` clamped to ``[-c*sigma, c*sigma]`` with ``clip_at="own"``;
        ``x`` itself with ``"shared"`` (the scaler clips it) or without clipping.

        The clamp is a no-op when sigma == 0 (a 1-element or constant tensor: no entry deviates from
        the mean, and clamping to 0 would erase the gradient). No host synchronisation.
        """
        x32 = x.float()
        bound = self._bound(x32) if self.clip_at == "own" else None
        return x32 if bound is None else torch.clamp(x32, min=-bound, max=bound)

    def scaler(self, x: Tensor) -> Tensor:
        """The 0-dim float32 scaler this rank would use on its own (0 if empty): ``c * sigma``
        (``"shared"``; ``max |x|`` when sigma == 0 or without clipping), ``max |clip(x)|`` (``"own"``)."""
        x32 = x.float()
        if x32.numel() == 0:
            return torch.zeros((), dtype=torch.float32, device=x.device)
        if self.clip_at == "shared":
            bound = self._bound(x32)
            largest = x32.abs().amax()
            return largest if bound is None else torch.where(torch.isinf(bound), largest, bound)
        return self.clip_tensor(x32).abs().amax()

    def compress(
        self,
        x: Tensor,
        rng: CompressorRNG,
        scaler: Tensor | float | None = None,
        own: Tensor | None = None,
    ) -> Payload:
        """Ternarize ``x``. A given ``scaler`` (shared by all ranks) must be >= this rank's own
        (:meth:`scaler`), else ValueError: with ``"own"`` the probabilities |g|/s must be <= 1, with
        ``"shared"`` the shared bound is the largest of the workers'.

        ``own``: this rank's :meth:`scaler` of ``x`` where the caller has it already (the transport
        computes it for the max round), so it is not computed twice (a std and a max over the
        tensor: about a sixth of the compression of a ResNet-18 gradient on a CPU)."""
        g_N = self.clip_tensor(x).reshape(-1)
        numel = g_N.numel()
        if own is not None:
            own = torch.as_tensor(own, dtype=torch.float32).to(g_N.device).reshape(())
        elif not numel:
            own = torch.zeros((), dtype=torch.float32, device=g_N.device)
        else:  # "own": the clamped tensor's max (clamping it again would shrink sigma); "shared": c*sigma of x
            own = g_N.abs().amax() if self.clip_at == "own" else self.scaler(x)
        if scaler is None:
            s = own
        else:
            s = torch.as_tensor(scaler, dtype=torch.float32).to(g_N.device).reshape(())
            # One host sync: s must be a real number no smaller than this rank's own scaler.
            if bool(~(s >= 0) | (own > s * (1 + SCALER_SLACK))):
                raise ValueError(
                    f"scaler must be >= this rank's own scaler {own.item():.9g} (the max over ranks; "
                    f"relative slack {SCALER_SLACK}), got {s.item():.9g}"
                )
        generator = rng.local
        if generator.device == g_N.device:
            packed_M = ternarize(g_N, s, generator=generator, fused_rng=self.fused_rng)
        else:  # e.g. a CPU generator with CUDA tensors: draw on the generator's device, then move
            noise_N = rand(numel, generator)
            packed_M = ternarize(g_N, s, noise=noise_N.to(g_N.device))
        return Payload(
            wire={"codes": packed_M, "scaler": s.reshape(1)},
            shape=x.shape,
            dtype=x.dtype,
            local={"numel": numel},
        )

    # ----------------------------------------------------------------------------------- decoder
    def _decode(self, payload: Payload, out: Tensor | None = None) -> Tensor:
        """``s * t``, flat fp32 (``DenseDecoder`` gives ``decompress`` and the rest from it)."""
        return ternary_decode_accumulate(
            payload.wire["codes"], payload.wire["scaler"], payload.numel, out=out
        )

    def _decode_all(self, payloads: Sequence[Payload], out: Tensor | None = None) -> Tensor:
        packed_W_M = torch.stack([p.wire["codes"] for p in payloads])
        scalers_W = torch.cat([p.wire["scaler"].reshape(1).float() for p in payloads])
        return ternary_decode_accumulate(packed_W_M, scalers_W, payloads[0].numel, out=out)

    def codes(self, payload: Payload) -> Tensor:
        """The flat int8 ternary values {-1, 0, 1} (numel entries) decoded from the wire."""
        # 0 -> 0, 1 -> +1, 2 -> -1 (and the unused 3 -> 0, as in the kernels' decoder)
        return ternary_values(payload.wire["codes"], payload.numel)

    def decode_sum(
        self,
        code_sum: Tensor,
        scaler: Tensor | float,
        shape: Sequence[int],
        dtype: torch.dtype,
        out: Tensor | None = None,
    ) -> Tensor:
        """``scaler * code_sum`` reshaped to ``shape``, in ``dtype`` (into ``out`` when given: a
        contiguous fp32 tensor of as many entries, e.g. the bucket GradientSync reduces).

        ``code_sum`` is the elementwise sum (int8 / int32) of the :meth:`codes` of several ranks that
        all compressed with the same shared ``scaler``: with shared scalers, decoding the sum equals
        the sum of the decodes (up to fp32 rounding of the sum).
        """
        if out is not None and dtype == torch.float32:
            scale_values(code_sum, scaler, out=out)  # no fresh tensor (a first touch costs a pass)
            return out.view(tuple(shape))
        decoded = scale_values(code_sum, scaler)  # one compiled pass on CPU for int8 / int16 sums
        return decoded.reshape(tuple(shape)).to(dtype)

    # -- the fused path: a whole bucket, one scaler per tensor ------------------------------------

    def fuses(self) -> bool:
        return True

    def _segment_bounds(self, x32: Tensor, segments: Segments) -> tuple[Tensor | None, Tensor]:
        """``(c * sigma per tensor or None without clipping, max |x| per tensor)``: sigma the
        population std (two segmented passes: the mean, then the mean squared deviation)."""
        largest_S = segments.reduce(x32.abs(), "max")
        if self.clip is None:
            return None, largest_S
        mean_S = segments.reduce(x32, "mean")
        deviation_N = x32 - segments.expand(mean_S)
        sigma_S = segments.reduce(deviation_N * deviation_N, "mean").sqrt_()
        bound_S = torch.where(sigma_S > 0, self.clip * sigma_S, torch.full_like(sigma_S, math.inf))
        return bound_S, largest_S

    def scalers_segments(self, x: Tensor, segments: Segments) -> Tensor:
        """fp32 ``[S]``: :meth:`scaler` of every tensor of the bucket ``x`` (segmented reductions:
        their rounding may differ from the per-tensor ``std`` / ``amax`` in the last bit)."""
        bound_S, largest_S = self._segment_bounds(x.float(), segments)
        if bound_S is None:
            return largest_S
        if self.clip_at == "shared":
            return torch.where(torch.isinf(bound_S), largest_S, bound_S)
        return torch.minimum(largest_S, bound_S)  # max |clamp(x, -b, b)| = min(max |x|, b)

    def compress_segments(
        self,
        flat: Tensor,
        segments: Segments,
        draws: SegmentDraws,
        scaler: Tensor | None = None,
        own: Tensor | None = None,
    ) -> Payload:
        """Every tensor's ternary codes at once, packed together (``8 ceil(N / 4)`` bits) with one
        fp32 scaler per tensor (``"scaler"``, ``[S]``): ``scaler`` the agreed ones (else this
        rank's own, ``own`` if already computed). The agreed scalers must be >= this rank's
        (checked on the device: ``torch._assert_async``, no host read). Given the same scalers and
        noise (``draws``' local stream) the codes are :meth:`compress`'s bit for bit."""
        x32 = flat.float()
        if own is None:
            own = self.scalers_segments(x32, segments)
        s_S = own if scaler is None else scaler
        if scaler is not None:
            torch._assert_async(
                ((s_S >= 0) & (own <= s_S * (1 + SCALER_SLACK))).all(),
                "TernGrad: an agreed scaler is below this rank's own (the max over ranks must be >= it)",
            )
        g_N = x32
        if self.clip_at == "own" and self.clip is not None:
            bound_S, _ = self._segment_bounds(x32, segments)
            assert bound_S is not None
            bound_N = segments.expand(bound_S)
            g_N = torch.clamp(x32, min=-bound_N, max=bound_N)
        # per-entry scalers (buckets of one entry): one launch on CUDA, one compiled loop on a CPU
        packed_M = ternarize(g_N, segments.expand(s_S), bucket_size=1, noise=draws.uniform("local"))
        return Payload(
            wire={"codes": packed_M, "scaler": s_S}, shape=flat.shape, dtype=flat.dtype,
            local={"numel": flat.numel(), "segments": segments},
        )  # fmt: skip

    def decode_segments_into(self, payloads: Sequence[Payload], out: Tensor) -> Tensor:
        """The payloads' ``s * t`` summed in rank order (fp32), as :meth:`aggregate` per tensor."""
        segments: Segments = payloads[0].local["segments"]
        packed_W_M = torch.stack([p.wire["codes"] for p in payloads])
        scalers_W_N = torch.stack([p.wire["scaler"].float() for p in payloads]).index_select(1, segments.ids)
        if out.dtype == torch.float32 and out.is_contiguous():
            ternary_decode_accumulate(
                packed_W_M, scalers_W_N, segments.numel, bucket_size=1, out=out.view(-1)
            )
            return out
        out.view(-1).copy_(ternary_decode_accumulate(packed_W_M, scalers_W_N, segments.numel, bucket_size=1))
        return out

    def decode_sum_segments(
        self, code_sum: Tensor, scalers_S: Tensor, segments: Segments, out: Tensor
    ) -> Tensor:
        """``s * code_sum`` per tensor into ``out`` (the summed codes of ranks that shared ``scalers_S``)."""
        torch.mul(code_sum.to(torch.float32), segments.expand(scalers_S.float()), out=out.view(-1))
        return out
