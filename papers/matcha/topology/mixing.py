"""MATCHA's activation probabilities and mixing weight, and the plan that bundles them.

Wang et al., "MATCHA: Speeding Up Decentralized SGD via Matching Decomposition Sampling"
(arXiv 1905.09435, Sec. 3-4; official code github.com/JYWa/MATCHA, graph_manager.py). Legend:

    n            number of nodes (workers); I the n x n identity, J = 1 1^T / n
    L_j          Laplacian of matching j = 1..M (L_j^2 = 2 L_j)
    B_j^(k)      Bern(p_j) flag: matching j is active at step k (independent over j and k)
    C_b          communication budget in (0, 1]: expected active matchings per step / M
    W^(k)        mixing matrix I - alpha L^(k),  L^(k) = sum_j B_j^(k) L_j
    E[L]         sum_j p_j L_j;  Var = sum_j p_j (1 - p_j) L_j

Step 1, probabilities (a convex program; lambda_2 is concave on Laplacians):

    max_p  lambda_2(sum_j p_j L_j)   s.t.  sum_j p_j <= C_b M,  0 <= p_j <= 1

Step 2, mixing weight: minimise rho = ||E[W^T W] - J||_2 over alpha, where

    E[W^T W] = I - 2 alpha E[L] + alpha^2 (E[L]^2 + 2 Var)

as the SDP  min s  s.t.  (1 - s) I - 2 a E[L] - J + b (E[L]^2 + 2 Var) <= 0 (negative semidefinite),
a >= 0, b >= 0, s >= 0, a^2 <= b. At the optimum b = a^2 (E[L]^2 + 2 Var is PSD), so the constraint
reads I - 2a E[L] + a^2 (E[L]^2 + 2 Var) - J <= s I, i.e. s = lambda_max(E[W^T W] - J), and as
E[W^T W] - J is PSD this is its spectral norm: alpha = a and rho = s itself, not 1 - s (graph 0 with
every matching active: s = 0.654 = (1 - alpha lambda_2)^2, the vanilla rho).

If rho < 1, MATCHA converges at the rate of vanilla decentralized SGD (Theorem 1 of the paper).

The per-step flags B_j^(k) are drawn in :mod:`papers.matcha.topology.activations`.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import networkx as nx
import numpy as np

from .graphs import Matchings, check_graph
from .matching import check_matchings, graph_edges, laplacian, matching_decomposition, matching_laplacians

if TYPE_CHECKING:
    import cvxpy as cp

log = logging.getLogger(__name__)

# CLARABEL (interior point) is accurate to ~1e-8 on these problems; SCS (first order) is the fallback.
SOLVERS = ("CLARABEL", "SCS")
# Largest gap accepted between a solver's answer and its numpy recomputation (CLARABEL: ~1e-8).
_TOL = 1e-5


def check_budget(budget: float) -> float:
    """Return ``budget`` as a float if it is a communication budget C_b in (0, 1]."""
    if isinstance(budget, bool) or not isinstance(budget, int | float | np.floating | np.integer):
        raise ValueError(f"budget C_b must be a number in (0, 1], got {budget!r}")
    value = float(budget)
    if not (math.isfinite(value) and 0 < value <= 1):
        raise ValueError(f"budget C_b must be in (0, 1], got {budget!r}")
    return value


def _check_laplacians(laplacians: Sequence[np.ndarray]) -> list[np.ndarray]:
    if len(laplacians) == 0:
        raise ValueError("laplacians is empty: give one Laplacian per matching")
    out = [np.asarray(lap, dtype=np.float64) for lap in laplacians]
    n = out[0].shape[0] if out[0].ndim == 2 else -1
    for j, lap in enumerate(out):
        if lap.ndim != 2 or lap.shape != (n, n) or n < 2:
            raise ValueError(f"laplacians[{j}] has shape {lap.shape}; all must be n x n with the same n >= 2")
        if not np.allclose(lap, lap.T) or not np.allclose(lap.sum(axis=1), 0):
            raise ValueError(f"laplacians[{j}] is not a Laplacian: it must be symmetric with zero row sums")
    return out


def _check_matching_laplacians(laplacians: Sequence[np.ndarray]) -> list[np.ndarray]:
    out = _check_laplacians(laplacians)
    for j, lap in enumerate(out):
        if not np.allclose(lap @ lap, 2 * lap):
            raise ValueError(f"laplacians[{j}] is not the Laplacian of a matching (L @ L != 2 L)")
    return out


def check_probabilities(p: Sequence[float] | np.ndarray, num_matchings: int) -> np.ndarray:
    """Return ``p`` as a float64 array if it holds ``num_matchings`` probabilities in [0, 1]."""
    arr = np.asarray(p, dtype=np.float64)
    if arr.shape != (num_matchings,):
        raise ValueError(f"p must hold one probability per matching ({num_matchings}), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0) or np.any(arr > 1):
        raise ValueError(f"probabilities p must lie in [0, 1], got {arr.tolist()}")
    return arr


def _cvxpy() -> Any:
    """cvxpy, imported on first use: 1.8 s of every training process's start-up otherwise (it is
    needed only to plan MATCHA's activation probabilities and mixing weight)."""
    import cvxpy

    return cvxpy


