"""kernels._native: TernGrad's and QSGD's compiled CPU kernels against the reference.

The quantizers (the ``fused_rng`` path) draw their own noise (a counter hash); given the same numbers
from ``counter_uniform`` (torch ops), the reference must produce the same bytes, bit for bit, at sizes
around the kernels' staging chunk (8,192 codes) and byte boundaries, per tensor and per bucket. The
decoders must give the reference's fp32 sums bit for bit for any bytes, scalers and worker count,
the threshold selection the reference's buffers and count, and the momentum-correction update the
reference's u and v.
"""

from __future__ import annotations

import math

import pytest
import torch

from common.compressors.base import CompressorRNG
from common.compressors.qsgd import QSGD
from common.compressors.terngrad import TernGrad
from kernels import _native
from kernels._buckets import bucket_norms
from kernels.ef_update import ef_update
from kernels.ef_update.reference import ef_update as ef_update_ref
from kernels.masked_compact import masked_scatter
from kernels.masked_compact import reference as masked_compact_ref
from kernels.pack_bits import reference as pack_ref
from kernels.qsgd_quantize import qsgd_dequantize_accumulate, qsgd_quantize
from kernels.qsgd_quantize import reference as qsgd_ref
from kernels.ternarize import reference as ternarize_ref
from kernels.ternarize import scale_values, ternarize, ternary_decode_accumulate, ternary_values
from kernels.threshold_select import threshold_select
from kernels.threshold_select.reference import threshold_select as threshold_select_ref
from tests.kernels.helpers import assert_unbiased, global_rng_untouched

SIZES = (1, 7, 8191, 8192, 8193, 3 * 8192 + 5)
KEYS = (0x9E3779B9, 12345)


@pytest.fixture(autouse=True)
def native() -> None:
    if not _native.available():  # CI has a C compiler: a missing one is a failure there, not a skip
        pytest.fail(f"the compiled CPU kernels did not build: {_native.unavailable_reason()}")


def special_gradient(numel: int, gen: torch.Generator) -> torch.Tensor:
    g = torch.randn(numel, generator=gen)
    specials = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 50.0, -50.0])
    g[: min(numel, specials.numel())] = specials[:numel]
    return g


def caller_noise(numel: int, gen: torch.Generator) -> torch.Tensor:
    """torch.rand's numbers with its extremes and a value off its 24-bit grid in front."""
    noise = torch.rand(numel, generator=gen)
    extremes = torch.tensor([0.0, 1.0 - 2**-24, 0.5, 0.1])
    noise[: min(numel, 4)] = extremes[: min(numel, 4)]
    return noise


@pytest.mark.parametrize("numel", [0, *SIZES, 100_003])
def test_uniform_equals_torch_twin(numel: int) -> None:
    u = _native.uniform(numel, KEYS)
    assert torch.equal(u, _native.counter_uniform(numel, KEYS))
    if numel:
        assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
        assert bool((u * 2**24 == (u * 2**24).floor()).all())  # 24-bit grid, as torch.rand's


def test_uniform_is_uniform_and_keyed() -> None:
    u = _native.uniform(1_000_000, KEYS)
    # mean 1/2 and variance 1/12 within ~5 standard errors; a decile histogram within 2 % of flat
    assert abs(float(u.double().mean()) - 0.5) < 5 * (1 / 12) ** 0.5 / 1000
    assert abs(float(u.double().var()) - 1 / 12) < 5e-4
    counts = torch.histc(u, bins=10, min=0.0, max=1.0)
    assert float((counts / 100_000 - 1).abs().max()) < 0.02
    other = _native.uniform(1_000_000, (KEYS[0], KEYS[1] + 1))
    assert float(torch.corrcoef(torch.stack([u, other]))[0, 1]) == pytest.approx(0.0, abs=5e-3)
    assert not torch.equal(u[:100], _native.uniform(100, (KEYS[0] + 1, KEYS[1])))


