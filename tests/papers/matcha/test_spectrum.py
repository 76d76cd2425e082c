"""papers.matcha.spectrum: the paper's figure of rho and lambda_2(E[L]) against the budget."""

from __future__ import annotations

import pytest

from papers.matcha.spectrum import plot_spectrum
from papers.matcha.topology import paper_graph, paper_matchings, plan, ring

BUDGETS = (0.1, 0.3, 0.5, 1.0)


def test_plot_spectrum(tmp_path):
    path = tmp_path / "spectrum.png"
    plot_spectrum([plan(paper_graph(0), b, paper_matchings(0)) for b in BUDGETS], path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="share one graph"):
        plot_spectrum([plan(paper_graph(0), 0.5, paper_matchings(0)), plan(ring(8), 0.5)], path)
