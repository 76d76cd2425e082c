"""The cross-paper summary: every claim in one table, then every pipeline's report (root ``summary`` stage).

    python -m pipelines.summary

The claims table gathers every ``results/<pipeline>/report.json``'s ``claims``, each judged by
:mod:`harness.verdict` over seeds (ours against its baseline with the 95 % interval of the
difference; release 2 judges time, density, cost and memory claims this way too), beside the
paper's own figure (a claim's ``paper``). A report's ``not_tested`` (claims of the paper no run
here can decide, and why) is listed under the table and never counted as a verdict. It names the
commits every run recorded (:func:`run_shas`). Then each ``report.md`` follows, its headings one
level down.
"""

from __future__ import annotations

import json
from typing import Any

from harness.claims import format_value, unit
from harness.entry import quiet_environment
from harness.folders import RESULTS_DIR
from trainer.fileio import atomic_write_text

VERDICTS = ("reproduced", "not reproduced", "inconclusive")
# Why a judged claim is inconclusive, from the reason harness.verdict.judge gives it.
WHY_INCONCLUSIVE = {
    "too few seeds": "run(s) on one side",
    "an interval straddling a bound": "straddles a bound",
    "a baseline that failed or lacks its convergence check": "baseline ",
}


def why_inconclusive(reason: str) -> str:
    """The kind of an inconclusive judged claim's reason (see WHY_INCONCLUSIVE), or "other"."""
    return next((kind for kind, words in WHY_INCONCLUSIVE.items() if words in reason), "other")


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def judged_row(pipeline: str, claim: dict[str, Any]) -> str:
    """A claim judged over seeds: ours and the baseline's means, Δ with its 95 % interval."""
    m = claim["metric"]
    low, high = claim["low"], claim["high"]
    interval = (
        "none (1 seed)"
        if low is None or high is None
        else f"[{format_value(low, m)}, {format_value(high, m)}]"
    )
    ours = (
        f"{format_value(claim['method_mean'], m)} against {format_value(claim['baseline_mean'], m)}: "
        f"Δ {format_value(claim['difference'], m, signed=True)}{unit(m)[0]}"
    )
    verdict = claim["verdict"] if claim["verdict"] == "inconclusive" else f"**{claim['verdict']}**"
    cells = (
        f"{pipeline}: {claim['claim']}",
        claim.get("paper", "-"),
        ours,
        interval,
        f"{claim['seeds'][0]} vs {claim['seeds'][1]}",
        claim["bound"],
        verdict,
        claim["reason"],
    )
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def run_shas() -> dict[str, set[str]]:
    """pipeline -> the commits its runs recorded: the ``git_sha`` of every ``run.json`` under
    ``results/<pipeline>/`` and of sparse AxoNN's ``prune.json`` (the suite's ``recipe_pilot``, the
    pilot that chose the recipes, is history, not a stage's output, and is left out)."""
    found: dict[str, set[str]] = {}
    files = [*RESULTS_DIR.rglob("run.json"), *RESULTS_DIR.glob("*/prune.json")]
    for path in sorted(files):
        parts = path.relative_to(RESULTS_DIR).parts
        if "recipe_pilot" in parts:
            continue
        sha = json.loads(path.read_text()).get("git_sha")
        if isinstance(sha, str):
            found.setdefault(parts[0], set()).add(sha)
    return found


def claims_section() -> str:
    lines, counts, sources = [], dict.fromkeys(VERDICTS, 0), []
    why: dict[str, int] = {}
    untested: list[str] = []
    for path in sorted(RESULTS_DIR.glob("*/report.json")):
        report = json.loads(path.read_text())
        if "measured_claims" in report:
            raise SystemExit(
                f"{path} has 'measured_claims', which release 2 replaced by claims judged over seeds: "
                f"rerun that pipeline's report stage (dvc repro <its dvc.yaml>:report)"
            )
        judged = report.get("claims") or []
        pipeline = path.parent.name
        untested += [f"- {pipeline}: {c['paper']}: {c['why']}." for c in report.get("not_tested") or []]
        if not judged:
            continue
        sources.append(pipeline)
        for claim in judged:
            lines.append(judged_row(pipeline, claim))
            counts[claim["verdict"]] += 1
            if claim["verdict"] == "inconclusive":
                kind = why_inconclusive(claim["reason"])
                why[kind] = why.get(kind, 0) + 1
    if not lines:
        return ""
    short = why.get("too few seeds", 0)
    return (
        "\n## Every claim\n\n"
        f"From the reports of {', '.join(sources)}: {counts['reproduced']} reproduced, "
        f"{counts['not reproduced']} not reproduced, {counts['inconclusive']} inconclusive"
        + (f" ({', '.join(f'{n} for {kind}' for kind, n in why.items())})" if why else "")
        + ". "
        + (
            f"**{short} claim(s) are inconclusive for lack of seeds**: their pipelines have runs to add.\n\n"
            if short
            else "No claim is inconclusive for lack of seeds.\n\n"
        )
        + "Δ = ours minus the baseline it is compared with (accuracy in points, losses in nats, "
        "times in seconds), with its 95 % interval over seeds (harness/verdict.py); reproduced when the "
        "interval lies inside the claim on Δ, not reproduced when outside it, inconclusive when it "
        "straddles a bound, with too few seeds, or when the baseline failed its convergence check "
        "(release 2: fp32 at twice the epochs moved by the claims' tolerance or more). The paper's "
        "figures come from `../shared/research/papers.md` with its confidence tags ([ABS] abstract, "
        "[CODE] official code, [POSTER], [MEM] from memory of the paper: verify).\n\n"
        "| claim | the paper | ours | 95 % interval | seeds | claim on Δ | verdict | why |\n"
        "|---|---|---|---|---|---|---|---|\n"
        + "\n".join(lines)
        + "\n"
        + (
            "\nClaims of the papers that no run here can decide (listed, not counted):\n\n"
            + "\n".join(untested)
            + "\n"
            if untested
            else ""
        )
    )


def commits_section() -> str:
    shas = run_shas()
    if not shas:
        return ""
    every = sorted(set().union(*shas.values()))
    per = "; ".join(f"{p} {', '.join(sorted(s))}" for p, s in sorted(shas.items()))
    head = (
        f"Every run recorded git {every[0]}."
        if len(every) == 1
        else f"The runs recorded {len(every)} commits: {per}."
    )
    return f"\n{head}\n"


def main() -> None:
    quiet_environment()
    parts = [
        "# thinwire: summary of all pipelines\n",
        "Generated by `python -m pipelines.summary` from `results/*/report.json` and `results/*/report.md`.\n",
        commits_section(),
        claims_section(),
    ]
    for path in sorted(RESULTS_DIR.glob("*/report.md")):
        text = path.read_text()
        # every report's headings one level down, under this page's title
        parts.append(
            "\n"
            + "\n".join("#" + line if line.startswith("#") else line for line in text.splitlines())
            + "\n"
        )
    atomic_write_text(RESULTS_DIR / "summary.md", "".join(parts))
    print("".join(parts))


if __name__ == "__main__":
    main()
