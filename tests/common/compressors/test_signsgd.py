"""signSGD: one bit per entry, EF-signSGD's l1 scale, and the majority vote on real gloo ranks."""

from __future__ import annotations

import pytest
import torch

from common.comm import GradientSync
from common.compressors import CompressorRNG, build_compressor
from tests.distributed import run_ranks


def test_ef_signsgd_sends_one_bit_per_entry_and_the_l1_scale():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    x[3] = 0.0  # an exact zero travels as +
    compressor = build_compressor("signsgd")
    payload = compressor.compress(x, CompressorRNG(0, 0))
    assert payload.num_bits == 8 * 125 + 32
    expected = torch.where(x < 0, -1.0, 1.0) * x.abs().mean()
    assert torch.equal(compressor.decompress(payload), expected)
    votes = build_compressor("signsgd", scaled=False, vote="majority").compress(x, CompressorRNG(0, 0))
    assert votes.num_bits == 8 * 125  # the vote needs no scale


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="vote='majority' takes signs only"):
        build_compressor("signsgd", vote="majority")
    with pytest.raises(ValueError, match="unknown vote 'median'"):
        build_compressor("signsgd", vote="median")


def _sync(rank: int, world: int) -> dict:
    grads = torch.randn(3, 301, generator=torch.Generator().manual_seed(11))  # every rank's gradient
    out = {}
    for label, options, ef in (("vote", {"scaled": False, "vote": "majority"}, False), ("ef", {}, True)):
        sync = GradientSync(build_compressor("signsgd", **options), error_feedback=ef)
        g = grads[rank].clone()
        sync.sync([("w", g)])
        out[label] = g
        out[label + "_bits"] = sync.stats.bits_sent
        if ef:
            out["residual"] = sync.error_feedback.state_dict()  # type: ignore[union-attr]
    return out


def test_majority_vote_and_ef_signsgd_through_gradient_sync_on_three_ranks(tmp_path):
    results = run_ranks(_sync, 3, tmp_path=tmp_path)
    grads = torch.randn(3, 301, generator=torch.Generator().manual_seed(11))
    signs = torch.where(grads < 0, -1.0, 1.0)
    for r in results:
        assert torch.equal(r["vote"], torch.sign(signs.sum(0)))  # three voters: never a tie
        scaled = signs * grads.abs().mean(1, keepdim=True)
        torch.testing.assert_close(r["ef"], scaled.mean(0), rtol=1e-6, atol=1e-7)
    # all-gathered: what a rank hands to the collective is its 38 bytes of bits (and EF-signSGD's scale)
    assert results[0]["vote_bits"] == 38 * 8
    assert results[0]["ef_bits"] == 38 * 8 + 32


@pytest.mark.parametrize("scaled,vote", [(True, "mean"), (False, "mean"), (False, "majority")])
@pytest.mark.parametrize("numel", [1, 7, 8, 1023, 4097])
def test_the_compiled_cpu_path_gives_the_torch_paths_bits(monkeypatch, scaled, vote, numel):
    """Packing and decoding in one compiled pass (kernels._native) against the torch ops: the same
    bytes, and decodings and sums bit for bit, -0.0 and NaN included."""
    from common.compressors import signsgd as module

    if not module._native.available():
        pytest.skip("no C compiler")
    compressor = build_compressor("signsgd", scaled=scaled, vote=vote)
    xs = [torch.randn(numel, generator=torch.Generator().manual_seed(w)) for w in range(3)]
    xs[0][0], xs[1][-1] = -0.0, float("nan")

    def run() -> tuple:
        payloads = [compressor.compress(x, CompressorRNG(0, 0)) for x in xs]
        return (
            [p.wire["signs"] for p in payloads],
            compressor.decompress(payloads[0]),
            compressor.aggregate(payloads),
        )

    compiled = run()
    monkeypatch.setattr(module._native, "available", lambda: False)
    reference = run()
    assert all(torch.equal(a, b) for a, b in zip(compiled[0], reference[0], strict=True))
    for a, b in zip(compiled[1:], reference[1:], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