def _solve(problem: cp.Problem, what: str, verify: Callable[[], str | None]) -> None:
    """Solve with the first solver in SOLVERS whose answer ``verify()`` accepts (it returns None).

    ``verify`` recomputes the answer's objective with numpy. On degenerate instances (e.g. a torus,
    whose Laplacians share many eigenvalues) CLARABEL reports "optimal_inaccurate" although its answer
    agrees with the recomputation to ~1e-8, so such an answer is kept when verified; cvxpy's warning
    about it is silenced here for that reason.
    """
    cp = _cvxpy()
    failures = []
    for solver in SOLVERS:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Solution may be inaccurate")
            try:
                problem.solve(solver=solver)
            except cp.error.SolverError as err:
                failures.append(f"{solver}: {err}")
                continue
        if problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
            failures.append(f"{solver}: status {problem.status}")
            continue
        complaint = verify()
        if complaint is None:
            if problem.status != cp.OPTIMAL:
                log.debug("%s: %s returned %s; verified", what, solver, problem.status)
            return
        failures.append(f"{solver}: status {problem.status}, {complaint}")
    raise RuntimeError(f"{what}: no solver gave a verified answer ({'; '.join(failures)})")


def algebraic_connectivity(lap: np.ndarray) -> float:
    """lambda_2 of a Laplacian: its second-smallest eigenvalue (> 0 iff the graph is connected)."""
    return float(np.linalg.eigvalsh(np.asarray(lap, dtype=np.float64))[1])


def expected_laplacian(laplacians: Sequence[np.ndarray], p: Sequence[float] | np.ndarray) -> np.ndarray:
    """E[L] = sum_j p_j L_j."""
    laps = _check_laplacians(laplacians)
    probs = check_probabilities(p, len(laps))
    return np.einsum("j,jab->ab", probs, np.stack(laps))


def expected_mixing_matrix(
    laplacians: Sequence[np.ndarray], p: Sequence[float] | np.ndarray, alpha: float
) -> np.ndarray:
    """E[W] = I - alpha E[L]: symmetric and doubly stochastic (rows and columns sum to 1)."""
    mean = expected_laplacian(laplacians, p)
    return np.eye(mean.shape[0]) - float(alpha) * mean


