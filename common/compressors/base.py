"""The compressor contract: payloads that hold exactly what crosses the wire.

A :class:`Compressor` turns a tensor into a :class:`Payload` and back. ``payload.wire`` holds the
tensors that really cross the wire (bit-packed where a method is sub-byte); everything else a
receiver needs (shape, dtype, indices every rank can regenerate from the shared generator) stays in
``payload.local`` and is never counted. ``payload.num_bits`` is computed from the wire tensors
themselves, so a compressor cannot claim fewer bits than it sends.

Invariant the transports rely on: ``local`` is identical on every rank for the same tensor at the
same step (it depends only on shape, dtype and the shared generator). Anything rank-specific must be
on the wire.

Randomness comes only from the two generators in :class:`CompressorRNG`: ``shared`` (same seed and
same call sequence on every rank, e.g. random-k indices that all ranks must agree on) and ``local``
(seeded per rank, e.g. stochastic rounding). The global torch RNG is never touched.
"""

from __future__ import annotations

import difflib
import hashlib
import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor

from .segments import SegmentDraws, Segments


@dataclass
class Payload:
    """A compressed tensor: ``wire`` crosses the network, ``local`` never does."""

    wire: dict[str, Tensor]
    shape: torch.Size
    dtype: torch.dtype
    local: dict[str, Any] = field(default_factory=dict)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def num_bits(self) -> int:
        """Bits on the wire, counted from the wire tensors' storage (numel x element size x 8)."""
        return sum(t.numel() * t.element_size() * 8 for t in self.wire.values())

    def with_wire(self, wire: dict[str, Tensor]) -> Payload:
        """The same payload structure around other wire tensors (e.g. another rank's, or a sum)."""
        return Payload(wire=wire, shape=self.shape, dtype=self.dtype, local=self.local)


