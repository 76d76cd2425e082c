"""Topology math for decentralized SGD and MATCHA (Wang et al., arXiv 1905.09435): pure numpy,
networkx and cvxpy; no torch, no matplotlib (MATCHA's spectral figure is papers/matcha/spectrum.py).

MATCHA in four steps, all precomputed before training (:func:`plan`):

1. split the base graph's edges into matchings G_1..G_M (:func:`matching_decomposition`, at most
   Δ + 1 of them; or the official code's split, :func:`paper_matchings`);
2. choose activation probabilities p maximising lambda_2(sum_j p_j L_j) under the communication
   budget sum_j p_j <= C_b M (:func:`activation_probabilities`);
3. choose the mixing weight alpha minimising rho = ||E[W^T W] - J||_2 for W = I - alpha sum_j B_j L_j,
   B_j ~ Bern(p_j) (:func:`mixing_weight`); rho < 1 guarantees convergence;
4. draw the flags B_j^(k) from a generator seeded identically on every rank (:func:`draw_activations`).
   At step k a rank averages with its partners in the active matchings:
   x_i <- x_i + alpha sum_{n active partner} (x_n - x_i).
"""

from .activations import draw_activations, periodic_activations, periodic_period, vanilla_activations
from .graphs import (
    PAPER_GRAPHS,
    Edge,
    Matchings,
    check_graph,
    erdos_renyi,
    from_edge_list,
    paper_graph,
    paper_matchings,
    random_geometric,
    ring,
    torus,
)
from .matching import check_matchings, graph_edges, laplacian, matching_decomposition, matching_laplacians
from .mixing import (
    MatchaPlan,
    activation_probabilities,
    algebraic_connectivity,
    base_laplacian,
    check_budget,
    check_probabilities,
    expected_laplacian,
    expected_mixing_matrix,
    mixing_weight,
    plan,
    spectral_norm_rho,
    vanilla_weight,
)

__all__ = [
    "PAPER_GRAPHS",
    "Edge",
    "MatchaPlan",
    "Matchings",
    "activation_probabilities",
    "algebraic_connectivity",
    "base_laplacian",
    "check_budget",
    "check_graph",
    "check_matchings",
    "check_probabilities",
    "draw_activations",
    "erdos_renyi",
    "expected_laplacian",
    "expected_mixing_matrix",
    "from_edge_list",
    "graph_edges",
    "laplacian",
    "matching_decomposition",
    "matching_laplacians",
    "mixing_weight",
    "paper_graph",
    "paper_matchings",
    "periodic_activations",
    "periodic_period",
    "plan",
    "random_geometric",
    "ring",
    "spectral_norm_rho",
    "torus",
    "vanilla_activations",
    "vanilla_weight",
]