def activation_probabilities(laplacians: Sequence[np.ndarray], budget: float) -> np.ndarray:
    """p maximising lambda_2(sum_j p_j L_j) s.t. sum_j p_j <= C_b M, 0 <= p_j <= 1 (module docstring).

    C_b = 1 returns all ones. The solver's answer is clipped to [0, 1] and, should round-off push
    the sum past C_b M, scaled back onto the budget. The maximiser need not be unique (the solver
    picks one); lambda_2 at it is.
    """
    budget = check_budget(budget)
    laps = _check_laplacians(laplacians)
    num_matchings = len(laps)
    if budget == 1.0:
        return np.ones(num_matchings)
    cp = _cvxpy()
    p = cp.Variable(num_matchings)
    mean = sum((p[j] * laps[j] for j in range(num_matchings)), start=cp.Constant(np.zeros_like(laps[0])))
    # lambda_sum_smallest(L, 2) = lambda_1 + lambda_2 = lambda_2, as lambda_1 = 0 for every p.
    problem = cp.Problem(
        cp.Maximize(cp.lambda_sum_smallest(mean, 2)), [cp.sum(p) <= budget * num_matchings, p >= 0, p <= 1]
    )

    def verify() -> str | None:
        value = np.asarray(p.value, dtype=np.float64)
        if np.any(value < -_TOL) or np.any(value > 1 + _TOL) or value.sum() > budget * num_matchings + _TOL:
            return f"infeasible p = {value.tolist()}"
        exact = algebraic_connectivity(sum(pj * lap for pj, lap in zip(value, laps)))
        objective = float(problem.value)
        if abs(exact - objective) > _TOL:
            return f"objective {objective:.6g} but lambda_2 at p is {exact:.6g}"
        return None

    _solve(problem, f"activation probabilities (C_b = {budget})", verify)
    probs = np.clip(np.asarray(p.value, dtype=np.float64), 0.0, 1.0)
    total = probs.sum()
    if total > budget * num_matchings:
        probs *= budget * num_matchings / total
    return probs


def _scalar(var: cp.Variable) -> float:
    assert var.value is not None, "variable has no value: the problem was not solved"
    return float(np.asarray(var.value))