def _key_seed(text: str) -> int:
    """A 63-bit generator seed from ``text``, the same in every process (Python's hash() is not)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


class CompressorRNG:
    """The two explicit generators a compressor may draw from.

    ``shared`` must produce the same stream on every rank: it is seeded with the same ``seed`` on
    all ranks and every rank makes the same calls in the same order. ``local`` is seeded with
    ``seed`` and the rank, so stochastic rounding is independent across workers. GradientSync
    restarts both before every compression from the tensor's name and how many times it was
    compressed (:meth:`reseed`), so draws are keyed by parameter: the same whatever order DDP's
    buckets arrive in, and a resume needs only those counts.
    """

    def __init__(self, seed: int, rank: int, device: torch.device | str = "cpu") -> None:
        device = torch.device(device)
        self.seed, self.rank = seed, rank
        self.shared = torch.Generator(device=device)
        self.shared.manual_seed(seed)
        self.local = torch.Generator(device=device)
        # A large odd stride keeps (seed, rank) pairs from colliding for small seeds.
        self.local.manual_seed((seed * 1_000_003 + 7919 * (rank + 1)) % (2**63))
        self._scalar = torch.empty((), dtype=torch.int64, device=device)  # scratch for shared_below

    def shared_below(self, n: int) -> int:
        """A uniform integer in [0, n) from the shared generator: the stream ``torch.randint(n,
        (1,))`` draws, into a reused scalar (no allocation per call: random block draws one per
        tensor, and at 10^5 entries the allocation was a measurable part of its cost)."""
        return int(self._scalar.random_(0, n, generator=self.shared))

    def reseed(self, key: str) -> None:
        """Restart both generators from ``key`` (e.g. a tensor's name and how many times it was
        compressed): draws then depend on the key alone, not on what was drawn before, so the order
        in which tensors are compressed (DDP's bucket layout, which it rebuilds after the first
        step) cannot change them. ``shared`` stays equal across ranks, ``local`` differs per rank."""
        self.shared.manual_seed(_key_seed(f"{self.seed}/shared/{key}"))
        self.local.manual_seed(_key_seed(f"{self.seed}/rank{self.rank}/{key}"))

    def state_dict(self) -> dict[str, Tensor]:
        return {"shared": self.shared.get_state(), "local": self.local.get_state()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.shared.set_state(state["shared"])
        self.local.set_state(state["local"])


@dataclass(frozen=True)
class Needs:
    """What a compressor needs from its transport beyond compress -> one collective -> decompress.

    The compressor declares it; GradientSync dispatches on it (never on the compressor's class or
    attributes). The default, nothing more, is every compressor but TernGrad.

    ``scaler_round``: ``"max"``: before compressing, the ranks agree on the largest of each
    tensor's scaler (:meth:`ScaledCodes.scaler`; one small max all-reduce), so that their integer
    codes may be summed (TernGrad's scaler sharing); ``None``: no round before compression.
    ``scaled_codes``: the payload is integer codes times one scaler per tensor (the
    :class:`ScaledCodes` interface): per tensor the transport all-gathers the packed codes or, with
    an agreed scaler, all-reduces the codes' integer sums, whichever sends fewer bits.
    ``dense_tensors``: some tensors are sent uncompressed (:meth:`Compressor.keeps_fp32`), summed in
    one dense fp32 all-reduce beside the codes.
    ``low_rank``: two rounds with an orthogonalization between them and state kept per tensor
    (PowerSGD's P then Q, its warm-started Q): GradientSync's low-rank route
    (:mod:`common.comm.routes.low_rank`) runs the method, the compressor gives its arithmetic.
    """

    scaler_round: str | None = None
    scaled_codes: bool = False
    dense_tensors: bool = False
    low_rank: bool = False

    def __post_init__(self) -> None:
        if self.scaler_round not in SCALER_ROUNDS:
            raise ValueError(f"unknown scaler_round {self.scaler_round!r}; valid: {SCALER_ROUNDS}")
        if (self.scaler_round or self.dense_tensors) and not self.scaled_codes:
            raise ValueError(
                "scaler_round and dense_tensors are rounds of the scaled-codes route: declare scaled_codes=True"
            )
        if self.low_rank and self.scaled_codes:
            raise ValueError("low_rank and scaled_codes are two different routes: declare one")


SCALER_ROUNDS = (None, "max")


class Compressor(ABC):
    """Stateless, device-agnostic compressor.

    Subclasses set three class attributes: ``name`` (registry key), ``linear`` (payload wire
    tensors of several ranks may be summed elementwise by an all-reduce and then decompressed as
    one) and ``unbiased`` (E[decompress(compress(x))] == x). Wire tensors are 1-D. What the
    transport must do beyond one collective is declared in ``needs`` (:class:`Needs`).
    """

    name: ClassVar[str]
    linear: bool
    unbiased: bool
    #: Every rank's payload for a tensor of a given shape has the same wire sizes (e.g. top-k at a
    #: fixed density), so an all-gather needs no preliminary exchange of sizes.
    fixed_size: ClassVar[bool] = False
    needs: Needs = Needs()
    #: Each entry is compressed on its own (a cast, or nothing): compressing a bucket's tensors one by
    #: one or the bucket as one flat tensor gives the same payload entries, so GradientSync compresses
    #: a bucket whole even with ``compress_per_tensor`` (one call per bucket, not one per tensor).
    elementwise: ClassVar[bool] = False
    #: Through an all-reduce, each rank divides its wire values by the world size before the sum
    #: and the sum is the mean (a cast: PyTorch's ``fp16_compress_hook`` does the same, and a
    #: half-precision sum of many ranks cannot overflow where the mean does not); otherwise the
    #: sum is decompressed and divided after.
    divides_on_wire: ClassVar[bool] = False
    #: Sparsifiers: the fraction of entries kept (DGC's warm-up and DEF-A's averager read it);
    #: None for compressors that send every entry.
    density: float | None = None
    #: Parameter or module names whose tensors are sent in fp32 (``needs.dense_tensors``).
    fp32_layers: tuple[str, ...] = ()

    def set_density(self, density: float) -> None:
        """Change a sparsifier's density between steps (DGC's warm-up), validated like a
        constructor's; an error for a compressor that sends every entry."""
        if self.density is None:
            raise ValueError(f"compressor {self.name!r} sends every entry: it has no density to set")
        self.density = check_density(density)

    def keeps_fp32(self, name: str, numel: int) -> bool:
        """Whether the tensor ``name`` (``numel`` entries) is sent uncompressed (``needs.dense_tensors``)."""
        return False

    @abstractmethod
    def compress(self, x: Tensor, rng: CompressorRNG) -> Payload: ...

    @abstractmethod
    def decompress(self, payload: Payload) -> Tensor: ...

    def decompress_into(self, payload: Payload, out: Tensor) -> Tensor:
        """Decompress into ``out`` (``payload.numel`` entries, any shape, may be cast); returns it.

        GradientSync's all-reduce route writes the mean straight into the gradient buffer this
        way: no fresh dense tensor per call (whose first touch costs more than zeroing a reused
        one at 10^7 entries). ``out`` may hold the wire tensors' own memory (a block of the
        gradient all-reduced in place): overrides read the wire before overwriting it. The default
        decompresses and copies, unless the decompression already is ``out`` (identity's wire).
        """
        check_out(payload, out)
        decoded = self.decompress(payload)
        if decoded.data_ptr() != out.data_ptr() or decoded.dtype != out.dtype:
            out.copy_(decoded.reshape(out.shape))
        return out

    def sparse_sent(self, payload: Payload) -> tuple[Tensor, Tensor] | None:
        """``(indices, values)`` where :meth:`decompress` is zero but ``values`` at the flat
        ``indices`` (no repeats), so that error feedback can update its residual without the dense
        decompression (:meth:`ErrorFeedback.update_sparse`); None for a dense payload."""
        return None

    def aggregate(self, payloads: Sequence[Payload]) -> Tensor:
        """Sum of the decompressed payloads of several ranks (all-gather transport)."""
        total = self.decompress(payloads[0]).clone()
        for payload in payloads[1:]:
            total += self.decompress(payload)
        return total

    def aggregate_into(self, payloads: Sequence[Payload], out: Tensor) -> Tensor:
        """:meth:`aggregate` written into ``out`` (``decompress_into``'s contract; GradientSync's
        all-gather route passes the bucket it was handed). The default sums, then copies (so a
        wire that aliases ``out`` is read first); sparse payloads scatter straight in."""
        check_out(payloads[0], out)
        out.copy_(self.aggregate(payloads).reshape(out.shape))
        return out

    # -- the fused path (common.compressors.segments): a bucket in a fixed number of launches ------

    def fuses(self) -> bool:
        """Whether :meth:`compress_segments` serves these options: a whole bucket compressed with
        each tensor's own semantics in a number of launches that does not depend on how many
        tensors the bucket holds, with no host read. False: GradientSync compresses per tensor."""
        return False

    def compress_segments(self, flat: Tensor, segments: Segments, draws: SegmentDraws) -> Payload:
        """The payload of the bucket ``flat`` whose tensors are ``segments``: what :meth:`compress`
        gives each tensor, for all of them at once (wire tensors of the whole bucket, per-tensor
        quantities as ``[S]`` tensors), its randomness from ``draws``. Only where :meth:`fuses`."""
        raise NotImplementedError(f"compressor {self.name!r} has no fused path (fuses() is False)")

    def decode_segments_into(self, payloads: Sequence[Payload], out: Tensor) -> Tensor:
        """The sum of the decoded bucket payloads (several ranks', or one summed by an all-reduce),
        written into ``out`` (the bucket's entries, any float dtype); returns ``out``."""
        raise NotImplementedError(f"compressor {self.name!r} has no fused path (fuses() is False)")

    def __repr__(self) -> str:
        params = [p for p in inspect.signature(type(self).__init__).parameters if p != "self"]
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in params if hasattr(self, k))
        return f"{type(self).__name__}({fields})"


