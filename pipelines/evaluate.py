"""The evaluate stage: every trained run of a group measured on the whole test split.

    python -m pipelines.evaluate suite cifar_3

reads ``results/<pipeline>/runs/<group>/<run>/seed<k>/run.json`` and the ``model.pt`` it points to
(under ``artifacts/``, git-ignored: the model as the training run last evaluated it), rebuilds each model in this process, evaluates it on its
data set's entire test split and writes ``results/<pipeline>/evaluations/<group>/<run>/seed<k>.json``.
Each evaluation is its own MLflow run in its training runs' experiment (the pipeline's, or
``scratch-<pipeline>`` for a ``--root`` outside ``results/``), named ``<run>-seed<k>-evaluate``,
nested under its training run (``mlflow.parentRunId``) and tagged with that run's id, so the
training curve and the final measurement sit side by side in the UI.

A run without ``model.pt`` (a fresh clone: final models are not committed; DVC reruns this stage
only when its run folders change, i.e. after their training ran here) fails the stage with the
folder named: a stale result is never reported as evaluated.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Collection
from pathlib import Path

from harness.entry import quiet_environment, setup_logging
from harness.folders import RESULTS_DIR, pipeline_name
from harness.params import load_params
from trainer import MODEL_FILE, evaluate_trained, trained_model_file
from trainer.fileio import atomic_write_json
from trainer.tracking import Tracker, experiment_for, git_sha


def trained_runs(group_dir: Path, defined: Collection[str] | None = None) -> list[Path]:
    """The ``<run>/seed<k>`` folders of a group that finished training (their ``metrics.json``),
    only those of runs in ``defined`` (the pipeline's params) when given: a folder a run that no
    longer exists left behind (the train stages' outputs persist) is said and skipped."""
    folders = sorted(p.parent for p in group_dir.glob("*/seed*/metrics.json"))
    if defined is None:
        return folders
    stale = sorted({f.parent.name for f in folders if f.parent.name not in defined})
    if stale:
        print(
            f"{group_dir}: skipping {', '.join(stale)}: not a run of this pipeline's params.yaml "
            "(left over from an earlier version; delete the folder to silence this)",
            file=sys.stderr,
        )
    return [f for f in folders if f.parent.name in defined]


def evaluate_group(
    pipeline: str, group: str, *, root: Path | None = None, track: bool = True
) -> list[dict[str, object]]:
    """Evaluate ``<root>/runs/<group>/*/seed*`` into ``<root>/evaluations/<group>/`` (``root``
    defaults to ``results/<pipeline>``)."""
    root = root or RESULTS_DIR / pipeline
    runs_dir = root / "runs" / group
    folders = trained_runs(runs_dir, load_params(pipeline).get("runs") or {})
    if not folders:
        raise SystemExit(
            f"error: no trained runs in {runs_dir}: run the group's train stage first "
            f"(dvc repro pipelines/{pipeline}/dvc.yaml)"
        )
    missing = []
    for folder in folders:
        try:
            trained_model_file(folder)
        except FileNotFoundError:
            missing.append(str(folder))
    if missing:
        raise SystemExit(
            f"error: no {MODEL_FILE} for {', '.join(missing)} (final models are not committed): "
            "retrain those runs here (dvc repro -f <their train stage>) to make them"
        )
    out_root = root / "evaluations" / group
    sha = git_sha()
    rows = []
    for folder in folders:
        run, seed = folder.parent.name, folder.name
        info = json.loads((folder / "run.json").read_text())
        result = evaluate_trained(folder)
        row: dict[str, object] = {
            "run": run,
            "seed": int(seed.removeprefix("seed")),
            **result,
            "training_run_id": info.get("mlflow_run_id"),
            "training_git_sha": info.get("git_sha"),
            "git_sha": sha,
        }
        name = f"{run}-{seed}-evaluate"
        tracker = Tracker(experiment_for(pipeline_name(pipeline), root, RESULTS_DIR), name, enabled=track)
        tags = {"stage": "evaluate", "group": group, "method": run, "git_sha": sha}
        if info.get("mlflow_run_id"):
            tags |= {"training_run_id": info["mlflow_run_id"], "mlflow.parentRunId": info["mlflow_run_id"]}
        row["mlflow_run_id"] = tracker.start({"run": run, "seed": row["seed"], "split": "test"}, tags)
        out = out_root / run / f"{seed}.json"
        atomic_write_json(out, row)
        tracker.log_metrics({k: v for k, v in result.items() if math.isfinite(v)}, 0)
        tracker.log_artifact(out)
        tracker.finish("FINISHED")
        rows.append(row)
        metric = (
            f"perplexity {result['test_perplexity']:.3f}"
            if "test_perplexity" in result
            else f"accuracy {100 * result['test_accuracy']:.2f} %"
        )
        print(f"{run}/{seed}: {metric} on {int(result['test_examples'])} test examples", file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("pipeline", help="a folder of pipelines/ whose runs/<group>/ was trained")
    parser.add_argument("group", help="the group (a train stage's folder under results/<pipeline>/runs/)")
    parser.add_argument(
        "--root", default=None, help="folder holding runs/ and evaluations/ (default: results/<pipeline>)"
    )
    args = parser.parse_args(argv)
    quiet_environment()
    setup_logging()
    evaluate_group(args.pipeline, args.group, root=Path(args.root) if args.root else None)


if __name__ == "__main__":
    main()