def _second_moment_terms(laps: Sequence[np.ndarray], probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(E[L], E[L]^2 + 2 Var) with Var = sum_j p_j (1 - p_j) L_j (uses L_j^2 = 2 L_j)."""
    stack = np.stack(laps)
    mean = np.einsum("j,jab->ab", probs, stack)
    var = np.einsum("j,jab->ab", probs * (1 - probs), stack)
    return mean, mean @ mean + 2 * var


def mixing_weight(laplacians: Sequence[np.ndarray], p: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """(alpha, rho): the alpha minimising rho = ||E[W^T W] - J||_2, by the SDP of the module docstring.

    ``laplacians`` must be matching Laplacians (the SDP uses L_j^2 = 2 L_j). rho is the SDP's optimal
    s, accurate to the solver's tolerance (:func:`spectral_norm_rho` recomputes it exactly).
    """
    laps = _check_matching_laplacians(laplacians)
    probs = check_probabilities(p, len(laps))
    n = laps[0].shape[0]
    mean, second = _second_moment_terms(laps, probs)
    mean, second = (mean + mean.T) / 2, (second + second.T) / 2  # exact symmetry for cvxpy's `<<`
    cp = _cvxpy()
    a, b, s = cp.Variable(), cp.Variable(), cp.Variable()
    lhs = (1 - s) * np.eye(n) - 2 * a * mean - np.full((n, n), 1.0 / n) + b * second
    problem = cp.Problem(cp.Minimize(s), [lhs << 0, a >= 0, b >= 0, s >= 0, cp.square(a) <= b])

    def verify() -> str | None:
        alpha, rho = _scalar(a), _scalar(s)
        exact = spectral_norm_rho(laps, probs, alpha)
        if alpha < -_TOL or abs(exact - rho) > _TOL:
            return f"alpha = {alpha:.6g}, s = {rho:.6g} but rho at alpha is {exact:.6g}"
        return None

    _solve(problem, "mixing weight SDP", verify)
    return max(_scalar(a), 0.0), _scalar(s)


def spectral_norm_rho(
    laplacians: Sequence[np.ndarray], p: Sequence[float] | np.ndarray, alpha: float
) -> float:
    """rho = ||E[W^T W] - J||_2 computed directly with numpy, for any Laplacians (not only matchings).

    E[W^T W] = (I - alpha E[L])^2 + alpha^2 sum_j p_j (1 - p_j) L_j^2 (independent flags), so this
    does not rely on the matching identity the SDP uses.
    """
    laps = _check_laplacians(laplacians)
    probs = check_probabilities(p, len(laps))
    n = laps[0].shape[0]
    mean = np.einsum("j,jab->ab", probs, np.stack(laps))
    w_mean = np.eye(n) - alpha * mean
    second = w_mean @ w_mean + alpha**2 * sum(pj * (1 - pj) * lap @ lap for pj, lap in zip(probs, laps))
    return float(np.linalg.norm(second - np.full((n, n), 1.0 / n), ord=2))


def vanilla_weight(graph_laplacian: np.ndarray) -> tuple[float, float]:
    """(alpha, rho) of vanilla decentralized SGD (every link every step): alpha = 2 / (lambda_2 + lambda_max).

    This alpha minimises max(|1 - alpha lambda_2|, |1 - alpha lambda_max|), so
    rho = ||(I - alpha L)^2 - J||_2 = (1 - alpha lambda_2)^2.
    """
    (lap,) = _check_laplacians([graph_laplacian])
    eig = np.linalg.eigvalsh(lap)
    if eig[1] <= 1e-9:
        raise ValueError(f"graph Laplacian has lambda_2 = {eig[1]:.3g}: the graph is disconnected")
    alpha = float(2.0 / (eig[1] + eig[-1]))
    return alpha, spectral_norm_rho([lap], [1.0], alpha)


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr = np.array(arr, dtype=np.float64)
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)  # eq on arrays is ambiguous: plans compare by identity
class MatchaPlan:
    """Everything a MATCHA run precomputes for one base graph and budget (arrays are read-only).

    num_nodes: n; matchings: edge lists, (min, max) pairs; laplacians: L_j (n x n each);
    budget: C_b; p: activation probability of each matching; alpha: mixing weight;
    rho: ||E[W^T W] - J||_2 at alpha (from the SDP).
    """

    num_nodes: int
    matchings: tuple[tuple[tuple[int, int], ...], ...]
    laplacians: tuple[np.ndarray, ...]
    budget: float
    p: np.ndarray
    alpha: float
    rho: float

    @property
    def num_matchings(self) -> int:
        return len(self.matchings)

    @property
    def expected_laplacian(self) -> np.ndarray:
        return expected_laplacian(self.laplacians, self.p)

    @property
    def algebraic_connectivity(self) -> float:
        """lambda_2(E[L]): the objective of the probability program."""
        return algebraic_connectivity(self.expected_laplacian)

    @property
    def expected_cost(self) -> float:
        """Expected active matchings per step (communication time units), sum_j p_j <= C_b M."""
        return float(self.p.sum())

    def neighbours(self, rank: int, flags: Sequence[bool] | np.ndarray) -> list[int]:
        """The partners of ``rank`` in the matchings active under ``flags`` (one bool per matching)."""
        active = np.asarray(flags, dtype=bool)
        if active.shape != (self.num_matchings,):
            raise ValueError(
                f"flags must hold one bool per matching ({self.num_matchings}), got {active.shape}"
            )
        out: list[int] = []
        for matching, on in zip(self.matchings, active):
            if on:
                out.extend(v if u == rank else u for u, v in matching if rank in (u, v))
        return out


def plan(graph: nx.Graph, budget: float, matchings: Matchings | None = None) -> MatchaPlan:
    """Decompose ``graph`` (unless ``matchings`` is given), then solve for p and alpha at budget C_b.

    Given ``matchings`` (e.g. :func:`paper_matchings`) must partition the graph's edges exactly.
    """
    n = check_graph(graph)
    budget = check_budget(budget)
    if matchings is None:
        matchings = matching_decomposition(graph)
    else:
        matchings = check_matchings(n, matchings)
        covered = sorted(edge for matching in matchings for edge in matching)
        edges = graph_edges(graph)
        if covered != edges:
            missing = sorted(set(edges) - set(covered))
            extra = sorted(set(covered) - set(edges))
            raise ValueError(
                f"matchings must partition the graph's edges: missing {missing[:5]}, not in the graph {extra[:5]}"
            )
    laps = matching_laplacians(n, matchings)
    probs = activation_probabilities(laps, budget)
    alpha, rho = mixing_weight(laps, probs)
    return MatchaPlan(
        num_nodes=n,
        matchings=tuple(tuple(m) for m in matchings),
        laplacians=tuple(_readonly(lap) for lap in laps),
        budget=budget,
        p=_readonly(probs),
        alpha=alpha,
        rho=rho,
    )


def base_laplacian(graph: nx.Graph) -> np.ndarray:
    """The Laplacian of the whole base graph (dense float64)."""
    return laplacian(check_graph(graph), graph_edges(graph))
