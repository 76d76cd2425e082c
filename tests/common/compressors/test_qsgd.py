"""QSGD compressor: unbiasedness, the Lemma 3.1 variance bound, both wire encodings (fixed-width and
Elias omega), bits on the wire, all-gather aggregation on real gloo ranks, option errors."""

from __future__ import annotations

import math

import pytest
import torch

from common.comm import GradientSync
from common.compressors import QSGD, CompressorRNG, build_compressor
from common.compressors.elias import elias_omega_decode, elias_omega_encode, omega_words
from kernels import unpack_bits
from tests.distributed import run_ranks


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _omega(n: int) -> str:
    """Elias omega code of n >= 1, straight from the definition (Elias 1975)."""
    code = "0"
    while n > 1:
        code = format(n, "b") + code
        n = n.bit_length() - 1
    return code


def _bit_string(stream: torch.Tensor) -> str:
    return "".join(format(b, "08b") for b in stream.tolist())


def _exact_variance(v: torch.Tensor, bucket_size: int, s: int, norm: str) -> torch.Tensor:
    """E(Q(v)_i - v_i)^2 as [B, D]: (n_b / s)^2 p_i (1 - p_i) with p_i = frac(s |v_i| / n_b)."""
    v_B_D = v.double().view(-1, bucket_size)
    n_B = v_B_D.norm(dim=1) if norm == "l2" else v_B_D.abs().amax(dim=1)
    x = s * v_B_D.abs() / n_B[:, None]
    p = x - x.floor()
    return (n_B[:, None] / s) ** 2 * p * (1 - p)


# ------------------------------------------------------------------------------- the quantizer
@pytest.mark.parametrize("norm", ["l2", "max"])
@pytest.mark.parametrize("bits", [2, 4])
def test_unbiased(norm, bits):
    x = _randn(64, seed=bits)
    draws = 4000
    comp = QSGD(bits=bits, bucket_size=64, norm=norm)
    assert comp.unbiased and not comp.linear
    # each repeat of x is one bucket with the same norm: 4000 independent quantizations in one call
    out = comp.decompress(comp.compress(x.repeat(draws), CompressorRNG(seed=0, rank=0)))
    mean = out.view(draws, 64).double().mean(0)
    std_err = (_exact_variance(x, 64, comp.num_levels, norm).reshape(-1) / draws).sqrt()
    assert torch.all((mean - x.double()).abs() <= 5 * std_err + 1e-6)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("bucket_size", [16, 512])
@pytest.mark.parametrize("kind", ["gaussian", "constant_magnitude"])
def test_variance_within_lemma_3_1_bound(bits, bucket_size, kind):
    """l2 norm: E||Q(v_b) - v_b||^2 <= min(n/s^2, sqrt(n)/s) ||v_b||^2 per bucket (n = bucket size).

    Constant magnitudes with s = 1 come within a factor (1 - 1/sqrt(n)) of the bound: the check has teeth.
    """
    num_buckets, draws = 4, 300
    v = _randn(num_buckets * bucket_size, seed=bucket_size + bits)
    if kind == "constant_magnitude":
        v = v.sign()
    comp = QSGD(bits=bits, bucket_size=bucket_size)
    s = comp.num_levels
    # one call quantizes all draws: each draw is num_buckets whole buckets of the same v
    out = comp.decompress(comp.compress(v.repeat(draws), CompressorRNG(seed=1, rank=0)))
    err_R_B = (out.double() - v.double().repeat(draws)).view(draws, num_buckets, bucket_size).pow(2).sum(2)
    empirical_B = err_R_B.mean(0)
    exact_B = _exact_variance(v, bucket_size, s, "l2").sum(1)
    norm2_B = v.double().view(num_buckets, bucket_size).pow(2).sum(1)
    bound_B = min(bucket_size / s**2, math.sqrt(bucket_size) / s) * norm2_B
    assert torch.all(exact_B <= bound_B)
    std_err_B = err_R_B.std(0) / math.sqrt(draws)
    assert torch.all((empirical_B - exact_B).abs() <= 5 * std_err_B + 1e-9)
    assert torch.all(empirical_B <= bound_B + 5 * std_err_B)
    if kind == "constant_magnitude" and bits == 2:
        assert torch.all(exact_B >= (1 - 1.01 / math.sqrt(bucket_size)) * bound_B)


