"""Random-block sparsification: one shared block per tensor, linear, no indices on the wire."""

from __future__ import annotations

import pytest
import torch

from common.comm.sync import GradientSync
from common.compressors import CompressorRNG, build_compressor
from common.compressors.random_block import RandomBlock
from tests.distributed import run_ranks


def _expected_block(x: torch.Tensor, offset: int, k: int) -> torch.Tensor:
    flat = x.reshape(-1)
    positions = (torch.arange(k) + offset) % flat.numel()
    return flat[positions]


def test_block_is_contiguous_and_wraps() -> None:
    comp = RandomBlock(0.25)
    x = torch.arange(40, dtype=torch.float32).reshape(5, 8)
    rng = CompressorRNG(seed=3, rank=0)
    seen_wrap = False
    for _ in range(60):
        payload = comp.compress(x, rng)
        offset = payload.local["offset"]
        assert 0 <= offset < 40
        assert torch.equal(payload.wire["values"], _expected_block(x, offset, 10))
        out = comp.decompress(payload)
        assert out.shape == x.shape
        mask = torch.zeros(40, dtype=torch.bool)
        mask[(torch.arange(10) + offset) % 40] = True
        assert torch.equal(out.reshape(-1)[mask], x.reshape(-1)[mask])
        assert torch.count_nonzero(out.reshape(-1)[~mask]) == 0
        seen_wrap |= offset + 10 > 40
    assert seen_wrap  # 60 draws of 40 offsets: the wrap-around path ran


def test_decompress_into_reads_a_block_that_is_the_buffer_itself() -> None:
    # GradientSync without error feedback all-reduces a view of the gradient in place and then
    # decompresses into the gradient: the block must survive, everything else become zero.
    comp = RandomBlock(0.25)
    rng = CompressorRNG(seed=5, rank=0)
    seen = {"plain": False, "wrapped": False}
    for _ in range(60):
        grad = torch.arange(1.0, 41.0)
        payload = comp.compress(grad, rng)
        offset = payload.local["offset"]
        wrapped = offset + 10 > 40
        assert wrapped or payload.wire["values"].data_ptr() == grad.data_ptr() + 4 * offset
        payload.wire["values"].mul_(2)  # the in-place all-reduce (a sum over two equal ranks)
        expected = torch.zeros(40)
        positions = (torch.arange(10) + offset) % 40
        expected[positions] = 2 * torch.arange(1.0, 41.0)[positions]
        comp.decompress_into(payload, grad)
        assert torch.equal(grad, expected)
        seen["wrapped" if wrapped else "plain"] = True
    assert all(seen.values())


def test_decompress_into_another_view_of_the_same_memory() -> None:
    # the values live in the same storage as out, but not at out's block: the fill must not erase them
    comp = RandomBlock(0.25)
    rng = CompressorRNG(seed=2, rank=0)
    for _ in range(20):
        storage = torch.arange(1.0, 81.0)
        x, out = storage[20:60], storage[:40]  # x's blocks overlap out
        payload = comp.compress(x, rng)
        expected = comp.decompress(payload).clone()
        comp.decompress_into(payload, out)
        assert torch.equal(out, expected)


def test_offsets_are_the_stream_torch_randint_draws() -> None:
    # the draw avoids randint's shape handling but must consume the shared generator the same way
    from common.compressors.random_block import block_offset

    rng = CompressorRNG(seed=9, rank=0)
    twin = torch.Generator().manual_seed(9)
    for numel in (1, 7, 10**5, 2**31 + 11):
        mine = [block_offset(numel, rng) for _ in range(5)]
        assert mine == [int(torch.randint(numel, (1,), generator=twin).item()) for _ in range(5)]


def test_wire_holds_only_the_block() -> None:
    comp = build_compressor("random_block", density=1 / 64)
    x = torch.randn(10_000)
    payload = comp.compress(x, CompressorRNG(0, 0))
    assert list(payload.wire) == ["values"]
    assert payload.num_bits == 157 * 32  # ceil(10000 / 64) fp32 values, no index
    assert comp.linear and not comp.unbiased and comp.fixed_size


