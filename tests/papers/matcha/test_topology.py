"""papers.matcha.topology: graphs, matching decomposition, MATCHA probabilities and mixing weight.

Reference values: ../shared/research/papers.md section 2.3 (graph 0 of the official code, 8-ring).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache

import networkx as nx
import numpy as np
import pytest

from papers.matcha.topology import (
    PAPER_GRAPHS,
    MatchaPlan,
    activation_probabilities,
    base_laplacian,
    check_graph,
    check_matchings,
    draw_activations,
    erdos_renyi,
    expected_mixing_matrix,
    from_edge_list,
    graph_edges,
    laplacian,
    matching_decomposition,
    matching_laplacians,
    mixing_weight,
    paper_graph,
    paper_matchings,
    periodic_activations,
    plan,
    random_geometric,
    ring,
    spectral_norm_rho,
    torus,
    vanilla_activations,
    vanilla_weight,
)
from trainer.paths import REPO_ROOT

BUDGETS = (0.1, 0.3, 0.5, 1.0)
RHO_TOL = 2e-3


def _graphs() -> dict[str, nx.Graph]:
    graphs = {"ring8": ring(8), "ring7": ring(7), "torus4x4": torus(4, 4), "torus3x5": torus(3, 5)}
    graphs |= {f"er{seed}": erdos_renyi(12, 0.35, seed) for seed in range(4)}
    graphs |= {f"geo{seed}": random_geometric(14, 0.45, seed) for seed in range(4)}
    graphs |= {f"paper{i}": paper_graph(i) for i in PAPER_GRAPHS}
    graphs |= {"K7": nx.complete_graph(7), "petersen": nx.petersen_graph()}
    return graphs


GRAPHS = _graphs()


@cache
def paper0_plan(budget: float) -> MatchaPlan:
    return plan(paper_graph(0), budget, paper_matchings(0))


@cache
def decomposed_plan(name: str, budget: float) -> MatchaPlan:
    return plan(GRAPHS[name], budget)


PLAN_CASES = [("paper0", b) for b in BUDGETS] + [
    (name, b) for name in ("paper0-decomposed", "ring8", "torus4x4", "er0") for b in BUDGETS
]


def get_plan(name: str, budget: float) -> MatchaPlan:
    if name == "paper0":
        return paper0_plan(budget)
    return decomposed_plan("paper0" if name == "paper0-decomposed" else name, budget)


# --- graphs -----------------------------------------------------------------------------------------


def test_constructors_shape():
    assert graph_edges(ring(5)) == [(0, 1), (0, 4), (1, 2), (2, 3), (3, 4)]
    tor = torus(3, 4)
    assert tor.number_of_nodes() == 12 and tor.number_of_edges() == 24
    assert {d for _, d in tor.degree} == {4}
    for graph in GRAPHS.values():
        assert check_graph(graph) == graph.number_of_nodes()


def test_random_graphs_are_seeded():
    assert graph_edges(erdos_renyi(10, 0.4, 3)) == graph_edges(erdos_renyi(10, 0.4, 3))
    assert graph_edges(erdos_renyi(10, 0.4, 3)) != graph_edges(erdos_renyi(10, 0.4, 4))
    assert graph_edges(random_geometric(10, 0.5, 3)) == graph_edges(random_geometric(10, 0.5, 3))
    assert graph_edges(random_geometric(10, 0.5, 3)) != graph_edges(random_geometric(10, 0.5, 4))


def test_random_graph_gives_up_with_a_clear_error():
    with pytest.raises(ValueError, match=r"no connected Erdős–Rényi graph G\(n=30, p=0.01\) in 5 tries"):
        erdos_renyi(30, 0.01, seed=0, max_tries=5)
    with pytest.raises(ValueError, match="no connected random geometric graph"):
        random_geometric(30, 0.01, seed=0, max_tries=5)


def test_paper_graph_0_and_ring():
    graph = paper_graph(0)
    assert graph.number_of_nodes() == 8 and graph.number_of_edges() == 12
    assert max(d for _, d in graph.degree) == 5 and len(paper_matchings(0)) == 5
    assert graph_edges(paper_graph(5)) == graph_edges(ring(8))
    eig = np.linalg.eigvalsh(base_laplacian(graph))
    assert eig[1] == pytest.approx(0.670, abs=1e-3) and eig[-1] == pytest.approx(6.330, abs=1e-3)
    with pytest.raises(ValueError, match=r"paper graph index must be one of \[0, 1, 2, 3, 4, 5\], got 6"):
        paper_graph(6)


def test_check_graph_rejects_bad_graphs():
    with pytest.raises(ValueError, match=r"disconnected, with 2 components: \[0, 1\]; \[2, 3\]"):
        from_edge_list(4, [(0, 1), (2, 3)])
    with pytest.raises(ValueError, match="no nodes"):
        check_graph(nx.Graph())
    with pytest.raises(ValueError, match="single node"):
        check_graph(nx.empty_graph(1))
    with pytest.raises(ValueError, match=r"exactly 0\.\.2 .*node 3 is not one of them and node 0 is missing"):
        check_graph(nx.Graph([(1, 2), (2, 3)]))
    looped = ring(4)
    looped.add_edge(2, 2)
    with pytest.raises(ValueError, match="self loop at node 2"):
        check_graph(looped)
    with pytest.raises(ValueError, match="undirected simple"):
        check_graph(nx.DiGraph([(0, 1)]))


def test_edge_list_rejects_unknown_nodes_and_duplicates():
    with pytest.raises(ValueError, match=r"edge \(3, 9\) names node 9; nodes are 0\.\.7"):
        from_edge_list(8, [(0, 1), (3, 9)])
    with pytest.raises(ValueError, match=r"duplicate edge \(1, 0\): the same link as \(0, 1\)"):
        from_edge_list(3, [(0, 1), (1, 2), (1, 0)])
    with pytest.raises(ValueError, match="self loop at node 1"):
        from_edge_list(3, [(0, 1), (1, 1), (1, 2)])


# --- matching decomposition -------------------------------------------------------------------------


def assert_partition(graph: nx.Graph, matchings: list[list[tuple[int, int]]]) -> None:
    covered = sorted(edge for matching in matchings for edge in matching)
    assert covered == graph_edges(graph), "every edge exactly once"
    for matching in matchings:
        nodes = [node for edge in matching for node in edge]
        assert len(nodes) == len(set(nodes)), f"a node twice in {matching}"
    assert len(matchings) <= max(d for _, d in graph.degree) + 1


@pytest.mark.parametrize("name", list(GRAPHS))
def test_decomposition_partitions_edges_into_matchings(name):
    graph = GRAPHS[name]
    before = (sorted(graph.nodes), graph_edges(graph))
    matchings = matching_decomposition(graph)
    assert_partition(graph, matchings)
    assert (sorted(graph.nodes), graph_edges(graph)) == before, "input graph mutated"
    assert matching_decomposition(graph) == matchings, "not deterministic"
    if nx.is_bipartite(graph):
        assert len(matchings) == max(d for _, d in graph.degree)


@pytest.mark.parametrize("index", PAPER_GRAPHS)
def test_paper_matchings_are_a_partition(index):
    assert_partition(paper_graph(index), paper_matchings(index))


def test_decomposition_of_small_graphs():
    assert len(matching_decomposition(ring(8))) == 2
    assert len(matching_decomposition(ring(7))) == 3  # an odd cycle needs Δ + 1 colours
    assert len(matching_decomposition(paper_graph(0))) == 5


def test_laplacians():
    lap = laplacian(3, [(0, 1), (2, 1)])
    assert np.array_equal(lap, [[1, -1, 0], [-1, 2, -1], [0, -1, 1]])
    laps = matching_laplacians(8, paper_matchings(0))
    assert np.array_equal(sum(laps), base_laplacian(paper_graph(0)))
    for lap in laps:
        assert np.array_equal(lap @ lap, 2 * lap)


def test_check_matchings_rejects_non_matchings():
    with pytest.raises(
        ValueError, match=r"matching 1 is not a matching: node 2 is in both \(1, 2\) and \(2, 3\)"
    ):
        check_matchings(4, [[(0, 1)], [(1, 2), (2, 3)]])
    with pytest.raises(ValueError, match=r"duplicate edge \(1, 0\)"):
        check_matchings(4, [[(0, 1)], [(1, 0), (2, 3)]])
    with pytest.raises(ValueError, match="must partition the graph's edges: missing"):
        plan(ring(4), 0.5, [[(0, 1), (2, 3)]])


# --- probabilities and mixing weight ----------------------------------------------------------------


@pytest.mark.parametrize(("name", "budget"), PLAN_CASES)
def test_plan_invariants(name, budget):
    result = get_plan(name, budget)
    assert np.all(result.p >= 0) and np.all(result.p <= 1)
    assert result.p.sum() <= budget * result.num_matchings + 1e-6
    assert 0 < result.rho < 1
    assert result.algebraic_connectivity > 0
    assert result.rho == pytest.approx(spectral_norm_rho(result.laplacians, result.p, result.alpha), abs=1e-4)
    mean_w = expected_mixing_matrix(result.laplacians, result.p, result.alpha)
    assert np.allclose(mean_w, mean_w.T)
    assert np.allclose(mean_w.sum(axis=0), 1) and np.allclose(mean_w.sum(axis=1), 1)


@pytest.mark.parametrize(
    ("budget", "p", "lambda2", "alpha", "rho"),
    [
        (1.0, [1, 1, 1, 1, 1], 0.670, 0.2857, 0.6538),
        (0.5, [0.984, 0, 0.758, 0.758, 0], 0.561, 0.3964, 0.6440),
        (0.3, [0.59, 0, 0.455, 0.455, 0], 0.337, 0.5148, 0.7765),
        (0.1, [0.197, 0, 0.152, 0.152, 0], 0.112, 0.5621, 0.9368),
    ],
)
def test_paper_graph_0_reference_values(budget, p, lambda2, alpha, rho):
    result = paper0_plan(budget)
    assert result.algebraic_connectivity == pytest.approx(lambda2, abs=2e-3)
    # The lambda_2 maximiser need not be unique; these are the values SCS and CLARABEL agree on.
    assert np.allclose(result.p, p, atol=5e-3)
    assert result.alpha == pytest.approx(alpha, abs=2e-3)
    assert result.rho == pytest.approx(rho, abs=RHO_TOL)


def test_matcha_at_half_budget_beats_vanilla_on_graph_0():
    alpha, rho = vanilla_weight(base_laplacian(paper_graph(0)))
    assert alpha == pytest.approx(2 / 7, abs=1e-4) and rho == pytest.approx(0.6538, abs=1e-4)
    assert paper0_plan(1.0).alpha == pytest.approx(alpha, abs=1e-3)
    assert paper0_plan(0.5).rho < rho
    rhos = [paper0_plan(b).rho for b in BUDGETS]
    assert rhos[0] > rhos[1] > rhos[2], "less budget, slower mixing"


def test_ring_reference_values():
    result = plan(ring(8), 0.5, paper_matchings(5))
    assert np.allclose(result.p, [0.5, 0.5], atol=1e-4)
    assert result.alpha == pytest.approx(0.607, abs=2e-3)
    assert result.rho == pytest.approx(0.784, abs=RHO_TOL)
    assert vanilla_weight(base_laplacian(ring(8)))[1] == pytest.approx(0.554, abs=1e-3)


def test_sdp_rho_matches_direct_formula_at_other_alphas():
    laps = matching_laplacians(8, paper_matchings(0))
    p = paper0_plan(0.5).p
    alpha, rho = mixing_weight(laps, p)
    for other in (0.8 * alpha, 1.2 * alpha):
        assert spectral_norm_rho(laps, p, other) > rho - 1e-6, "SDP alpha is not the minimiser"


def test_budget_is_validated():
    laps = matching_laplacians(8, paper_matchings(0))
    for bad in (0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match=rf"budget C_b must be in \(0, 1\], got {bad}"):
            activation_probabilities(laps, bad)
    with pytest.raises(ValueError, match="budget C_b"):
        plan(ring(8), 1.5)
    assert np.array_equal(activation_probabilities(laps, 1), np.ones(5))


def test_mixing_inputs_are_validated():
    with pytest.raises(ValueError, match="not the Laplacian of a matching"):
        mixing_weight([base_laplacian(paper_graph(0))], [0.5])
    laps = matching_laplacians(8, paper_matchings(0))
    with pytest.raises(ValueError, match=r"probabilities p must lie in \[0, 1\]"):
        mixing_weight(laps, [0.5, 0.5, 0.5, 0.5, 1.2])
    with pytest.raises(ValueError, match=r"one probability per matching \(5\)"):
        mixing_weight(laps, [0.5, 0.5])
    with pytest.raises(ValueError, match="disconnected"):
        vanilla_weight(laplacian(4, [(0, 1), (2, 3)]))


def test_plan_is_frozen():
    result = paper0_plan(0.5)
    with pytest.raises(AttributeError):
        result.alpha = 1.0  # type: ignore[misc]
    with pytest.raises(ValueError):
        result.p[0] = 0.0
    assert result.neighbours(1, [True, False, False, False, True]) == [5, 3]


# --- flags --------------------------------------------------------------------------------------------


def test_draw_activations_is_seeded():
    p = np.array([0.9, 0.0, 0.5, 0.2])
    flags = draw_activations(p, 20000, seed=7)
    assert flags.shape == (20000, 4) and flags.dtype == bool
    assert np.array_equal(flags, draw_activations(p, 20000, seed=7))
    assert not np.array_equal(flags, draw_activations(p, 20000, seed=8))
    assert np.allclose(flags.mean(axis=0), p, atol=0.015)
    with pytest.raises(ValueError, match=r"probabilities p must lie in \[0, 1\]"):
        draw_activations([0.5, 1.5], 10, seed=0)


def test_periodic_and_vanilla_activations():
    flags = periodic_activations(3, 12, 0.25)
    assert flags.shape == (12, 3)
    assert [k for k in range(12) if flags[k].all()] == [3, 7, 11]
    assert not flags[[k for k in range(12) if k % 4 != 3]].any()
    assert vanilla_activations(2, 5).all()
    with pytest.raises(ValueError, match="budget C_b"):
        periodic_activations(3, 12, 0.0)


# --- purity -----------------------------------------------------------------------------------------


def test_package_never_imports_torch():
    offenders = []
    paths = sorted((REPO_ROOT / "papers" / "matcha" / "topology").rglob("*.py"))
    assert len(paths) == 5  # __init__, activations, graphs, matching, mixing: a move is seen here
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {name}" for name in names if name.split(".")[0] == "torch"]
    assert offenders == []
    code = "import sys, papers.matcha.topology; assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)"
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=120)