@pytest.mark.parametrize("encoding", ["fixed", "elias"])
@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((1,), torch.float32), ((6, 7), torch.float16), ((3, 5, 7), torch.bfloat16), ((1030,), torch.float64)],
)
def test_round_trip_shape_dtype_and_levels(encoding, shape, dtype):
    x = _randn(*shape, seed=5).to(dtype)
    comp = QSGD(bits=4, bucket_size=100, norm="max", encoding=encoding)
    payload = comp.compress(x, CompressorRNG(seed=2, rank=0))
    out = comp.decompress(payload)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert payload.local == {"numel": x.numel()}
    assert all(t.dim() == 1 for t in payload.wire.values())
    # every value is a whole number of levels n_b / s of its bucket, at most s, with x's sign
    flat, x32 = out.reshape(-1).float(), x.reshape(-1).float()
    units = (payload.wire["norms"] / comp.num_levels).repeat_interleave(100)[: x.numel()]
    levels = flat / units
    tolerance = 2e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-4
    assert torch.allclose(levels, levels.round(), atol=tolerance * comp.num_levels)
    assert levels.abs().max() <= comp.num_levels + tolerance
    assert torch.all(flat * x32 >= 0)


def test_zero_tensor_and_zero_bucket():
    x = torch.zeros(300)
    x[200:] = _randn(100)
    for encoding in ("fixed", "elias"):
        comp = QSGD(bits=8, bucket_size=100, encoding=encoding)
        out = comp.decompress(comp.compress(x, CompressorRNG(0, 0)))
        assert torch.all(out[:200] == 0) and torch.any(out[200:] != 0)
        zeros = comp.compress(torch.zeros(5, 5), CompressorRNG(0, 0))
        assert torch.equal(comp.decompress(zeros), torch.zeros(5, 5))
    empty = QSGD(encoding="elias").compress(torch.zeros(10), CompressorRNG(0, 0))
    assert empty.wire["stream"].numel() == 0 and empty.num_bits == 32


def test_randomness_only_from_the_local_generator():
    x = _randn(4097)
    for encoding in ("fixed", "elias"):
        comp = QSGD(bits=2, encoding=encoding)
        before = torch.random.get_rng_state()
        p1 = comp.compress(x, CompressorRNG(seed=3, rank=1))
        p2 = comp.compress(x, CompressorRNG(seed=3, rank=1))
        p3 = comp.compress(x, CompressorRNG(seed=3, rank=2))
        assert torch.equal(torch.random.get_rng_state(), before)
        key = "codes" if encoding == "fixed" else "stream"
        assert torch.equal(p1.wire[key], p2.wire[key]) and not torch.equal(p1.wire[key], p3.wire[key])
        assert torch.equal(p1.wire["norms"], p3.wire["norms"])


# --------------------------------------------------------------------------------- bits on wire
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("numel", [1, 7, 511, 512, 513, 4097])
@pytest.mark.parametrize("bucket_size", [100, 512])
def test_fixed_encoding_bits(bits, numel, bucket_size):
    comp = QSGD(bits=bits, bucket_size=bucket_size)
    assert comp.fixed_size and not QSGD(encoding="elias").fixed_size
    payload = comp.compress(_randn(numel, seed=numel), CompressorRNG(0, 0))
    assert list(payload.wire) == ["norms", "codes"]
    assert payload.wire["codes"].dtype == torch.uint8 and payload.wire["norms"].dtype == torch.float32
    assert payload.num_bits == 8 * math.ceil(numel * bits / 8) + 32 * math.ceil(numel / bucket_size)


# ------------------------------------------------------------------------------- Elias omega
KNOWN_CODES = {
    1: "0",
    2: "100",
    3: "110",
    4: "101000",
    5: "101010",
    7: "101110",
    8: "1110000",
    15: "1111110",
    16: "10100100000",
    17: "10100100010",
    100: "1011011001000",
}


