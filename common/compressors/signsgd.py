"""1-bit sign compression: EF-signSGD (Karimireddy et al., ICML 2019) and signSGD with majority vote
(Bernstein et al., ICML 2018).

For a tensor x of N entries, each entry's sign crosses the wire as one bit (``kernels.pack_bits``
layout, 1 = negative; an exact zero is sent as +, so every entry is one of two values):

- ``scaled=True`` (EF-signSGD's compressor, the default): ``C(x) = (||x||_1 / N) sign(x)``, the
  scale as one fp32 number beside the bits: ``8 ceil(N / 8) + 32`` bits. Biased; used with error
  feedback (``error_feedback=True``), whose residual keeps ``x - C(x)``. The workers' decoded
  tensors are averaged (``vote="mean"``): the all-gather of compressed gradients of the paper.
- ``scaled=False, vote="majority"`` (signSGD with majority vote): the bits only, ``8 ceil(N / 8)``;
  the result is ``sign(sum_w sign(x_w))`` entrywise, the majority's sign (0 where an even number of
  workers tie). :meth:`SignSGD.aggregate` returns W times that, so the mean the transport divides
  by W is the vote itself. No server: every rank all-gathers every rank's bits and votes.

Not linear (signs cannot be summed into signs), fixed size, no randomness.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import Tensor

from kernels import _native, pack_bits, unpack_bits
from kernels.pack_bits.reference import lookup_bytes

from .base import Compressor, CompressorRNG, Payload, check_out
from .segments import SegmentDraws, Segments

VOTES = ("mean", "majority")


def _native_fp32(x_N: Tensor) -> bool:
    return x_N.dtype == torch.float32 and x_N.device.type == "cpu" and _native.available()


@functools.cache
def _sign_table() -> Tensor:
    """int8 ``[256, 8]``: the eight signs (+1 for a 0 bit, -1 for a 1) coded in each byte (a row
    is gathered as one 8-byte word)."""
    bits = (torch.arange(256, dtype=torch.int32)[:, None] >> torch.arange(8, dtype=torch.int32)) & 1
    return (1 - 2 * bits).to(torch.int8).contiguous()


class SignSGD(Compressor):
    """One bit per entry (module docstring): ``scaled`` (EF-signSGD's l1 scale) and ``vote``
    (``"mean"`` of the workers' decoded tensors, or ``"majority"``: the sign of their sum)."""

    name = "signsgd"
    linear = False
    unbiased = False
    fixed_size = True

    def __init__(self, scaled: bool = True, vote: str = "mean") -> None:
        if not isinstance(scaled, bool):
            raise ValueError(f"scaled must be true or false, got {scaled!r}")
        if vote not in VOTES:
            raise ValueError(f"unknown vote {vote!r}; valid: mean (EF-signSGD), majority (signSGD's vote)")
        if vote == "majority" and scaled:
            raise ValueError("vote='majority' takes signs only (its result is a sign): set scaled=False")
        self.scaled = scaled
        self.vote = vote

    def compress(self, x: Tensor, rng: CompressorRNG) -> Payload:
        x_N = x.reshape(-1)
        if _native_fp32(x_N):  # one compiled pass for the comparison and the packing
            wire = {"signs": _native.sign_pack(x_N.contiguous())}
        else:
            wire = {"signs": pack_bits((x_N < 0).to(torch.uint8), 1)}
        if self.scaled:
            wire["scale"] = (
                x_N.float().abs().mean() if x_N.numel() else x_N.new_zeros((), dtype=torch.float32)
            ).reshape(1)
        return Payload(wire=wire, shape=x.shape, dtype=x.dtype)

    def _signs(self, payload: Payload) -> Tensor:
        """The payload's signs as float32 +1 / -1, flat. On a CPU one gather of eight signs per
        byte from a 256-row table (``kernels.pack_bits.reference.lookup_bytes``) and a cast: the
        same values as unpacking the bits and computing ``1 - 2 b`` in four passes."""
        packed = payload.wire["signs"]
        if packed.device.type == "cpu":
            return lookup_bytes(_sign_table(), packed)[: payload.numel].to(torch.float32)
        bits = unpack_bits(packed, 1, payload.numel)
        return 1.0 - 2.0 * bits.to(torch.float32)

    def _decoded_sum(
        self, payloads: Sequence[Payload], scaled: bool, out: Tensor | None = None
    ) -> Tensor | None:
        """The payloads' decodings (signs times scales where ``scaled``) summed in rank order by
        one compiled pass on a CPU (the same values as :meth:`decompress` and ``+``, each product a
        sign times a scale, exact), into ``out`` (fp32, contiguous) when given, else a fresh
        tensor; None where it does not apply (a GPU, another dtype)."""
        first = payloads[0].wire["signs"]
        if first.device.type != "cpu" or payloads[0].dtype != torch.float32 or not _native.available():
            return None
        packed_W_M = first[None] if len(payloads) == 1 else torch.stack([p.wire["signs"] for p in payloads])
        scales_W = torch.cat([p.wire["scale"].reshape(1).float() for p in payloads]) if scaled else None
        flat = out.view(-1) if out is not None else None
        return _native.sign_decode(packed_W_M.contiguous(), scales_W, payloads[0].numel, out=flat)

    def _into(self, payloads: Sequence[Payload], scaled: bool, out: Tensor) -> bool:
        """Whether the compiled pass decoded ``payloads`` straight into ``out`` (fp32, contiguous)."""
        if out.dtype != torch.float32 or not out.is_contiguous():
            return False
        return self._decoded_sum(payloads, scaled, out) is not None

    def decompress_into(self, payload: Payload, out: Tensor) -> Tensor:
        """:meth:`decompress` written into ``out`` by the compiled pass where it applies (no fresh
        bucket-sized tensor: error feedback's ``sent`` and the all-gather route's mean)."""
        check_out(payload, out)
        if not self._into([payload], self.scaled, out):
            out.copy_(self.decompress(payload).reshape(out.shape))
        return out

    def aggregate_into(self, payloads: Sequence[Payload], out: Tensor) -> Tensor:
        check_out(payloads[0], out)
        if self.vote == "mean" and self._into(payloads, self.scaled, out):
            return out
        out.copy_(self.aggregate(payloads).reshape(out.shape))
        return out

    def decompress(self, payload: Payload) -> Tensor:
        fast = self._decoded_sum([payload], self.scaled)
        if fast is not None:
            return fast.reshape(payload.shape)
        signs = self._signs(payload)
        if self.scaled:
            signs = signs.mul_(payload.wire["scale"])
        return signs.to(payload.dtype).reshape(payload.shape)

    def aggregate(self, payloads: Sequence[Payload]) -> Tensor:
        """``"mean"``: the sum of the decoded tensors. ``"majority"``: W sign(sum of the signs), so
        that the transport's mean (sum / W) is the majority vote."""
        fast = self._decoded_sum(payloads, self.scaled and self.vote == "mean")
        if fast is not None and self.vote == "mean":
            return fast.reshape(payloads[0].shape)
        if fast is not None:
            return torch.sign(fast).mul_(len(payloads)).reshape(payloads[0].shape)
        if self.vote == "mean":
            return super().aggregate(payloads)
        total = self._signs(payloads[0])
        for payload in payloads[1:]:
            total += self._signs(payload)
        first = payloads[0]
        return (torch.sign(total) * len(payloads)).to(first.dtype).reshape(first.shape)

    # -- the fused path: a whole bucket's signs, one l1 scale per tensor ---------------------------

    def fuses(self) -> bool:
        return True

    def compress_segments(self, flat: Tensor, segments: Segments, draws: SegmentDraws) -> Payload:
        """The bucket's signs packed together (``8 ceil(N / 8)`` bits) and, when ``scaled``, each
        tensor's ``||x||_1 / n`` as fp32 ``[S]`` (32 bits per tensor): the per-tensor payloads'
        content in one launch each. The scales are segmented means (their rounding may differ
        from a per-tensor ``mean()`` in the last bit); the signs are the same bits."""
        wire = {"signs": pack_bits((flat < 0).to(torch.uint8), 1)}
        if self.scaled:
            wire["scale"] = segments.reduce(flat.float().abs(), "mean")
        return Payload(wire=wire, shape=flat.shape, dtype=flat.dtype, local={"segments": segments})

    def decode_segments_into(self, payloads: Sequence[Payload], out: Tensor) -> Tensor:
        """``"mean"``: the sum of the decoded payloads (rank order, as :meth:`aggregate`);
        ``"majority"``: W times the sign of the summed signs."""
        segments: Segments = payloads[0].local["segments"]
        out_N = out.view(-1)
        total = None
        for payload in payloads:  # ranks
            signs = self._signs(payload)
            if self.scaled:
                signs = signs.mul_(segments.expand(payload.wire["scale"]))
            if self.vote == "mean":
                signs = signs.to(payload.dtype)
            total = signs if total is None else total.add_(signs)
        assert total is not None
        if self.vote == "majority":
            total = torch.sign(total).mul_(len(payloads))
        out_N.copy_(total)
        return out