@pytest.mark.parametrize(
    ("seed", "drawn", "numel"),
    # drawn: numbers taken before (where in its 624 words the engine stands); numel: across one and
    # several regenerations, ending on one, from a fresh generator and one that just regenerated
    [
        (0, 0, 0),
        (0, 0, 1),
        (0, 0, 624),
        (1234, 7, 3 * 624),
        (5, 623, 100_003),
        (9, 1, 624 * 7 + 1),
        (3, 624, 5000),
    ],
)
def test_torch_rand_is_torch_rand_and_leaves_its_state(
    seed: int, drawn: int, numel: int, monkeypatch
) -> None:
    monkeypatch.setattr(_native, "RAND_MIN_NUMEL", 0)  # the compiled engine at every size
    ours, theirs = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    torch.rand(drawn, generator=ours)
    torch.rand(drawn, generator=theirs)
    torch.randn(1, generator=ours)  # a cached normal sample rides along in the state
    torch.randn(1, generator=theirs)
    assert torch.equal(_native.torch_rand(numel, ours), torch.rand(numel, generator=theirs))
    assert torch.equal(ours.get_state(), theirs.get_state())
    # what each generator makes next is the same too
    assert torch.equal(torch.randn(3, generator=ours), torch.randn(3, generator=theirs))
    assert torch.equal(torch.rand(1000, generator=ours), torch.rand(1000, generator=theirs))


def test_noise_comes_from_the_compiled_engine_and_is_torch_rands(monkeypatch) -> None:
    calls: list[int] = []
    real = _native.torch_rand
    monkeypatch.setattr(_native, "torch_rand", lambda n, g: calls.append(n) or real(n, g))
    g = torch.randn(10_000, generator=torch.Generator().manual_seed(1))
    codes = ternarize(g, torch.tensor(3.0), generator=torch.Generator().manual_seed(2))
    assert calls == [10_000]
    noise = torch.rand(10_000, generator=torch.Generator().manual_seed(2))
    assert torch.equal(codes, ternarize(g, torch.tensor(3.0), noise=noise, backend="reference"))
    v = special_gradient(10_000, torch.Generator().manual_seed(3))
    for bits in (2, 4, 8):  # QSGD's default path: torch.rand's numbers into the compiled quantizer
        auto = qsgd_quantize(v, bits=bits, generator=torch.Generator().manual_seed(4))
        numbers = torch.rand(10_000, generator=torch.Generator().manual_seed(4))
        reference = qsgd_quantize(v, bits=bits, noise=numbers, backend="reference")
        assert torch.equal(auto[0], reference[0]) and torch.equal(auto[1], reference[1])
    # a state this does not know (another torch's layout): torch.rand itself, the same numbers
    monkeypatch.setattr(_native, "_MT_STATE_BYTES", -1)
    assert torch.equal(real(10_000, torch.Generator().manual_seed(2)), noise)


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("bucket_size", [None, 1, 333, 512])
def test_ternarize_bit_exact(numel: int, bucket_size: int | None, gen) -> None:
    g = special_gradient(numel, gen)
    size = numel if bucket_size is None else bucket_size
    scalers = torch.rand(math.ceil(numel / size), generator=gen) * 3
    scalers[0] = 0.0 if numel > 4 else scalers[0]  # a zero scaler: everything clipped to +-0
    noise = _native.counter_uniform(numel, KEYS)
    expected = ternarize_ref.ternarize(g, scalers, size, noise)
    assert torch.equal(_native.ternarize(g, scalers, size, KEYS), expected)
    given = caller_noise(numel, gen)  # the default path: the caller's (torch.rand's) numbers
    assert torch.equal(
        _native.ternarize(g, scalers, size, given), ternarize_ref.ternarize(g, scalers, size, given)
    )
    with pytest.raises(ValueError, match=rf"one number per element \({numel}\), got {numel + 1}"):
        _native.ternarize(g, scalers, size, torch.rand(numel + 1))


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("bucket_size", [1, 333, 512, 10**6])
def test_qsgd_bit_exact(numel: int, bits: int, bucket_size: int, gen) -> None:
    v = special_gradient(numel, gen)
    noise = _native.counter_uniform(numel, KEYS)
    for norm in ("l2", "max"):
        scales = qsgd_ref.level_scales(bucket_norms(v, bucket_size, norm), bits).contiguous()
        expected = pack_ref.pack_codes(qsgd_ref.qsgd_codes(v, scales, bucket_size, noise, bits), bits)
        assert torch.equal(_native.qsgd_quantize(v, scales, bits, bucket_size, KEYS), expected), norm
        given = caller_noise(numel, gen)
        expected = pack_ref.pack_codes(qsgd_ref.qsgd_codes(v, scales, bucket_size, given, bits), bits)
        assert torch.equal(_native.qsgd_quantize(v, scales, bits, bucket_size, given), expected), norm