@pytest.mark.parametrize(("value", "code"), KNOWN_CODES.items())
def test_elias_omega_codes_of_small_integers(value, code):
    assert _omega(value) == code  # the test's own reference agrees with the textbook table
    stream, nbits = elias_omega_encode([value])
    assert nbits == len(code) and stream.dtype == torch.uint8 and stream.numel() == math.ceil(nbits / 8)
    bits = _bit_string(stream)
    assert bits[:nbits] == code and set(bits[nbits:]) <= {"1"}  # padded with ones
    assert elias_omega_decode(stream).tolist() == [value]


def test_elias_omega_matches_the_definition_on_many_values():
    g = torch.Generator().manual_seed(0)
    # magnitudes spread over 1 .. 2**31 - 1, around the table edge 2**16 and the powers of two
    values = (
        torch.randint(1, 2**31, (3000,), generator=g) >> torch.randint(0, 31, (3000,), generator=g)
    ).clamp(min=1)
    edges = torch.tensor([2**k + d for k in range(1, 31) for d in (-1, 0, 1)] + [2**31 - 1])
    values = torch.cat([values, edges])
    words, lengths = omega_words(values)
    expected = [_omega(v) for v in values.tolist()]
    assert lengths.tolist() == [len(c) for c in expected]
    assert [format(w, "b").zfill(n) for w, n in zip(words.tolist(), lengths.tolist())] == expected
    stream, nbits = elias_omega_encode(values)
    assert _bit_string(stream)[:nbits] == "".join(expected)


@pytest.mark.parametrize("seed", range(4))
def test_elias_omega_round_trip_on_sparse_integer_arrays(seed):
    g = torch.Generator().manual_seed(seed)
    numel = 20_000
    # a sparse array: its gaps and levels are what QSGD codes
    levels = torch.randint(1, 128, (numel,), generator=g) * (
        torch.rand(numel, generator=g) < 0.05 * (seed + 1)
    )
    indices = torch.nonzero(levels).reshape(-1)
    gaps = torch.diff(indices, prepend=torch.tensor([-1]))
    values = torch.stack([gaps, levels[indices]], 1).reshape(-1)
    stream, nbits = elias_omega_encode(values)
    assert nbits == sum(len(_omega(v)) for v in values.tolist())
    assert 8 * stream.numel() - 8 < nbits <= 8 * stream.numel()
    decoded = elias_omega_decode(stream)
    assert torch.equal(decoded, values)
    assert torch.equal(torch.cumsum(decoded[0::2], 0) - 1, indices)
    assert torch.equal(elias_omega_decode(stream, nbits), values)


def test_elias_omega_rejects_bad_input():
    for bad in (0, -3, 2**31):
        with pytest.raises(ValueError, match=f"integers in \\[1, 2\\*\\*31\\), got {bad}"):
            elias_omega_encode([5, bad])
    stream, nbits = elias_omega_encode([3, 4, 5])
    with pytest.raises(ValueError, match="codes end at bit 9, not at nbits=14"):
        elias_omega_decode(stream, nbits - 1)
    with pytest.raises(ValueError, match="nbits must be in"):
        elias_omega_decode(stream, 8 * stream.numel() + 1)
    with pytest.raises(ValueError, match="not a complete Elias omega stream"):
        elias_omega_decode(torch.cat([stream, torch.tensor([0xFF], dtype=torch.uint8)]))


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("norm", ["l2", "max"])
@pytest.mark.parametrize("numel", [1, 7, 1023, 4097])
def test_elias_and_fixed_encodings_carry_the_same_codes(bits, norm, numel):
    x = _randn(numel, seed=numel) * 3
    fixed = QSGD(bits=bits, bucket_size=100, norm=norm)
    elias = QSGD(bits=bits, bucket_size=100, norm=norm, encoding="elias")
    p_fixed = fixed.compress(x, CompressorRNG(seed=4, rank=1))
    p_elias = elias.compress(x, CompressorRNG(seed=4, rank=1))
    assert list(p_elias.wire) == ["norms", "stream"] and p_elias.wire["stream"].dtype == torch.uint8
    assert torch.equal(p_fixed.wire["norms"], p_elias.wire["norms"])
    codes = unpack_bits(p_fixed.wire["codes"], bits, numel)
    assert torch.equal(elias.elias_decode(p_elias.wire["stream"], numel), codes)
    assert torch.equal(fixed.decompress(p_fixed), elias.decompress(p_elias))
    # the wire holds exactly the code: gap, sign bit, level per nonzero, rounded up to whole bytes
    levels = (codes & fixed.num_levels).long()
    indices = torch.nonzero(levels).reshape(-1)
    gaps = torch.diff(indices, prepend=torch.tensor([-1]))
    code_bits = sum(
        len(_omega(g)) + 1 + len(_omega(n)) for g, n in zip(gaps.tolist(), levels[indices].tolist())
    )
    assert p_elias.num_bits == 8 * math.ceil(code_bits / 8) + 32 * math.ceil(numel / 100)


