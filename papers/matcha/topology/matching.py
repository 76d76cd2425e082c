"""Matching decomposition of a topology and the Laplacians of its matchings.

MATCHA (Wang et al., arXiv 1905.09435, Sec. 3) splits the edge set E of the base graph into disjoint
matchings G_1..G_M (sets of links no two of which share a node). The links of one matching run in
parallel, so one matching costs one communication time unit. A partition of E into matchings is a
proper edge colouring; :func:`matching_decomposition` computes one with the Misra–Gries algorithm
(Misra & Gries, "A constructive proof of Vizing's theorem", IPL 1992), which uses at most Δ + 1
colours (Δ = max degree; at least Δ are always needed).

The Laplacian of the graph with edge list ``E`` on nodes 0..n-1 is

    L = D - A,    L_ii = deg(i),  L_ij = -1 for (i, j) in E,  0 otherwise

and for a matching L_j^2 = 2 L_j (every connected block is [[1, -1], [-1, 1]]), the identity that
:mod:`papers.matcha.topology.mixing` uses for the variance of the sampled Laplacian.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import pairwise

import networkx as nx
import numpy as np

from .graphs import Edge, Matchings, _normalise_edges, check_graph


class _Colouring:
    """A partial proper edge colouring: ``at[v][c]`` is the neighbour joined to ``v`` by colour ``c``."""

    def __init__(self, nodes: Iterable[int]) -> None:
        self.at: dict[int, dict[int, int]] = {v: {} for v in nodes}

    def colour(self, u: int, v: int) -> int | None:
        for c, w in self.at[u].items():
            if w == v:
                return c
        return None

    def is_free(self, v: int, c: int) -> bool:
        return c not in self.at[v]

    def first_free(self, v: int) -> int:
        c = 0
        while c in self.at[v]:
            c += 1
        return c

    def set(self, u: int, v: int, c: int) -> None:
        assert self.is_free(u, c) and self.is_free(v, c), f"colour {c} is not free on ({u}, {v})"
        self.at[u][c] = v
        self.at[v][c] = u

    def unset(self, u: int, v: int) -> int:
        c = self.colour(u, v)
        assert c is not None, f"edge ({u}, {v}) has no colour"
        del self.at[u][c], self.at[v][c]
        return c


def _is_fan(col: _Colouring, u: int, fan: Sequence[int]) -> bool:
    """fan[0] is joined to u by an uncoloured edge; colour(u, fan[i]) is free on fan[i - 1]."""
    if col.colour(u, fan[0]) is not None:
        return False
    for prev, cur in pairwise(fan):
        c = col.colour(u, cur)
        if c is None or not col.is_free(prev, c):
            return False
    return True


def _maximal_fan(col: _Colouring, neighbours: Sequence[int], u: int, v: int) -> list[int]:
    fan = [v]
    in_fan = {v}
    grown = True
    while grown:
        grown = False
        for x in neighbours:  # sorted, so the fan (and the colouring) is deterministic
            c = col.colour(u, x)
            if x not in in_fan and c is not None and col.is_free(fan[-1], c):
                fan.append(x)
                in_fan.add(x)
                grown = True
                break
    return fan


def _invert_path(col: _Colouring, u: int, c: int, d: int) -> None:
    """Swap colours c and d along the path from u that alternates d, c, d, ... (c is free on u)."""
    path: list[tuple[int, int, int]] = []
    node, want, other = u, d, c
    while want in col.at[node]:
        nxt = col.at[node][want]
        path.append((node, nxt, want))
        node, want, other = nxt, other, want
    for a, b, _ in path:
        col.unset(a, b)
    for a, b, old in path:
        col.set(a, b, c if old == d else d)


def _colour_edge(col: _Colouring, neighbours: Sequence[int], u: int, v: int) -> None:
    """Colour the uncoloured edge (u, v) without using a colour beyond Δ (one Misra–Gries step)."""
    fan = _maximal_fan(col, neighbours, u, v)
    c = col.first_free(u)
    d = col.first_free(fan[-1])
    _invert_path(col, u, c, d)
    # Misra & Gries show some prefix of the fan is still a fan after the inversion and ends at a
    # node on which d is free; take the shortest one.
    w = next(i for i in range(len(fan)) if col.is_free(fan[i], d) and _is_fan(col, u, fan[: i + 1]))
    for i in range(w):  # rotate the fan: (u, fan[i]) takes the colour of (u, fan[i + 1])
        shifted = col.unset(u, fan[i + 1])
        col.set(u, fan[i], shifted)
    col.set(u, fan[w], d)


def _colour_bipartite_edge(col: _Colouring, u: int, v: int) -> None:
    """Colour (u, v) of a bipartite graph with a colour < Δ (König: one alternating-path swap)."""
    c = col.first_free(u)
    d = col.first_free(v)
    if not col.is_free(v, c):
        # The c/d path from v alternates sides and enters u's side only by c-edges, which u lacks,
        # so it never reaches u: after the swap c is free on both ends.
        _invert_path(col, v, d, c)
    col.set(u, v, c)


def _compact(col: _Colouring, edges: Sequence[Edge]) -> None:
    """Move every edge, highest colour first, to the smallest colour free on both of its ends."""
    coloured = sorted(((col.colour(u, v), u, v) for u, v in edges), reverse=True)
    for c, u, v in coloured:
        assert c is not None
        lower = next((k for k in range(c) if col.is_free(u, k) and col.is_free(v, k)), None)
        if lower is not None:
            col.unset(u, v)
            col.set(u, v, lower)


def matching_decomposition(graph: nx.Graph) -> Matchings:
    """Partition the edges of ``graph`` into at most Δ + 1 matchings by proper edge colouring.

    A bipartite graph (even ring, torus with even sides) is coloured with exactly Δ colours by
    König's alternating-path method; any other graph with at most Δ + 1 by Misra–Gries. A greedy
    pass then moves edges to smaller free colours, which can only drop colours. Deterministic:
    edges are coloured in sorted order and ties go to the smallest node or colour. The graph is
    not modified. Returns one sorted list of (min, max) edges per colour, in colour order.
    """
    check_graph(graph)
    neighbours = {u: sorted(graph.neighbors(u)) for u in graph.nodes}
    col = _Colouring(graph.nodes)
    edges = sorted((min(u, v), max(u, v)) for u, v in graph.edges)
    bipartite = nx.is_bipartite(graph)
    for u, v in edges:
        if bipartite:
            _colour_bipartite_edge(col, u, v)
        else:
            _colour_edge(col, neighbours[u], u, v)
    _compact(col, edges)
    classes: dict[int, list[Edge]] = {}
    for u, v in edges:
        c = col.colour(u, v)
        assert c is not None, f"edge ({u}, {v}) left uncoloured"
        classes.setdefault(c, []).append((u, v))
    max_degree = max(d for _, d in graph.degree)
    assert max(classes) <= max_degree, f"Misra–Gries used colour {max(classes)} > Δ = {max_degree}"
    assert not bipartite or max(classes) < max_degree, "König colouring used more than Δ colours"
    return [sorted(classes[c]) for c in sorted(classes)]


def check_matchings(n: int, matchings: Sequence[Sequence[Sequence[int]]]) -> Matchings:
    """Validate matchings on nodes 0..n-1 and return them as lists of (min, max) edges.

    Rejects an empty list, an empty matching, an edge naming a node outside 0..n-1, a node used
    twice in one matching, and an edge that appears in two matchings (or twice in one).
    """
    if len(matchings) == 0:
        raise ValueError("matchings is empty: a topology needs at least one matching")
    _normalise_edges(n, [edge for matching in matchings for edge in matching])  # duplicates across
    out: Matchings = []
    for j, matching in enumerate(matchings):
        if len(matching) == 0:
            raise ValueError(f"matching {j} is empty; drop it")
        edges = _normalise_edges(n, matching)
        owner: dict[int, Edge] = {}
        for edge in edges:
            for node in edge:
                if node in owner:
                    raise ValueError(
                        f"matching {j} is not a matching: node {node} is in both {owner[node]} and {edge}"
                    )
                owner[node] = edge
        out.append(edges)
    return out


def laplacian(n: int, edges: Iterable[Sequence[int]]) -> np.ndarray:
    """Dense float64 Laplacian D - A (n x n) of the graph on nodes 0..n-1 with ``edges``."""
    lap = np.zeros((n, n))
    for u, v in _normalise_edges(n, edges):
        lap[u, u] += 1.0
        lap[v, v] += 1.0
        lap[u, v] -= 1.0
        lap[v, u] -= 1.0
    return lap


def matching_laplacians(n: int, matchings: Sequence[Sequence[Sequence[int]]]) -> list[np.ndarray]:
    """The Laplacian L_j of every matching (validated with :func:`check_matchings`)."""
    return [laplacian(n, matching) for matching in check_matchings(n, matchings)]


def graph_edges(graph: nx.Graph) -> list[Edge]:
    """The edges of ``graph`` as sorted (min, max) pairs."""
    return sorted((min(u, v), max(u, v)) for u, v in graph.edges)
