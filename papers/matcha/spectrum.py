"""The paper's spectral figure: rho and lambda_2(E[L]) of MATCHA plans against the budget C_b."""

from __future__ import annotations

import os
from collections.abc import Sequence

from papers.matcha.topology.mixing import MatchaPlan
from trainer.fileio import atomic_write


def plot_spectrum(plans: Sequence[MatchaPlan], path: str | os.PathLike[str], title: str = "") -> None:
    """Two panels against C_b for plans of one graph and one decomposition: rho, and lambda_2(E[L]).

    rho < 1 is the convergence condition (dotted line); the vanilla value (C_b = 1, every matching
    every step) is drawn dashed when a plan with budget 1 is among ``plans``. Written as a PNG,
    atomically.
    """
    if len(plans) == 0:
        raise ValueError("plans is empty: give at least one MatchaPlan")
    first = plans[0]
    for plan in plans[1:]:
        if plan.num_nodes != first.num_nodes or plan.matchings != first.matchings:
            raise ValueError(
                f"plans must share one graph and decomposition; the plan at C_b = {plan.budget} differs "
                f"from the one at C_b = {first.budget}"
            )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = sorted(plans, key=lambda plan: plan.budget)
    budgets = [plan.budget for plan in ordered]
    fig, (ax_rho, ax_lam) = plt.subplots(1, 2, figsize=(10, 4))
    ax_rho.plot(budgets, [plan.rho for plan in ordered], marker="o", label="MATCHA")
    ax_rho.axhline(1.0, color="grey", linestyle=":", label="rho = 1 (no convergence guarantee)")
    ax_lam.plot(budgets, [plan.algebraic_connectivity for plan in ordered], marker="o", label="MATCHA")
    vanilla = [plan for plan in ordered if plan.budget == 1.0]
    if vanilla:
        ax_rho.axhline(vanilla[0].rho, color="C1", linestyle="--", label="vanilla (C_b = 1)")
        ax_lam.axhline(
            vanilla[0].algebraic_connectivity, color="C1", linestyle="--", label="vanilla (C_b = 1)"
        )
    ax_rho.set(xlabel="communication budget C_b", ylabel="spectral norm rho = ||E[W^T W] - J||")
    ax_lam.set(xlabel="communication budget C_b", ylabel="algebraic connectivity lambda_2(E[L])")
    for ax in (ax_rho, ax_lam):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title or f"MATCHA, {first.num_nodes} nodes, {first.num_matchings} matchings")
    fig.tight_layout()
    atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=110))
    plt.close(fig)
