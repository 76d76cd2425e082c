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


@pytest.mark.parametrize("masking", [None, False, True])
def test_update_sparse_equals_update_with_the_dense_sent(masking):
    """A sparsifier's residual update without the dense ``sent`` (``update_sparse``) stores the
    same residuals (and, with DGC's masking, the same momentums) bit for bit as ``update`` with the
    decompressed payload: signed zeros (a selected -0 is sent as 0 + -0 = +0), a selected value of 0
    (not masked), NaN and infinities, indices spread over two tensors of one unit."""
    from common.compressors import build_compressor
    from common.compressors.base import CompressorRNG
    from common.feedback import MomentumCorrection

    sizes, keys = [300, 200], ["a", "b"]
    grad = torch.randn(500, generator=torch.Generator().manual_seed(0))
    grad[[3, 7, 310, 420]] = torch.tensor([-0.0, 0.0, float("nan"), float("inf")])
    comp = build_compressor("topk", density=0.05)

    def make():
        return ErrorFeedback() if masking is None else MomentumCorrection(momentum=0.9, masking=masking)

    dense, sparse = make(), make()
    for step in range(3):
        g = grad * (step + 1)
        c_dense, c_sparse = dense.compensate(keys, g, sizes), sparse.compensate(keys, g, sizes)
        assert torch.equal(c_dense.view(torch.int32), c_sparse.view(torch.int32))
        payload = comp.compress(c_dense, CompressorRNG(seed=1, rank=0))
        indices, values = comp.sparse_sent(payload)
        values = values.clone()
        values[:3] = torch.tensor([-0.0, 0.0, float("nan")])  # as if selected: the extremes
        c_dense[indices[0]] = c_sparse[indices[0]] = -0.0  # -0 - (0 + -0) is -0; -0 - -0 would be +0
        payload = payload.with_wire({"indices": indices, "values": values})
        dense.update(keys, c_dense, comp.decompress(payload), sizes)
        sparse.update_sparse(keys, c_sparse, indices, values, sizes)
        for key in keys:
            assert torch.equal(
                dense.residuals[key].view(torch.int32), sparse.residuals[key].view(torch.int32)
            )
            if masking is not None:
                assert torch.equal(
                    dense.momentums[key].view(torch.int32), sparse.momentums[key].view(torch.int32)
                )


@pytest.mark.parametrize("memory", ["error_feedback", "momentum_correction"])
def test_a_tensors_scratch_and_residual_trade_places(memory):
    """One tensor at a time (GradientSync's per-tensor route): what ``compensate`` returns is a
    scratch buffer that ``update_sparse`` makes the residual, the residual before becoming the
    next scratch: two buffers per tensor however many steps (no bucket-sized allocation per
    step), the residuals those of ``update`` with the dense sent, bit for bit."""
    from common.feedback import MomentumCorrection

    def make() -> ErrorFeedback:
        return ErrorFeedback() if memory == "error_feedback" else MomentumCorrection(momentum=0.9)

    comp, sparse, dense = build_compressor("topk", density=0.1), make(), make()
    buffers = set()
    for step in range(5):
        g = torch.randn(400, generator=torch.Generator().manual_seed(step))
        c_sparse, c_dense = sparse.compensate(["w"], g, [400]), dense.compensate(["w"], g, [400])
        payload = comp.compress(c_dense, CompressorRNG(seed=1, rank=0))
        indices, values = comp.sparse_sent(payload)
        dense.update(["w"], c_dense, comp.decompress(payload), [400])
        sparse.update_sparse(["w"], c_sparse, indices, values, [400])
        assert torch.equal(sparse.residuals["w"], dense.residuals["w"])
        assert sparse.residuals["w"].data_ptr() == c_sparse.data_ptr()
        buffers.add(c_sparse.data_ptr())
    assert len(buffers) == 2
