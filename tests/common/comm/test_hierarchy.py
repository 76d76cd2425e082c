"""Hierarchical synchronisation on 4 real gloo ranks as 2 hosts x 2 ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from common.comm import GradientSync
from common.comm.hierarchy import HostHierarchy
from common.compressors import build_compressor
from common.methods import checked_config
from tests.distributed import run_ranks

SIZES = [300, 700]
NAMES = ["a", "b"]


def _grad(rank: int, step: int, integer: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(10 * rank + step)
    if integer:  # every sum exact in fp32: equal whatever the order of the additions
        return torch.randint(-1000, 1000, (sum(SIZES),), generator=g).float()
    return torch.randn(sum(SIZES), generator=g)


def _identity(rank: int, world: int) -> dict:
    hierarchy = HostHierarchy.build(2)
    out = {}
    for integer in (True, False):
        flat = GradientSync(build_compressor("identity")).reduce_flat(NAMES, _grad(rank, 0, integer), SIZES)
        tiered = GradientSync(build_compressor("identity"), hierarchy=hierarchy)
        out[integer] = (flat.clone(), tiered.reduce_flat(NAMES, _grad(rank, 0, integer), SIZES).clone())
    out["host_bits"] = dict(hierarchy.stats.bits_by_op)
    out["place"] = (
        hierarchy.hosts,
        hierarchy.host,
        hierarchy.local_rank,
        hierarchy.is_leader,
        hierarchy.leader,
    )
    return out


def test_with_identity_the_hierarchy_is_the_flat_all_reduce(tmp_path):
    results = run_ranks(_identity, 4, tmp_path=tmp_path)
    bits = 2 * 32 * sum(SIZES)  # two reductions: integer, then random values
    for rank, r in enumerate(results):
        assert torch.equal(*r[True])  # integer values: exactly equal
        torch.testing.assert_close(*r[False], rtol=1e-6, atol=1e-6)  # fp32: up to the order of additions
        assert r["place"] == (2, rank // 2, rank % 2, rank % 2 == 0, 2 * (rank // 2))
        assert r["host_bits"] == ({"host_broadcast": bits} if rank % 2 == 0 else {"host_reduce": bits})


def _topk(rank: int, world: int) -> dict:
    """The hierarchy against its definition: the leaders' top-k + EF sync of the host sums (a plain
    GradientSync over the group of ranks 0 and 2), divided by 2, on every rank of the host."""
    hierarchy = HostHierarchy.build(2)
    leaders = dist.new_group([0, 2])
    tiered = GradientSync(build_compressor("topk", density=0.05), error_feedback=True, hierarchy=hierarchy)
    plain = (
        GradientSync(build_compressor("topk", density=0.05), error_feedback=True, group=leaders)
        if rank % 2 == 0
        else None
    )
    results = []
    for step in range(3):
        got = tiered.reduce_flat(NAMES, _grad(rank, step, False), SIZES).clone()
        expected = None
        if plain is not None:
            host_sum = _grad(rank, step, False) + _grad(rank + 1, step, False)
            expected = plain.reduce_flat(NAMES, host_sum, SIZES).clone() / 2
        results.append((got, expected))
    expected_all = [e if e is not None else torch.empty(sum(SIZES)) for _, e in results]
    for e in expected_all:
        dist.broadcast(e, src=2 * (rank // 2), group=hierarchy.intra)
    return {
        "equal": all(torch.equal(got, e) for (got, _), e in zip(results, expected_all, strict=True)),
        "bits_between_hosts": tiered.stats.bits_sent,
        "plain_bits": plain.stats.bits_sent if plain is not None else 0,
        "residuals": sorted(tiered.error_feedback.residuals) if tiered.error_feedback else None,
    }


def test_a_compressor_runs_between_the_leaders_only(tmp_path):
    for rank, r in enumerate(run_ranks(_topk, 4, tmp_path=tmp_path)):
        assert r["equal"], rank
        if rank % 2 == 0:
            assert r["bits_between_hosts"] == r["plain_bits"] > 0 and r["residuals"] == NAMES
        else:  # nothing compressed, nothing sent between hosts, no residual kept
            assert r["bits_between_hosts"] == 0 and r["residuals"] == []


def _uneven(rank: int, world: int) -> str:
    with pytest.raises(ValueError) as error:
        HostHierarchy.build(2)
    return str(error.value)


def test_hosts_of_unequal_size_are_rejected(tmp_path):
    for message in run_ranks(_uneven, 3, tmp_path=tmp_path):
        assert "world size 3 is not a whole number of hosts of 2 ranks" in message


def test_only_strategies_that_declare_it_run_hierarchically():
    base = {"dataset": "mnist", "model": "mlp", "world_size": 4, "hierarchical": True}
    assert checked_config(base).hierarchical
    with pytest.raises(ValueError, match="strategy dgc does not synchronise hierarchically"):
        checked_config({**base, "strategy": "dgc", "compressor": "dgc", "momentum": 0.9})
    assert checked_config(base).fingerprint() != checked_config({**base, "hierarchical": False}).fingerprint()