def test_dispatch_draws_keys_from_the_generator(gen) -> None:
    g = torch.randn(10_000, generator=gen, dtype=torch.float64).to(torch.bfloat16)
    scaler = g.float().abs().max()
    twin = torch.Generator().set_state(gen.get_state())
    packed = ternarize(g, scaler, generator=gen, fused_rng=True)
    keys = _native.draw_keys(twin)
    assert torch.equal(
        packed,
        ternarize_ref.ternarize(
            g.float(), scaler.reshape(1), g.numel(), _native.counter_uniform(g.numel(), keys)
        ),
    )
    assert torch.equal(gen.get_state(), twin.get_state())  # two keys drawn, nothing else

    twin.set_state(gen.get_state())
    codes, norms = qsgd_quantize(g, bits=4, generator=gen, fused_rng=True, backend="native")
    keys = _native.draw_keys(twin)
    noise = _native.counter_uniform(g.numel(), keys)
    expected = qsgd_ref.qsgd_quantize(g.float(), 4, 512, "l2", noise)
    assert torch.equal(codes, expected[0]) and torch.equal(norms, expected[1])


def test_never_touches_the_global_rng(gen) -> None:
    g = torch.randn(5000, generator=gen)
    global_rng_untouched(lambda: ternarize(g, 1.0, generator=gen, fused_rng=True))
    global_rng_untouched(lambda: qsgd_quantize(g, generator=gen, fused_rng=True))


def test_fused_ternarize_is_unbiased(gen) -> None:
    g = torch.randn(64, generator=gen)
    s = float(g.abs().max())
    decoded = torch.stack(
        [
            ternarize_ref.byte_to_ternary(g.device)[
                ternarize(g, s, generator=gen, fused_rng=True).long()
            ].reshape(-1)[:64]
            * s
            for _ in range(4000)
        ]
    )
    assert_unbiased(decoded, g, torch.sqrt(g.abs() * (s - g.abs())))


def test_backend_errors(gen, monkeypatch) -> None:
    g = torch.randn(10, generator=gen)
    with pytest.raises(ValueError, match="fused_rng=True"):
        ternarize(g, 1.0, generator=gen, backend="native")
    with pytest.raises(ValueError, match="do not pass noise"):
        qsgd_quantize(g, noise=torch.rand(10, generator=gen), fused_rng=True, backend="native")
    with pytest.raises(ValueError, match="pass generator="):
        ternarize(g, 1.0, fused_rng=True, backend="native")
    with pytest.raises(ValueError, match="backend must be one of"):
        ternarize(g, 1.0, generator=gen, fused_rng=True, backend="c")
    monkeypatch.setattr(_native, "_load", lambda: "no C compiler: 'cc' is not on PATH (set CC to one)")
    with pytest.raises(RuntimeError, match="no C compiler"):
        qsgd_quantize(g, generator=gen, fused_rng=True, backend="native")
    # "auto" without the compiled kernels: the reference, which ignores fused_rng (torch.rand's stream)
    twin = torch.Generator().set_state(gen.get_state())
    assert torch.equal(
        ternarize(g, 1.0, generator=gen, fused_rng=True),
        ternarize_ref.ternarize(g, torch.ones(1), 10, torch.rand(10, generator=twin)),
    )


