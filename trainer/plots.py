"""PNG figures rendered with matplotlib (DVC's HTML plots load JavaScript from the internet and
are blank offline)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .fileio import atomic_write

Rows = Sequence[Mapping[str, Any]]

# One colour per method, the same in every figure of every pipeline (matplotlib's tab10/tab20
# hues; fp32 black and fp16 grey as the references). A run name finds its method by its tokens
# (``cifar_dgc-seed1`` -> dgc); names no entry matches get a fixed colour from their hash.
METHOD_COLORS: dict[str, str] = {
    "fp32": "#000000",
    "dense": "#000000",
    "fp32x2": "#555555",  # fp32 at twice the epochs
    "fp16": "#7f7f7f",
    "bf16": "#b0b0b0",
    "topk": "#1f77b4",
    "randomk": "#aec7e8",
    "terngrad": "#ff7f0e",
    "qsgd2": "#98df8a",
    "qsgd4": "#2ca02c",
    "qsgd8": "#1b5e20",
    "dgc": "#d62728",
    "gd": "#ff9896",
    "def": "#9467bd",
    "defa": "#c5b0d5",
    "ef": "#8c564b",
    "exdyna": "#e377c2",
    "powersgd": "#17becf",
    "torchpowersgd": "#0b6e78",  # PyTorch's own hooks: a darker shade of thinwire's method
    "torchfp16": "#3f3f3f",
    "signsgd": "#bcbd22",
    "matcha": "#9edae5",
    "vanilla": "#c49c94",
}
_FALLBACK = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354")


def method_color(name: str) -> str:
    """The colour of the method ``name`` belongs to (see ``METHOD_COLORS``)."""
    import re
    import zlib

    tokens = re.split(r"[_\-\s/.]+", name.lower())
    for token in reversed(tokens):  # "<task>_<method>-seed<k>": the method is the last known token
        if token in METHOD_COLORS:
            return METHOD_COLORS[token]
    return _FALLBACK[zlib.crc32(name.encode()) % len(_FALLBACK)]


def readable_log_axis(ax: Any, axis: str = "y") -> None:
    """A log axis that labels its minor ticks too when it spans under two decades (matplotlib
    otherwise labels a 700-1000 range only as 8x10^2 and 9x10^2), in plain numbers."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    target = ax.yaxis if axis == "y" else ax.xaxis
    low, high = ax.get_ylim() if axis == "y" else ax.get_xlim()
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    target.set_major_formatter(plain)
    if low > 0 and high / low < 100:
        target.set_minor_locator(LogLocator(base=10, subs=(0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)))
        target.set_minor_formatter(plain)


def plot_curves(runs: Mapping[str, tuple[Rows, Rows]], path: str | Path, title: str) -> None:
    """Train loss and test metric against step, one line per run: ``runs[name] = (train, eval)``.

    ``train`` rows have ``step`` and ``train_loss``; ``eval`` rows ``step`` and ``test_accuracy``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for name, (train_rows, eval_rows) in runs.items():
        color = method_color(name)
        ax_loss.plot(
            [r["step"] for r in train_rows], [r["train_loss"] for r in train_rows], label=name, color=color
        )
        ax_acc.plot(
            [r["step"] for r in eval_rows],
            [100 * r["test_accuracy"] for r in eval_rows],
            marker="o",
            label=name,
            color=color,
        )
    ax_loss.set(xlabel="step", ylabel="training loss (mean over ranks)", yscale="log")
    readable_log_axis(ax_loss)
    ax_acc.set(xlabel="step", ylabel="test accuracy (%)")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=110))
    plt.close(fig)
