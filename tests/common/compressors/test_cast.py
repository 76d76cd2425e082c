"""fp16 / bf16: the one-pass mean (cast and divide) equals decompress-then-divide bit for bit."""

import pytest
import torch

from common.compressors import build_compressor
from common.compressors.base import CompressorRNG


@pytest.mark.parametrize("name", ["fp16", "bf16"])
@pytest.mark.parametrize("numel", [1, 7, 1023, 4097])
@pytest.mark.parametrize("world", [1, 2, 3, 7, 8])
def test_the_one_pass_mean_is_decompress_then_divide(name, numel, world):
    compressor = build_compressor(name)
    g = torch.Generator().manual_seed(numel * 31 + world)
    # normal values, subnormal ones (where a division in the half dtype would round differently)
    # and large ones
    x = torch.randn(numel, generator=g) * torch.tensor([1.0, 1e-7, 1e3]).repeat(numel)[:numel]
    payload = compressor.compress(x * world, CompressorRNG(0, 0))  # a summed payload
    reference = compressor.decompress_into(payload, torch.empty(numel)).div_(world)
    out = torch.full((numel,), float("nan"))
    assert compressor.decompress_mean_into(payload, out, world) is out
    assert torch.equal(out, reference)
    # a division in the half dtype is not the same (the reason the divisor is a 1-entry fp32 tensor)
    if name == "fp16" and world == 3 and numel == 4097:
        half = (payload.wire["values"] / world).float()
        assert not torch.equal(half, reference)