def check_out(payload: Payload, out: Tensor) -> None:
    """``out`` must have the payload's entry count (decompress_into's contract)."""
    if out.numel() != payload.numel:
        raise ValueError(
            f"decompress_into: out has {out.numel()} entries, the payload's tensor {payload.numel} "
            f"(shape {tuple(payload.shape)})"
        )


def check_density(density: float) -> float:
    """Validate a sparsity knob: the kept fraction of entries, in (0, 1]."""
    if isinstance(density, bool) or not isinstance(density, int | float) or not 0.0 < density <= 1.0:
        raise ValueError(
            f"density must be a number in (0, 1] (the fraction of entries kept), got {density!r}"
        )
    return float(density)


def check_fused_rng(fused_rng: bool) -> bool:
    """Validate a stochastic compressor's ``fused_rng`` switch (noise drawn inside the kernel)."""
    if not isinstance(fused_rng, bool):
        raise ValueError(
            f"fused_rng must be true or false (draw the noise inside the quantizing kernel), got {fused_rng!r}"
        )
    return fused_rng


def check_fp32_layers(wanted: Sequence[str], names: Sequence[str], where: str) -> None:
    """Refuse a name of ``wanted`` (a compressor's ``fp32_layers``) that is neither one of the
    parameter ``names`` nor a module holding some (``layer1`` covers ``layer1.0.weight``); the
    error says ``where`` the names come from, the closest valid name and a few of them."""
    unknown = [n for n in wanted if not any(x == n or x.startswith(n + ".") for x in names)]
    if not unknown:
        return
    modules = {name.rsplit(".", i)[0] for name in names for i in range(1, name.count(".") + 1)}
    close = [m for n in unknown for m in difflib.get_close_matches(n, [*sorted(modules), *names], n=1)]
    shown = list(names) if len(names) <= 8 else [*names[:4], "...", *names[-2:]]
    top = list(dict.fromkeys(name.split(".")[0] for name in names if "." in name))
    raise ValueError(
        f"fp32_layers names no parameter or module {where}: {', '.join(unknown)}"
        + (f" (closest: {', '.join(close)})" if close else "")
        + "; a name is a parameter or a module holding some: "
        + (f"top-level modules {', '.join(top[:12])}{', ...' if len(top) > 12 else ''}; " if top else "")
        + f"{len(names)} parameters {', '.join(shown)}"
    )


