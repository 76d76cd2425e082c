"""Error feedback: exact conservation, delayed-not-lost, checkpointing."""

from __future__ import annotations

import pytest
import torch

from common.compressors import CompressorRNG, build_compressor
from common.feedback import ErrorFeedback


@pytest.mark.parametrize(
    "name,opts", [("topk", {"density": 0.01}), ("randomk", {"density": 0.1, "scaled": False}), ("fp16", {})]
)
def test_conservation_is_exact(name, opts):
    comp = build_compressor(name, **opts)
    ef = ErrorFeedback()
    rng = CompressorRNG(0, 0)
    sizes = [300, 77]
    for step in range(5):
        grad = torch.randn(sum(sizes), generator=torch.Generator().manual_seed(step))
        compensated = ef.compensate(["a", "b"], grad, sizes)
        sent = comp.decompress(comp.compress(compensated, rng))
        ef.update(["a", "b"], compensated, sent, sizes)
        residual = torch.cat([ef.residuals["a"], ef.residuals["b"]])
        assert torch.equal(sent + residual, compensated)


def test_nothing_is_lost_only_delayed():
    """With top-k and EF, the total sent over many steps approaches the total gradient."""
    comp = build_compressor("topk", density=0.1)
    ef, rng = ErrorFeedback(), CompressorRNG(0, 0)
    grad = torch.randn(50, generator=torch.Generator().manual_seed(0))
    total_sent = torch.zeros(50)
    for _ in range(100):
        c = ef.compensate(["w"], grad, [50])
        sent = comp.decompress(comp.compress(c, rng))
        ef.update(["w"], c, sent, [50])
        total_sent += sent
    torch.testing.assert_close(total_sent + ef.residuals["w"], 100 * grad, rtol=1e-5, atol=1e-4)


def test_state_dict_round_trip_and_shape_check():
    ef = ErrorFeedback()
    ef.update(["w"], torch.ones(4), torch.zeros(4), [4])
    clone = ErrorFeedback()
    clone.load_state_dict(ef.state_dict())
    assert torch.equal(clone.residuals["w"], torch.ones(4))
    with pytest.raises(ValueError, match="residual 'w' has 4 entries but the tensor has 5"):
        clone.compensate(["w"], torch.zeros(5), [5])
