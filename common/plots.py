"""PNG figures rendered with matplotlib (DVC's HTML plots load JavaScript from the internet and
are blank offline)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .fileio import atomic_write

Rows = Sequence[Mapping[str, Any]]


def plot_curves(runs: Mapping[str, tuple[Rows, Rows]], path: str | Path, title: str) -> None:
    """Train loss and test metric against step, one line per run: ``runs[name] = (train, eval)``.

    ``train`` rows have ``step`` and ``train_loss``; ``eval`` rows ``step`` and ``test_accuracy``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for name, (train_rows, eval_rows) in runs.items():
        ax_loss.plot([r["step"] for r in train_rows], [r["train_loss"] for r in train_rows], label=name)
        ax_acc.plot(
            [r["step"] for r in eval_rows],
            [100 * r["test_accuracy"] for r in eval_rows],
            marker="o",
            label=name,
        )
    ax_loss.set(xlabel="step", ylabel="training loss (mean over ranks)", yscale="log")
    ax_acc.set(xlabel="step", ylabel="test accuracy (%)")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=110))
    plt.close(fig)
