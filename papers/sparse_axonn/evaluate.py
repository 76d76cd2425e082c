"""The evaluate stage: the dense model and every pruned, retrained one on the whole test split.

    python -m papers.sparse_axonn.evaluate                    # reads results/sparse_axonn
    python -m papers.sparse_axonn.evaluate --root /tmp/prune  # a prune stage's --out

Reads the prune stage's ``prune.json``, ``models/<name>.pt`` (the weights after training: dense, and
each mask's retrained model) and ``masks/<name>.pt``; rebuilds the GPT-2 of the recorded scale in
this process, checks that every pruned entry of a pruned model is exactly zero (a model that is not
the pruned one fails the stage, named), and measures the next-character cross-entropy over every
window of Tiny Shakespeare's test split (and the validation split, whole). Writes
``evaluations/<name>.json`` beside them; each is its own MLflow run in the ``sparse_axonn``
experiment, ``<name>-evaluate``, nested under the prune run (``mlflow.parentRunId``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

from trainer.fileio import atomic_write_json
from trainer.tracking import Tracker, experiment_for, git_sha

from .config import ScaleConfig
from .model import build_gpt2, evaluate, load_split
from .params import OUT, PIPELINE
from .pruning import load_masks, pruned_nonzero


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SystemExit(
            f"error: {path} is missing: run the prune stage first (dvc repro pipelines/sparse_axonn/dvc.yaml:prune)"
        ) from None


def evaluate_models(root: Path, *, track: bool = True) -> list[dict[str, Any]]:
    """Evaluate ``root/models/*.pt`` into ``root/evaluations/``; returns the rows."""
    record = _read_json(root / "prune.json")
    config = ScaleConfig.from_dict(record["scale_config"])
    names = ["dense", *record["masks"]]
    missing = [str(root / "models" / f"{n}.pt") for n in names if not (root / "models" / f"{n}.pt").exists()]
    if missing:
        raise SystemExit(
            f"error: no trained weights {', '.join(missing)}: rerun the prune stage (it writes models/)"
        )
    train = load_split(config, "train")
    splits = {"test": load_split(config, "test"), "val": load_split(config, "val")}
    sha = git_sha()
    rows = []
    for name in names:
        torch.manual_seed(config.seed)
        model = build_gpt2(config.model, len(train.vocab))
        state = torch.load(root / "models" / f"{name}.pt", map_location="cpu", weights_only=True)
        model.load_state_dict(state)
        row: dict[str, Any] = {"model": name, "git_sha": sha, "prune_run_id": record.get("mlflow_run_id")}
        if name != "dense":
            saved = load_masks(root / "masks" / f"{name}.pt", model)
            bad = {n: c for n, c in pruned_nonzero(model, saved.masks).items() if c}
            if bad:
                raise SystemExit(
                    f"error: models/{name}.pt is not the pruned model of masks/{name}.pt: "
                    f"{', '.join(f'{n} has {c} nonzero pruned entries' for n, c in bad.items())}"
                )
            row["sparsity"] = saved.sparsity
        else:
            row["sparsity"] = 0.0
        for split, data in splits.items():
            result = evaluate(model, data)
            row[f"{split}_loss"] = result["loss"]
            row[f"{split}_perplexity"] = result["perplexity"]
            row[f"{split}_windows"] = len(data)
        tracker = Tracker(experiment_for(PIPELINE, root, OUT), f"{name}-evaluate", enabled=track)
        tags = {"stage": "evaluate", "model": name, "git_sha": sha}
        if record.get("mlflow_run_id"):
            tags |= {
                "training_run_id": record["mlflow_run_id"],
                "mlflow.parentRunId": record["mlflow_run_id"],
            }
        row["mlflow_run_id"] = tracker.start(
            {"model": name, "split": "test", "sparsity": row["sparsity"]}, tags
        )
        out = root / "evaluations" / f"{name}.json"
        atomic_write_json(out, row)
        metrics = {k: float(v) for k, v in row.items() if k.endswith(("_loss", "_perplexity"))}
        tracker.log_metrics({k: v for k, v in metrics.items() if math.isfinite(v)}, 0)
        tracker.log_artifact(out)
        tracker.finish("FINISHED")
        rows.append(row)
        print(
            f"{name}: test perplexity {row['test_perplexity']:.3f} ({row['test_windows']} windows), "
            f"sparsity {100 * row['sparsity']:.1f} %",
            file=sys.stderr,
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", default=None, help=f"the prune stage's output folder (default {OUT})")
    args = parser.parse_args(argv)
    from harness.entry import quiet_environment, setup_logging

    quiet_environment()
    setup_logging()
    evaluate_models(Path(args.root).resolve() if args.root else OUT)


if __name__ == "__main__":
    main()