def test_density_one_is_identity_and_scaled_is_unbiased() -> None:
    x = torch.randn(7, 3)
    rng = CompressorRNG(1, 0)
    assert torch.equal(RandomBlock(1.0).decompress(RandomBlock(1.0).compress(x, rng)), x)
    comp = RandomBlock(0.25, scaled=True)
    mean = torch.zeros(21)
    trials = 4000
    for _ in range(trials):
        mean += comp.decompress(comp.compress(x, rng)).reshape(-1)
    mean /= trials
    # each entry is in the block with probability 6/21 and then scaled by 21/6
    assert torch.allclose(mean, x.reshape(-1), atol=0.25 * x.abs().max().item())


def test_offsets_come_from_the_shared_generator_only() -> None:
    comp = RandomBlock(0.1)
    x = torch.randn(1000)
    rank0, rank3 = CompressorRNG(5, rank=0), CompressorRNG(5, rank=3)
    a = [comp.compress(x, rank0).local["offset"] for _ in range(20)]
    b = [comp.compress(x, rank3).local["offset"] for _ in range(20)]
    assert a == b  # the rank seeds only the local generator, which the block never reads
    assert len(set(a)) > 10


@pytest.mark.parametrize("bad", [0, -0.1, 1.5])
def test_bad_density_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match=r"density must be a number in \(0, 1\]"):
        build_compressor("random_block", density=bad)


@pytest.mark.parametrize("bad", ["0.1", True])
def test_a_density_that_is_not_a_number_is_named(bad: object) -> None:
    with pytest.raises(
        ValueError, match=rf"compressor 'random_block' option density must be a number, got {bad!r}"
    ):
        build_compressor("random_block", density=bad)


def test_unknown_option_rejected() -> None:
    with pytest.raises(ValueError, match="unknown option.*blocks.*allowed: density, scaled"):
        build_compressor("random_block", density=0.1, blocks=2)


# -- on real gloo ranks ---------------------------------------------------------------------------

SHAPES = [(300,), (17, 9), (5, 4, 3)]
STEPS = 3


def _offsets_and_sums(rank: int, world_size: int) -> dict[str, object]:
    """Per step and tensor: the offset this rank drew, its own input and the all-reduced mean."""
    sync = GradientSync(RandomBlock(1 / 16), transport="allreduce", compress_per_tensor=True, seed=11)
    offsets, inputs, means = [], [], []
    recorded: list[int] = []
    compress = sync.compressor.compress

    def spy(x, rng):  # type: ignore[no-untyped-def]
        payload = compress(x, rng)
        recorded.append(payload.local["offset"])
        return payload

    sync.compressor.compress = spy  # type: ignore[method-assign]
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 * rank + step)
        tensors = [torch.randn(shape, generator=g) for shape in SHAPES]
        inputs.append([t.clone() for t in tensors])
        sync.sync([(f"t{i}", t) for i, t in enumerate(tensors)])
        means.append(tensors)
        offsets.append(recorded[-len(SHAPES) :])
    return {"offsets": offsets, "inputs": inputs, "means": means, "bits": sync.stats.bits_sent}


def test_offsets_agree_across_four_ranks_and_the_sum_is_the_dense_sum_on_the_block(tmp_path) -> None:
    results = run_ranks(_offsets_and_sums, 4, tmp_path=tmp_path)
    offsets = [r["offsets"] for r in results]
    assert all(o == offsets[0] for o in offsets)  # same block on every rank, every step and tensor
    flat = [o for step in offsets[0] for o in step]
    assert len(set(flat)) > len(flat) // 2  # they differ across steps and tensors
    for step in range(STEPS):
        for i, shape in enumerate(SHAPES):
            numel = torch.Size(shape).numel()
            k = -(-numel // 16)
            positions = (torch.arange(k) + offsets[0][step][i]) % numel
            dense_mean = sum(r["inputs"][step][i] for r in results).reshape(-1) / 4
            expected = torch.zeros(numel)
            expected[positions] = dense_mean[positions]
            for r in results:
                assert torch.allclose(r["means"][step][i].reshape(-1), expected, atol=1e-6)
    # bits: only the blocks' values, summed by an all-reduce (counted as the buffer sent)
    blocks = sum(-(-torch.Size(s).numel() // 16) for s in SHAPES)
    assert results[0]["bits"] == STEPS * blocks * 32
