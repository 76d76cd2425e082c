"""pack_bits / unpack_bits: Triton (interpreted) vs reference, layout, round trips, errors."""

from __future__ import annotations

import pytest
import torch

from kernels.pack_bits import num_packed_bytes, pack_bits, unpack_bits
from tests.kernels.helpers import LARGE_SIZE, SIZES

BITS = (1, 2, 4, 8)


def random_codes(numel: int, bits: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 2**bits, (numel,), generator=gen, dtype=torch.uint8)


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("bits", BITS)
def test_triton_matches_reference_and_round_trips(numel: int, bits: int, gen, interpreted) -> None:
    codes = random_codes(numel, bits, gen)
    packed = pack_bits(codes, bits, backend="reference")
    assert packed.dtype == torch.uint8 and packed.shape == (num_packed_bytes(numel, bits),)
    assert torch.equal(pack_bits(codes, bits, backend="triton"), packed)
    for backend in ("reference", "triton"):
        assert torch.equal(unpack_bits(packed, bits, numel, backend=backend), codes)


def test_large_two_bit(gen, interpreted) -> None:
    codes = random_codes(LARGE_SIZE, 2, gen)
    packed = pack_bits(codes, 2, backend="triton")
    assert torch.equal(packed, pack_bits(codes, 2, backend="reference"))
    assert torch.equal(unpack_bits(packed, 2, LARGE_SIZE, backend="triton"), codes)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_little_endian_layout(backend: str, interpreted) -> None:
    codes_2 = torch.tensor([1, 2, 3, 0, 1], dtype=torch.uint8)
    # byte 0 = 1 | 2 << 2 | 3 << 4 | 0 << 6; byte 1 = 1, zero-padded
    assert pack_bits(codes_2, 2, backend=backend).tolist() == [1 + 8 + 48, 1]
    codes_1 = torch.tensor([1, 0, 0, 0, 0, 0, 0, 1, 1], dtype=torch.uint8)
    assert pack_bits(codes_1, 1, backend=backend).tolist() == [0x81, 0x01]
    codes_4 = torch.tensor([0xA, 0x3, 0xF], dtype=torch.uint8)
    assert pack_bits(codes_4, 4, backend=backend).tolist() == [0x3A, 0x0F]
    assert pack_bits(codes_4, 8, backend=backend).tolist() == [0xA, 0x3, 0xF]


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_out_of_range_codes_keep_only_low_bits(backend: str, interpreted) -> None:
    codes = torch.tensor([0xFF, 0x00, 0x06, 0x01], dtype=torch.uint8)
    assert pack_bits(codes, 2, backend=backend).tolist() == [0b01_10_00_11]


def test_pack_reads_input_flat_and_does_not_alias(gen) -> None:
    codes = random_codes(24, 8, gen).view(4, 6)
    packed = pack_bits(codes.t(), 8)  # non-contiguous: read in logical (row-major) order
    assert torch.equal(packed, codes.t().reshape(-1))
    packed[0] = packed[0] ^ 1
    assert not torch.equal(packed, codes.t().reshape(-1))


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_empty(backend: str, interpreted) -> None:
    empty = torch.empty(0, dtype=torch.uint8)
    assert pack_bits(empty, 2, backend=backend).numel() == 0
    assert unpack_bits(empty, 2, 0, backend=backend).numel() == 0


@pytest.mark.parametrize("bits", [0, 3, 16, -1])
def test_bad_bit_width(bits: int) -> None:
    codes = torch.zeros(8, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"bits must be one of \[1, 2, 4, 8\]"):
        pack_bits(codes, bits)
    with pytest.raises(ValueError, match=r"bits must be one of \[1, 2, 4, 8\]"):
        unpack_bits(codes, bits, 8)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="codes must be uint8"):
        pack_bits(torch.zeros(4, dtype=torch.int32), 2)
    with pytest.raises(ValueError, match="9 codes of 2 bits need 3 bytes, packed has 2"):
        unpack_bits(torch.zeros(2, dtype=torch.uint8), 2, 9)
    with pytest.raises(ValueError, match="packed must be a 1-D uint8 tensor"):
        unpack_bits(torch.zeros(2, 2, dtype=torch.uint8), 2, 16)
    with pytest.raises(ValueError, match=r"backend must be one of \['reference', 'triton', 'auto'\]"):
        pack_bits(torch.zeros(4, dtype=torch.uint8), 2, backend="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("numel", [1, 4097, 2**24 + 5])
@pytest.mark.parametrize("bits", BITS)
def test_gpu_triton_matches_reference(numel: int, bits: int, cuda: torch.device) -> None:
    gen = torch.Generator(device=cuda).manual_seed(0)
    codes = torch.randint(0, 2**bits, (numel,), generator=gen, dtype=torch.uint8, device=cuda)
    packed = pack_bits(codes, bits, backend="triton")
    assert torch.equal(packed, pack_bits(codes, bits, backend="reference"))
    assert torch.equal(unpack_bits(packed, bits, numel, backend="triton"), codes)
