"""Base topologies for decentralized SGD: undirected, connected ``networkx.Graph`` on nodes 0..n-1.

Every constructor returns a simple graph (no self loops, no parallel edges) whose nodes are exactly
the integers ``0..n-1`` (a node is a worker's rank) and checks it with :func:`check_graph`. Random
graphs draw from a numpy ``Generator`` seeded with ``seed`` (never the global RNG) and are resampled
until connected, at most ``max_tries`` times.

:func:`paper_matchings` holds the predefined topologies of the official MATCHA code
(``util.select_graph`` in github.com/JYWa/MATCHA), which are given already split into matchings:

    0  8-node Erdős–Rényi graph of Fig. 1(a): 12 edges, 5 matchings, max degree 5
    1  16-node geometric graph of Fig. A.3(a)
    2  16-node geometric graph of Fig. A.3(b)
    3  16-node geometric graph of Fig. A.3(c)
    4  16-node Erdős–Rényi graph of Fig. 3(b)
    5  8-node ring (2 matchings)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import networkx as nx
import numpy as np

Edge = tuple[int, int]
Matchings = list[list[Edge]]

# The official edge lists, matching by matching, exactly as in util.select_graph (edge orientation
# included; paper_matchings returns each edge as (min, max)).
_PAPER_MATCHINGS: tuple[tuple[tuple[Edge, ...], ...], ...] = (
    # 0: 8-node Erdős–Rényi graph, Fig. 1(a)
    (
        ((1, 5), (6, 7), (0, 4), (2, 3)),
        ((1, 7), (3, 6)),
        ((1, 0), (3, 7), (5, 6)),
        ((1, 2), (7, 0)),
        ((3, 1),),
    ),
    # 1: 16-node geometric graph, Fig. A.3(a)
    (
        ((4, 8), (6, 11), (7, 13), (0, 12), (5, 14), (10, 15), (2, 3), (1, 9)),
        ((11, 13), (14, 2), (5, 6), (15, 3), (10, 9)),
        ((11, 8), (2, 5), (13, 4), (14, 3), (0, 10)),
        ((11, 5), (15, 14), (13, 8)),
        ((2, 11),),
    ),
    # 2: 16-node geometric graph, Fig. A.3(b)
    (
        ((2, 7), (12, 15), (3, 13), (5, 6), (8, 0), (9, 4), (11, 14), (1, 10)),
        ((8, 6), (0, 11), (3, 2), (5, 4), (15, 14), (1, 9)),
        ((8, 3), (0, 6), (11, 2), (4, 1), (12, 14)),
        ((8, 11), (6, 3), (0, 5)),
        ((8, 2), (0, 3), (6, 7), (11, 12)),
        ((8, 5), (6, 4), (0, 2), (11, 7)),
        ((8, 15), (3, 7), (0, 4), (6, 2)),
        ((8, 14), (5, 3), (11, 6), (0, 9)),
        ((8, 7), (15, 11), (2, 5), (4, 3), (1, 0), (13, 6)),
        ((12, 8),),
    ),
    # 3: 16-node geometric graph, Fig. A.3(c)
    (
        ((3, 12), (4, 8), (1, 13), (5, 7), (9, 10), (11, 14), (6, 15), (0, 2)),
        ((7, 14), (2, 6), (5, 13), (8, 10), (1, 15), (0, 11), (3, 9), (4, 12)),
        ((2, 7), (3, 15), (9, 13), (6, 11), (4, 14), (10, 12), (1, 8), (0, 5)),
        ((5, 14), (1, 12), (13, 8), (9, 4), (2, 11), (7, 0)),
        ((5, 1), (14, 8), (13, 12), (10, 4), (6, 7)),
        ((5, 9), (14, 1), (13, 3), (8, 2), (11, 7)),
        ((5, 12), (14, 13), (1, 9), (8, 0)),
        ((5, 2), (14, 10), (1, 3), (9, 8), (13, 15)),
        ((5, 8), (14, 12), (1, 4), (13, 10)),
        ((5, 3), (14, 2), (9, 12), (1, 10), (13, 4)),
        ((5, 6), (14, 0), (8, 12), (1, 2)),
        ((5, 15), (9, 14)),
        ((11, 5),),
    ),
    # 4: 16-node Erdős–Rényi graph, Fig. 3(b)
    (
        ((2, 7), (3, 15), (13, 14), (8, 9), (1, 5), (0, 10), (6, 12), (4, 11)),
        ((12, 11), (5, 6), (14, 1), (9, 10), (15, 2), (8, 13)),
        ((12, 5), (11, 6), (1, 8), (9, 3), (2, 10)),
        ((12, 14), (11, 9), (5, 15), (0, 6), (1, 7)),
        ((12, 8), (5, 2), (11, 14), (1, 6)),
        ((12, 15), (13, 11), (10, 5), (3, 14)),
        ((12, 9),),
        ((0, 12),),
    ),
    # 5: 8-node ring
    (
        ((0, 1), (2, 3), (4, 5), (6, 7)),
        ((0, 7), (2, 1), (4, 3), (6, 5)),
    ),
)
PAPER_GRAPHS = tuple(range(len(_PAPER_MATCHINGS)))


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _components_text(graph: nx.Graph) -> str:
    components = sorted(sorted(c) for c in nx.connected_components(graph))
    shown = "; ".join(
        str(c) if len(c) <= 8 else f"[{c[0]}, {c[1]}, ... ({len(c)} nodes)]" for c in components[:4]
    )
    more = f"; and {len(components) - 4} more" if len(components) > 4 else ""
    return f"{len(components)} components: {shown}{more}"


def check_graph(graph: nx.Graph) -> int:
    """Return ``n`` if ``graph`` is a simple, connected, undirected graph on exactly 0..n-1, n >= 2.

    Raises ``ValueError`` naming the problem: a directed or multi-graph, no nodes or a single node,
    nodes that are not 0..n-1 (the first missing or extra one), a self loop, a disconnected graph
    (its components).
    """
    if not isinstance(graph, nx.Graph) or graph.is_directed() or graph.is_multigraph():
        raise ValueError(f"expected an undirected simple networkx.Graph, got {type(graph).__name__}")
    n = graph.number_of_nodes()
    if n == 0:
        raise ValueError("graph is empty: it has no nodes; a topology needs at least 2 nodes")
    if n == 1:
        raise ValueError("graph has a single node and no edges; a topology needs at least 2 nodes")
    nodes = set(graph.nodes)
    expected = set(range(n))
    if nodes != expected:
        extra = sorted(nodes - expected, key=repr)
        missing = sorted(expected - nodes)
        raise ValueError(
            f"graph nodes must be exactly 0..{n - 1} (ranks); node {extra[0]!r} is not one of them"
            f" and node {missing[0]} is missing"
        )
    loops = sorted(u for u, _ in nx.selfloop_edges(graph))
    if loops:
        raise ValueError(f"graph has a self loop at node {loops[0]} ({len(loops)} in all); remove it")
    if not nx.is_connected(graph):
        raise ValueError(f"graph is disconnected, with {_components_text(graph)}")
    return n


def _normalise_edges(n: int, edges: Iterable[Sequence[int]]) -> list[Edge]:
    """Edges as (min, max) pairs; rejects malformed pairs, unknown nodes, self loops and duplicates."""
    out: list[Edge] = []
    seen: dict[Edge, Edge] = {}
    for edge in edges:
        if len(edge) != 2:
            raise ValueError(f"an edge is a pair of nodes, got {edge!r}")
        u, v = edge
        for node in (u, v):
            if isinstance(node, bool) or not isinstance(node, int | np.integer) or not 0 <= node < n:
                raise ValueError(f"edge {(u, v)!r} names node {node!r}; nodes are 0..{n - 1}")
        if u == v:
            raise ValueError(f"edge {(u, v)!r} is a self loop at node {u}")
        key = (int(min(u, v)), int(max(u, v)))
        if key in seen:
            raise ValueError(f"duplicate edge {(u, v)!r}: the same link as {seen[key]!r}")
        seen[key] = (u, v)
        out.append(key)
    return out


def from_edge_list(n: int, edges: Iterable[Sequence[int]]) -> nx.Graph:
    """The graph on nodes 0..n-1 with ``edges`` (pairs of ranks; duplicates and self loops rejected)."""
    n = _check_int("n (number of nodes)", n, 2)
    graph = nx.Graph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from(_normalise_edges(n, edges))
    check_graph(graph)
    return graph


def ring(n: int) -> nx.Graph:
    """The cycle 0 - 1 - ... - (n-1) - 0 (n >= 3; every node has degree 2)."""
    n = _check_int("n (number of nodes of a ring)", n, 3)
    return from_edge_list(n, [(i, (i + 1) % n) for i in range(n)])


def torus(rows: int, cols: int) -> nx.Graph:
    """The 2-D torus: node ``r * cols + c`` links to its 4 neighbours on the periodic rows x cols grid.

    rows, cols >= 3, so that the 4 neighbours are distinct and every node has degree 4.
    """
    rows = _check_int("rows of a torus", rows, 3)
    cols = _check_int("cols of a torus", cols, 3)
    edges = []
    for r in range(rows):
        for c in range(cols):
            node = r * cols + c
            edges.append((node, r * cols + (c + 1) % cols))
            edges.append((node, ((r + 1) % rows) * cols + c))
    return from_edge_list(rows * cols, edges)


def _check_fraction(name: str, value: float, allow_zero: bool = False) -> float:
    value = float(value)
    low_ok = value >= 0 if allow_zero else value > 0
    if not (math.isfinite(value) and low_ok and value <= 1):
        interval = "[0, 1]" if allow_zero else "(0, 1]"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return value


def _first_connected(
    sample: Callable[[np.random.Generator], list[Edge]],
    n: int,
    seed: int,
    max_tries: int,
    what: str,
    hint: str,
) -> nx.Graph:
    rng = np.random.default_rng(seed)
    max_tries = _check_int("max_tries", max_tries, 1)
    for _ in range(max_tries):
        graph = nx.Graph()
        graph.add_nodes_from(range(n))
        graph.add_edges_from(sample(rng))
        if nx.is_connected(graph):
            return graph
    raise ValueError(f"no connected {what} in {max_tries} tries with seed {seed}; {hint}")


def erdos_renyi(n: int, p: float, seed: int, max_tries: int = 100) -> nx.Graph:
    """G(n, p): each of the n(n-1)/2 links present independently with probability ``p``.

    Drawn from ``numpy.random.default_rng(seed)`` (pairs (i, j), i < j, in lexicographic order) and
    redrawn from the same generator until connected, at most ``max_tries`` times.
    """
    n = _check_int("n (number of nodes)", n, 2)
    p = _check_fraction("edge probability p", p)
    pairs = np.array([(i, j) for i in range(n) for j in range(i + 1, n)])

    def sample(rng: np.random.Generator) -> list[Edge]:
        keep = rng.random(len(pairs)) < p
        return [(int(i), int(j)) for i, j in pairs[keep]]

    hint = f"raise p (G(n, p) is connected w.h.p. once p > ln(n)/n = {math.log(n) / n:.3f})"
    return _first_connected(sample, n, seed, max_tries, f"Erdős–Rényi graph G(n={n}, p={p})", hint)


def random_geometric(n: int, radius: float, seed: int, max_tries: int = 100) -> nx.Graph:
    """n points uniform in the unit square; nodes within Euclidean distance ``radius`` are linked.

    Positions come from ``numpy.random.default_rng(seed)``; redrawn until connected, at most
    ``max_tries`` times.
    """
    n = _check_int("n (number of nodes)", n, 2)
    radius = float(radius)
    if not (math.isfinite(radius) and radius > 0):
        raise ValueError(f"radius must be a finite number > 0, got {radius!r}")
    upper = np.triu(np.ones((n, n), dtype=bool), k=1)

    def sample(rng: np.random.Generator) -> list[Edge]:
        points = rng.random((n, 2))
        dist = np.linalg.norm(points[:, None, :] - points[None, :, :], axis=-1)
        rows, cols = np.nonzero(upper & (dist <= radius))
        return [(int(i), int(j)) for i, j in zip(rows, cols)]

    hint = f"raise the radius (connected w.h.p. once radius > sqrt(ln(n)/(pi n)) = {math.sqrt(math.log(n) / (math.pi * n)):.3f})"
    return _first_connected(
        sample, n, seed, max_tries, f"random geometric graph (n={n}, radius={radius})", hint
    )


def _check_paper_index(index: int) -> int:
    if isinstance(index, bool) or not isinstance(index, int | np.integer) or index not in PAPER_GRAPHS:
        raise ValueError(f"paper graph index must be one of {list(PAPER_GRAPHS)}, got {index!r}")
    return int(index)


def paper_matchings(index: int) -> Matchings:
    """The official code's decomposition of predefined graph ``index`` (see the module docstring).

    Each edge is returned as (min, max); the order of matchings and of edges is the official one,
    so that probabilities ``p_j`` line up with the paper's.
    """
    index = _check_paper_index(index)
    return [[(min(u, v), max(u, v)) for u, v in matching] for matching in _PAPER_MATCHINGS[index]]


def paper_graph(index: int) -> nx.Graph:
    """Predefined graph ``index`` of the official code as a graph (union of its matchings)."""
    matchings = paper_matchings(index)
    n = 1 + max(max(edge) for matching in matchings for edge in matching)
    return from_edge_list(n, [edge for matching in matchings for edge in matching])