def test_missing_compiler_is_named(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("THINWIRE_CACHE", str(tmp_path))
    _native._load.cache_clear()
    try:
        assert not _native.available()
        assert "no-such-cc" in (_native.unavailable_reason() or "")
    finally:
        monkeypatch.undo()
        _native._load.cache_clear()
    assert _native.available()


@pytest.mark.parametrize(
    "compressor", [TernGrad(fused_rng=True), QSGD(bits=4, fused_rng=True)], ids=["terngrad", "qsgd"]
)
def test_compressor_option_resumes_bit_exact(compressor) -> None:
    x = torch.randn(20_000, generator=torch.Generator().manual_seed(3))
    rng = CompressorRNG(seed=7, rank=0)
    state = rng.local.get_state()
    first = compressor.compress(x, rng)
    rng.local.set_state(state)
    again = compressor.compress(x, rng)
    assert all(torch.equal(first.wire[k], again.wire[k]) for k in first.wire)
    rng.local.set_state(state)
    plain = type(compressor)(**({"bits": 4} if isinstance(compressor, QSGD) else {})).compress(x, rng)
    assert not torch.equal(first.wire["codes"], plain.wire["codes"])  # another stream than torch.rand


@pytest.mark.parametrize("build", [TernGrad, QSGD])
def test_compressor_rejects_a_non_bool(build) -> None:
    with pytest.raises(ValueError, match="fused_rng must be true or false.*'yes'"):
        build(fused_rng="yes")


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("bucket_size", [None, 1, 333])
@pytest.mark.parametrize("workers", [1, 2, 3, 5])
def test_ternary_decode_bit_exact(numel: int, bucket_size: int | None, workers: int, gen) -> None:
    packed = torch.randint(0, 256, (workers, math.ceil(numel / 4)), generator=gen, dtype=torch.uint8)
    size = numel if bucket_size is None else bucket_size
    scalers = torch.rand(workers, math.ceil(numel / size), generator=gen) * 3
    scalers[0, 0] = 0.0  # a zero scaler decodes to +0.0 (0 * -1 = -0.0, plus the kernel's 0.0)
    expected = ternarize_ref.ternary_decode_accumulate(packed, scalers, numel, size)
    assert torch.equal(_native.ternary_decode(packed, scalers, numel, size), expected)
    assert not bool(torch.signbit(expected[expected == 0]).any())
    if bucket_size is None:  # one scaler shared by every worker: the reference's int8-sum route
        shared = scalers[:1, :1].expand(workers, 1).contiguous() + 0.5
        expected = ternarize_ref.ternary_decode_accumulate(packed, shared, numel, size)
        assert torch.equal(_native.ternary_decode(packed, shared, numel, size), expected)


# 4- and 8-bit codes decode through one loop up to 2^18 entries and another above (_native.c)
@pytest.mark.parametrize("numel", [*SIZES, 2**18, 2**18 + 1])
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_qsgd_decode_bit_exact(numel: int, bits: int, workers: int, gen) -> None:
    bucket_size = 333
    packed = torch.randint(0, 256, (workers, math.ceil(numel * bits / 8)), generator=gen, dtype=torch.uint8)
    norms = torch.rand(workers, math.ceil(numel / bucket_size), generator=gen) * 5
    norms[0, 0] = 0.0
    expected = qsgd_ref.qsgd_dequantize_accumulate(packed, norms, numel, bits, bucket_size)
    assert torch.equal(_native.qsgd_decode(packed, norms, numel, bits, bucket_size), expected)


def test_decoders_dispatch_to_native_on_cpu(gen, monkeypatch) -> None:
    packed = torch.randint(0, 256, (2, 250), generator=gen, dtype=torch.uint8)
    scalers = torch.rand(2, generator=gen)
    calls: list[str] = []
    real = _native.decode_fast
    monkeypatch.setattr(_native, "decode_fast", lambda k, *a, **kw: calls.append(k) or real(k, *a, **kw))
    auto = ternary_decode_accumulate(packed, scalers, 1000)
    assert calls == ["tw_ternary_decode"]
    assert torch.equal(auto, ternary_decode_accumulate(packed, scalers, 1000, backend="reference"))
    assert calls == ["tw_ternary_decode"]  # "reference" is the reference
    norms = torch.rand(2, 2, generator=gen)
    assert torch.equal(
        qsgd_dequantize_accumulate(packed, norms, 1000, bits=2, bucket_size=512),
        qsgd_dequantize_accumulate(packed, norms, 1000, bits=2, bucket_size=512, backend="reference"),
    )
    assert calls == ["tw_ternary_decode", "tw_qsgd_decode"]


def _decoders(gen: torch.Generator, numel: int, workers: int):
    """(name, decode(packed, per_bucket, **kw), packed, per-bucket values) for QSGD 4-bit and TernGrad."""
    qsgd_packed = torch.randint(0, 256, (workers, math.ceil(numel / 2)), generator=gen, dtype=torch.uint8)
    tern_packed = torch.randint(0, 256, (workers, math.ceil(numel / 4)), generator=gen, dtype=torch.uint8)
    norms = torch.rand(workers, math.ceil(numel / 100), generator=gen) * 5
    scalers = torch.rand(workers, generator=gen) * 3

    def qsgd(packed, units, **kw):
        return qsgd_dequantize_accumulate(packed, units, numel, bits=4, bucket_size=100, **kw)

    def tern(packed, units, **kw):
        return ternary_decode_accumulate(packed, units, numel, **kw)

    return [("qsgd", qsgd, qsgd_packed, norms), ("terngrad", tern, tern_packed, scalers)]


@pytest.mark.parametrize("workers", [1, 3])
def test_decoders_write_into_out(workers: int, gen) -> None:
    """``out=``: the same bits as a fresh decode, written into ``out`` (any shape) and returned;
    on every route (the fast path's common case; a non-contiguous or fp16 input, which the checked
    path converts; the reference backend)."""
    numel = 1000
    for name, decode, packed, units in _decoders(gen, numel, workers):
        expected = decode(packed, units, backend="reference")
        variants = {
            "fast": (packed, units),
            "strided codes": (torch.stack([packed, packed], -1)[..., 0], units),
            "fp16 units": (packed, units.half()),
        }
        for what, (p, u) in variants.items():
            want = (
                expected
                if what != "fp16 units"
                else decode(packed, units.half().float(), backend="reference")
            )
            for backend in ("auto", "reference"):
                out = torch.full((10, 100), float("nan"))
                assert decode(p, u, backend=backend, out=out) is out, (name, what, backend)
                assert torch.equal(out.reshape(-1), want), (name, what, backend)
            assert torch.equal(decode(p, u), want), (name, what)


def test_decoders_refuse_a_bad_out_and_bad_sizes_with_their_messages(gen) -> None:
    for _name, decode, packed, units in _decoders(gen, 1000, 2):
        for out in (torch.empty(999), torch.empty(1000, dtype=torch.float64), torch.empty(2000)[::2]):
            with pytest.raises(
                ValueError, match="out must be a contiguous float32 tensor of 1000 entries on cpu"
            ):
                decode(packed, units, out=out)
        with pytest.raises(ValueError, match="bytes per worker, got 7"):
            decode(packed[:, :7], units)
        with pytest.raises(ValueError, match="per worker|per row"):
            decode(packed, units[:1])


@pytest.mark.parametrize("numel", [1, 100, 100_003])
def test_masked_scatter_native_equals_index_copy(numel: int, gen) -> None:
    """The compiled scatter (CPU, fp32, int32 indices) writes the reference's bits (-0, NaN and
    infinities kept) and leaves the rest of ``out`` as it was."""
    k = max(1, numel // 100)
    indices = torch.randperm(numel, generator=gen)[:k].to(torch.int32)
    values = torch.randn(k, generator=gen)
    values[: min(k, 4)] = torch.tensor([-0.0, float("nan"), float("inf"), -float("inf")])[: min(k, 4)]
    dirty = torch.randn(numel, generator=gen)
    expected = dirty.clone()
    masked_compact_ref.masked_scatter(values, indices, expected)
    out = dirty.clone()
    assert masked_scatter(values, indices, out) is out
    assert torch.equal(out.view(torch.int32), expected.view(torch.int32))  # bit for bit, NaN included
    # the checked path's forms: int64 indices, strided values (compiled where it can), a bool mask
    order = torch.argsort(indices)
    mask = torch.zeros(numel, dtype=torch.bool)
    mask[indices.long()] = True
    for idx, vals in (
        (indices.long(), values),
        (indices, torch.stack([values, values], 1)[:, 0]),
        (mask, values[order]),
    ):
        out = dirty.clone()
        assert masked_scatter(vals, idx, out) is out
        assert torch.equal(out.view(torch.int32), expected.view(torch.int32))


def test_masked_scatter_native_refuses_an_index_out_of_range_and_writes_nothing(gen) -> None:
    out = torch.zeros(10)
    for bad in (10, -1):
        indices = torch.tensor([1, bad, 3], dtype=torch.int32)
        with pytest.raises(IndexError, match=rf"index {bad} \(position 1\) is out of bounds for 10 entries"):
            masked_scatter(torch.ones(3), indices, out)
        assert torch.equal(out, torch.zeros(10))


@pytest.mark.parametrize("numel", [0, *SIZES])
@pytest.mark.parametrize("capacity", [0, 3, 50, 10**5])
def test_threshold_select_bit_exact(numel: int, capacity: int, gen) -> None:
    x = special_gradient(numel, gen)
    x[6::1000] = float("nan")  # never selected, in either
    # 3.3: about 0.1 % selected (DGC's density), so most blocks of 64 are skipped whole
    for threshold in (0.0, 1.5, 3.3, 1e9):
        t = torch.tensor(threshold)
        expected = threshold_select_ref(x, t, capacity)
        got = _native.threshold_select(x, threshold, capacity)
        assert all(torch.equal(a, b) for a, b in zip(got, expected)), (threshold, capacity)


def test_threshold_select_dispatch(gen, monkeypatch) -> None:
    x = torch.randn(20_000, generator=gen)
    calls: list[int] = []
    real = _native.threshold_select
    monkeypatch.setattr(_native, "threshold_select", lambda *a: calls.append(1) or real(*a))
    auto = threshold_select(x, 2.0, 2000)
    reference = threshold_select(x, 2.0, 2000, backend="reference")
    assert calls == [1] and all(torch.equal(a, b) for a, b in zip(auto, reference))
    threshold_select(x.to(torch.bfloat16), 2.0, 2000)  # bf16: the reference (the kernel reads fp32)
    assert calls == [1]


@pytest.mark.parametrize("numel", [0, *SIZES])
@pytest.mark.parametrize("momentum", [0.9, 0.0, 1.0 / 3.0])
def test_ef_update_bit_exact(numel: int, momentum: float, gen) -> None:
    u, v, g = (special_gradient(numel, gen) for _ in range(3))
    u_ref, v_ref = u.clone(), v.clone()
    ef_update_ref(u_ref, v_ref, g, momentum, None, None)
    _native.ef_update(u, v, g, momentum)
    assert torch.equal(u, u_ref) and torch.equal(v, v_ref)


def test_ef_update_dispatch_with_masking(gen) -> None:
    u, v, g = (torch.randn(5000, generator=gen) for _ in range(3))
    sent = torch.tensor([3, 17, 4999, 17], dtype=torch.int32)
    u_ref, v_ref = u.clone(), v.clone()
    ef_update(u_ref, v_ref, g, 0.9, sent, backend="reference")
    ef_update(u, v, g, 0.9, sent)  # "auto": the compiled update, then the reference's masking
    assert torch.equal(u, u_ref) and torch.equal(v, v_ref)
    assert float(u[17]) == 0.0 and float(v[4999]) == 0.0
    with pytest.raises(ValueError, match="one size"):
        _native.ef_update(u, v, g[:10].contiguous(), 0.9)


@pytest.mark.parametrize("numel", [0, *SIZES])
def test_ternary_values_and_scale_values_bit_exact(numel: int, gen) -> None:
    """TernGrad's integer route compiled: a payload's int8 values (random bytes, the unused code 3
    included) and a code sum's decode (int8 and int16, a zero, a NaN and an ordinary scaler)
    equal the reference's, with and without ``out``."""
    packed = torch.randint(0, 256, (math.ceil(numel / 4),), generator=gen, dtype=torch.uint8)
    expected = ternarize_ref.ternary_values(packed, numel)
    assert expected.dtype == torch.int8
    assert torch.equal(ternary_values(packed, numel), expected)
    assert torch.equal(ternary_values(packed, numel, backend="native"), expected)
    for dtype in (torch.int8, torch.int16):
        code_sum = (expected.to(dtype) * 3 - 1).reshape(-1, 1) if numel else expected.to(dtype)
        for scaler in (0.37, 0.0, float("nan")):
            want = ternarize_ref.scale_values(code_sum, torch.tensor(scaler))
            got = scale_values(code_sum, scaler)
            assert got.shape == code_sum.shape and got.dtype == torch.float32
            assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (dtype, scaler)
            out = torch.full((numel,), 5.0)
            assert scale_values(code_sum, torch.tensor(scaler), out=out) is out
            assert torch.equal(out.view(torch.int32), want.reshape(-1).view(torch.int32))


def test_ternary_values_and_scale_values_refuse_bad_input() -> None:
    with pytest.raises(ValueError, match=r"10 ternary codes need uint8 \[3\], got torch.uint8 \(2,\)"):
        ternary_values(torch.zeros(2, dtype=torch.uint8), 10)
    with pytest.raises(ValueError, match="backend must be 'auto', 'reference' or 'native'.*'triton'"):
        ternary_values(torch.zeros(3, dtype=torch.uint8), 10, backend="triton")
    with pytest.raises(ValueError, match="values must be an integer tensor.*torch.float32"):
        scale_values(torch.zeros(3), 1.0)
    with pytest.raises(ValueError, match="backend='native' takes int8 or int16 values, got torch.int32"):
        scale_values(torch.zeros(3, dtype=torch.int32), 1.0, backend="native")
    with pytest.raises(ValueError, match="out must be a contiguous float32 tensor of 3 entries"):
        scale_values(torch.zeros(3, dtype=torch.int8), 1.0, out=torch.empty(4))


@pytest.mark.parametrize("numel", [0, *SIZES])
@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_ef_update_copies_the_new_v_out_in_the_same_pass(numel: int, backend: str, gen) -> None:
    """``v_out`` (error feedback's compensated copy): the new ``v`` bit for bit, ``u`` and ``v``
    as without it; refused with masking, of another size or dtype, or sharing ``v``'s memory."""
    u, v, g = (special_gradient(numel, gen) for _ in range(3))
    u_ref, v_ref = u.clone(), v.clone()
    ef_update_ref(u_ref, v_ref, g, 0.9, None, None)
    out = torch.full_like(v, float("nan"))
    ef_update(u, v, g, 0.9, backend=backend, v_out=out)
    assert torch.equal(u, u_ref) and torch.equal(v, v_ref) and torch.equal(out, v_ref)
    if numel < 8:
        return
    for bad, message in (
        ({"v_out": out[1:]}, "v_out must be a contiguous float32 tensor of u's"),
        ({"v_out": out.double()}, "v_out must be a contiguous float32 tensor of u's"),
        ({"v_out": v}, "must not share memory"),
        ({"v_out": out, "sent_indices": torch.tensor([1])}, "pass no sent_indices with it"),
    ):
        with pytest.raises(ValueError, match=message):
            ef_update(u, v, g, 0.9, **{"backend": backend, **bad})


@pytest.mark.parametrize("numel", [1, 7, 4097])
def test_sign_decode_into_a_dirty_buffer_equals_a_fresh_one(numel: int) -> None:
    """What error feedback's reused ``sent`` buffer and the all-gather route's bucket receive."""
    g = torch.Generator().manual_seed(numel)
    packed = torch.randint(0, 256, (3, -(-numel // 8)), dtype=torch.uint8, generator=g)
    scales = torch.rand(3, generator=g)
    fresh = _native.sign_decode(packed, scales, numel)
    out = torch.full((numel,), float("nan"))
    assert _native.sign_decode(packed, scales, numel, out=out) is out
    assert torch.equal(out, fresh)
    with pytest.raises(
        ValueError, match=rf"out must be a contiguous fp32 CPU tensor of {numel} entries, got torch.float64"
    ):
        _native.sign_decode(packed, scales, numel, out=torch.empty(numel, dtype=torch.float64))
    if numel == 1:
        return  # one entry: every view of it is contiguous
    with pytest.raises(ValueError, match=r"contiguous: False"):
        _native.sign_decode(packed, scales, numel, out=torch.empty(2 * numel)[::2])