def test_elias_is_smaller_than_fixed_at_low_bit_widths():
    x = _randn(65536)
    bits_per_entry = {}
    for bits in (2, 4, 8):
        for encoding in ("fixed", "elias"):
            payload = QSGD(bits=bits, encoding=encoding).compress(x, CompressorRNG(0, 0))
            bits_per_entry[bits, encoding] = payload.num_bits / x.numel()
    # Gaussian, bucket 512, l2: s = 1 keeps ~3.5% of the entries, s = 7 ~25%, s = 127 ~90%
    assert bits_per_entry[2, "elias"] < 0.6 and bits_per_entry[4, "elias"] < 2
    assert bits_per_entry[8, "elias"] < bits_per_entry[8, "fixed"] == 8 + 32 / 512


def test_aggregate_is_the_sum_of_decompressions():
    for encoding in ("fixed", "elias"):
        comp = QSGD(bits=4, bucket_size=64, encoding=encoding)
        payloads = [
            comp.compress(_randn(513, seed=i) * (i + 1), CompressorRNG(seed=2, rank=i)) for i in range(3)
        ]
        expected = sum(comp.decompress(p) for p in payloads)
        assert torch.allclose(comp.aggregate(payloads), expected, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------------ all-gather on gloo
SIZES = (1000, 37, 5, 2049)
WORLDS = (2, 4)


def _scenarios(rank: int, world: int) -> dict:
    """One spawn of 4 ranks serves both world sizes: the 2-rank runs use the subgroup {0, 1}."""
    out: dict = {}
    for size in WORLDS:
        group = None if size == world else torch.distributed.new_group(list(range(size)))  # all ranks call
        if rank < size:
            out[size] = _sync_and_reference(rank, size, group)
    return out


def _sync_and_reference(rank: int, world: int, group) -> dict:
    out: dict = {}
    for encoding in ("fixed", "elias"):
        options = {"bits": 4, "bucket_size": 128, "encoding": encoding}
        g = torch.Generator().manual_seed(7 + rank)
        grads = [(f"layer{i}.weight", torch.randn(n, generator=g) * (i + 1)) for i, n in enumerate(SIZES)]
        originals = [t.clone() for _, t in grads]
        sync = GradientSync(build_compressor("qsgd", **options), transport="allgather", seed=3, group=group)
        sync.sync(grads)
        out[encoding] = [t.clone() for _, t in grads]
        out[encoding + "_stats"] = sync.stats.state_dict()

        # The dense reference: each rank decompresses its own payloads (the same keyed draws),
        # the decompressions are all-gathered densely and averaged.
        comp = build_compressor("qsgd", **options)
        rng = CompressorRNG(3, rank)
        reference, wire_bits = [], []
        for (name, _), t in zip(grads, originals, strict=True):
            rng.reseed(f"{name}#0")  # GradientSync keys each tensor's draws by name and count
            payload = comp.compress(t, rng)
            mine = comp.decompress(payload)
            parts = [torch.zeros_like(mine) for _ in range(world)]
            torch.distributed.all_gather(parts, mine, group=group)
            reference.append(torch.stack(parts).sum(0) / world)
            bits = torch.tensor([payload.num_bits])
            every = [torch.zeros_like(bits) for _ in range(world)]
            torch.distributed.all_gather(every, bits, group=group)
            wire_bits.append([int(b) for b in every])
        out[encoding + "_reference"] = reference
        out[encoding + "_wire_bits"] = wire_bits
    return out


@pytest.fixture(scope="module")
def all_results(tmp_path_factory):
    return run_ranks(_scenarios, max(WORLDS), tmp_path=tmp_path_factory.mktemp("qsgd"))


@pytest.fixture(params=WORLDS)
def results(request, all_results):
    world = request.param
    return world, [all_results[rank][world] for rank in range(world)]


@pytest.mark.parametrize("encoding", ["fixed", "elias"])
def test_allgather_sync_equals_the_dense_reference(results, encoding):
    _world, res = results
    for rank_result in res:
        for got, ref in zip(rank_result[encoding], rank_result[encoding + "_reference"], strict=True):
            assert torch.allclose(got, ref, rtol=1e-6, atol=1e-6)
    for other in res[1:]:  # every rank ends with the same average
        for a, b in zip(res[0][encoding], other[encoding], strict=True):
            assert torch.equal(a, b)
    # both encodings carry the same codes: the same average, bit for bit
    for a, b in zip(res[0]["fixed"], res[0]["elias"], strict=True):
        assert torch.equal(a, b)


def test_allgather_bits_are_the_wire_bits(results):
    world, res = results
    fixed_each = [8 * math.ceil(n * 4 / 8) + 32 * math.ceil(n / 128) for n in SIZES]
    for rank, rank_result in enumerate(res):
        # fixed size: no exchange of sizes, every rank sends exactly its wire tensors
        assert rank_result["fixed_stats"]["bits_by_op"] == {"all_gather": sum(fixed_each)}
        assert rank_result["fixed_wire_bits"] == [[bits] * world for bits in fixed_each]
        stats, wire_bits = rank_result["elias_stats"], rank_result["elias_wire_bits"]
        # sizes first (two int64 counts per tensor), then every rank pads to the longest payload
        assert stats["bits_by_op"]["all_gather_counts"] == len(SIZES) * 2 * 64
        assert stats["bits_by_op"]["all_gather"] == sum(max(bits) for bits in wire_bits)
        assert sum(bits[rank] for bits in wire_bits) < sum(fixed_each)  # 4-bit Elias beats 4-bit fixed
        assert stats["dense_bits"] == 32 * sum(SIZES)


# --------------------------------------------------------------------------------------- options
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"bits": 3}, r"bits must be one of 2, 4, 8 .*got 3"),
        ({"bits": True}, r"compressor 'qsgd' option bits must be an integer, got True \(bool\)"),
        ({"bucket_size": 0}, r"bucket_size must be an integer >= 1 .*got 0"),
        ({"bucket_size": 2.5}, r"compressor 'qsgd' option bucket_size must be an integer, got 2.5"),
        ({"norm": "l1"}, r"compressor 'qsgd' option norm must be one of l2, max, got 'l1'"),
        (
            {"encoding": "huffman"},
            r"compressor 'qsgd' option encoding must be one of fixed, elias, got 'huffman'",
        ),
    ],
)
def test_bad_options_are_rejected(options, message):
    with pytest.raises(ValueError, match=message):
        build_compressor("qsgd", **options)


def test_registry_and_repr():
    comp = build_compressor("qsgd", bits=8, bucket_size=8192, norm="max", encoding="elias")
    assert isinstance(comp, QSGD) and comp.num_levels == 127
    assert repr(comp) == "QSGD(bits=8, bucket_size=8192, norm='max', encoding='elias', fused_rng=False)"
    assert [QSGD(bits=b).num_levels for b in (2, 4, 8)] == [1, 7, 127]