def check_flag(name: str, value: bool) -> bool:
    """A constructor's switch, refused unless a bool (``bool("no")`` would be True)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def num_kept(numel: int, density: float) -> int:
    """Entries kept at ``density``: ceil(density * numel), at least one."""
    return max(1, min(numel, math.ceil(density * numel - 1e-9)))


def index_dtype(numel: int) -> torch.dtype:
    """int32 indices when they fit (half the bits of int64 on the wire)."""
    return torch.int32 if numel < 2**31 else torch.int64


class ScaledCodes(Protocol):
    """The interface of a compressor that declares ``needs.scaled_codes`` (TernGrad)."""

    name: str
    #: Per tensor: "allgather" (packed codes), "allreduce" (integer code sums, agreed scalers
    #: only) or "auto" (the fewer bits at the world size).
    code_transport: str

    def scaler(self, x: Tensor) -> Tensor:
        """This rank's 0-dim float32 scaler of ``x`` (what the ``"max"`` round agrees on)."""
        ...

    def compress(
        self,
        x: Tensor,
        rng: CompressorRNG,
        scaler: Tensor | float | None = None,
        own: Tensor | None = None,
    ) -> Payload:
        """Codes of ``x`` at ``scaler`` (the agreed one; None: this rank's own); ``own``: this rank's
        :meth:`scaler` of ``x`` if already computed."""
        ...

    def codes(self, payload: Payload) -> Tensor:
        """The payload's integer codes, one per entry (what the integer all-reduce sums)."""
        ...

    def decode_sum(
        self,
        code_sum: Tensor,
        scaler: Tensor,
        shape: torch.Size,
        dtype: torch.dtype,
        out: Tensor | None = None,
    ) -> Tensor:
        """The sum over ranks from the summed codes and the agreed scaler (into ``out``, a
        contiguous fp32 tensor of as many entries, when given and ``dtype`` is float32)."""
        ...
