"""Gossip over activated matchings (papers.matcha.gossip) on real gloo ranks against numpy's W @ X."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from common.methods import checked_config
from papers.matcha.gossip import GossipStrategy, base_graph, build_plan, check_gossip_options, step_flags
from papers.matcha.topology import paper_graph, paper_matchings, plan, ring
from tests.distributed import run_ranks

STEPS = 4


def _plan(world: int, budget: float):
    if world == 8:
        return plan(paper_graph(0), budget, paper_matchings(0))
    return plan(ring(world), budget)


def _model(rank: int) -> nn.Module:
    torch.manual_seed(100 + rank)  # different parameters on every rank (no set-up broadcast here)
    return nn.Sequential(nn.Linear(5, 3), nn.Tanh(), nn.Linear(3, 2))


def _gossip(rank: int, world: int, mode: str, budget: float, same: bool) -> dict[str, object]:
    strategy = GossipStrategy(options={"mode": mode}, seed=7, plan=_plan(world, budget))
    model = _model(0 if same else rank)
    history = []
    for _ in range(STEPS):
        history.append(torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()]))
        strategy.after_step(model)
    history.append(torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()]))
    return {"history": history, "alpha": strategy.alpha, "bits": strategy.stats.bits_sent}


def _gossip_cases(rank: int, world: int, cases: list[tuple[str, float, bool]]) -> list[dict[str, object]]:
    """Several runs in the same ranks, one after the other (one spawn of ``world`` processes)."""
    return [_gossip(rank, world, mode, budget, same) for mode, budget, same in cases]


def _check_mixing(results: list[dict[str, object]], world: int, mode: str, budget: float) -> None:
    p = _plan(world, budget)
    alpha = results[0]["alpha"]
    for step in range(STEPS):
        x = torch.stack([r["history"][step] for r in results]).double().numpy()
        flags = step_flags(p, mode, step, 7)
        laplacian = sum(
            (lap for lap, on in zip(p.laplacians, flags, strict=True) if on), np.zeros((world, world))
        )
        expected = (np.eye(world) - alpha * laplacian) @ x
        after = torch.stack([r["history"][step + 1] for r in results]).double().numpy()
        np.testing.assert_allclose(after, expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(after.mean(0), x.mean(0), rtol=1e-5, atol=1e-6)  # average kept


def test_gossip_equals_the_numpy_mixing_matrix_and_keeps_the_average_on_eight_ranks(tmp_path) -> None:
    cases = [("matcha", 0.5, False), ("vanilla", 1.0, False)]
    per_rank = run_ranks(_gossip_cases, 8, cases, tmp_path=tmp_path, timeout=240)
    for index, (mode, budget, _) in enumerate(cases):
        _check_mixing([r[index] for r in per_rank], 8, mode, budget)


def test_periodic_gossip_mixes_exactly_and_equal_parameters_are_a_fixed_point(tmp_path) -> None:
    cases = [("periodic", 0.5, False), ("vanilla", 1.0, True)]
    per_rank = run_ranks(_gossip_cases, 4, cases, tmp_path=tmp_path)
    _check_mixing([r[0] for r in per_rank], 4, "periodic", 0.5)
    same = [r[1] for r in per_rank]
    for r in same:
        for state in r["history"]:
            assert torch.equal(state, same[0]["history"][0])
    assert same[0]["bits"] > 0  # the exchanges did happen (and were counted)


def test_flags_are_shared_counter_based_and_meet_the_budget() -> None:
    p = _plan(8, 0.3)
    flags = np.stack([step_flags(p, "matcha", k, 3) for k in range(4000)])
    assert np.array_equal(flags[1234], step_flags(p, "matcha", 1234, 3))  # no dependence on the past
    assert flags.sum(1).mean() <= 0.3 * p.num_matchings + 0.1  # expected rounds within C_b M
    np.testing.assert_allclose(flags.mean(0), p.p, atol=0.03)
    periodic = np.stack([step_flags(p, "periodic", k, 3) for k in range(9)])
    assert periodic.all(1).sum() == 3 and not periodic[0].any()  # every round(1 / 0.3) = 3 steps


def test_bad_input_rejected(tmp_path) -> None:
    with pytest.raises(ValueError, match="gossip mode must be one of matcha, vanilla, periodic"):
        step_flags(_plan(4, 0.5), "random", 0, 0)
    with pytest.raises(ValueError, match="the gossip graph has 8 nodes but there are 1 ranks"):
        GossipStrategy(plan=_plan(8, 0.5))


def test_options_name_the_paper_plan_and_seeded_graphs() -> None:
    er = build_plan({"graph": "paper", "index": 0, "budget": 0.5}, 8)
    assert er.num_matchings == 5
    np.testing.assert_allclose([er.alpha, er.rho], [0.3964, 0.6440], atol=2e-4)  # papers.md 2.3
    geo, matchings = base_graph({"graph": "geometric", "radius": 0.5, "graph_seed": 0}, 8)
    again, _ = base_graph({"graph": "geometric", "radius": 0.5, "graph_seed": 0}, 8)
    assert matchings is None and sorted(geo.edges) == sorted(again.edges)  # seeded: the same graph
    other, _ = base_graph({"graph": "geometric", "radius": 0.5, "graph_seed": 1}, 8)
    assert sorted(other.edges) != sorted(geo.edges)
    assert base_graph({"graph": "ring"}, 6)[0].number_of_edges() == 6
    assert check_gossip_options({}, 8).mode == "matcha"  # defaults filled in


@pytest.mark.parametrize(
    "options,world,message",
    [
        ({"mode": "random"}, 8, "gossip mode must be one of matcha, vanilla, periodic, got 'random'"),
        ({"budget": 0}, 8, r"gossip budget: .*\(0, 1\]"),
        ({"budget": 1.5}, 8, r"gossip budget: .*1.5"),
        ({"graph": "star"}, 8, "gossip graph must be one of paper, ring, erdos_renyi, geometric, got 'star'"),
        ({"index": 9}, 8, r"gossip index must be one of the paper's graphs \[0, 1, 2, 3, 4, 5\], got 9"),
        ({"index": 0}, 4, "the paper's graph 0 has 8 nodes but world_size is 4: set world_size: 8"),
        ({"graph": "ring"}, 1, "gossip needs at least 2 workers, got world_size 1"),
        ({"graph": "ring", "radius": 0}, 4, r"gossip radius must be a number in \(0, 1.41421\], got 0"),
        ({"graph": "ring", "graph_seed": -1}, 4, "gossip graph_seed must be an int >= 0, got -1"),
        ({"budjet": 0.5}, 8, "unknown gossip option\\(s\\) budjet; allowed: mode, budget, graph"),
    ],
)
def test_bad_options_rejected(options, world, message) -> None:
    with pytest.raises(ValueError, match=message):
        check_gossip_options(options, world)


def test_run_config_checks_gossip_options_and_refuses_a_compressor() -> None:
    base = {"strategy": "gossip", "world_size": 8, "strategy_options": {"graph": "paper", "budget": 0.3}}
    assert checked_config(base).strategy_options["budget"] == 0.3
    with pytest.raises(ValueError, match="the paper's graph 0 has 8 nodes but world_size is 4"):
        checked_config({**base, "world_size": 4})
    with pytest.raises(ValueError, match=r"strategy gossip exchanges whole models .*\(got 'topk'"):
        checked_config({**base, "compressor": "topk", "compressor_options": {"density": 0.1}})


def test_a_ring_of_two_is_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match=r"gossip graph ring needs world_size >= 3, got 2"):
        checked_config({"strategy": "gossip", "world_size": 2, "strategy_options": {"graph": "ring"}})
