"""Committed runs into a fresh MLflow store: params, curves, nesting, the training view, idempotence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines import mlflow_import


def _run(folder: Path, run_id: str, accuracy: float) -> None:
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(
        json.dumps(
            {
                "mlflow_run_id": run_id,
                "git_sha": "abc1234",
                "fingerprint": "f00d",
                "config": {"lr": 0.4, "compressor_options": {"density": 0.001}, "lr_milestones": [30, 60]},
            }
        )
    )
    (folder / "metrics.json").write_text(json.dumps({"test_accuracy": accuracy, "steps": 20.0, "bad": None}))
    (folder / "train_curve.csv").write_text("step,epoch,train_loss,lr\n10,0,2.0,0.4\n20,0,1.5,0.2\n")
    (folder / "eval_curve.csv").write_text(f"step,epoch,test_accuracy\n20,0,{accuracy}\n")
    (folder / "model.pt").write_bytes(b"not an artifact")


@pytest.fixture()
def results(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    _run(root / "suite" / "runs" / "g" / "cifar_dgc" / "seed0", "a" * 32, 0.81)
    _run(root / "baseline" / "fp32", "b" * 32, 0.98)
    evaluation = root / "suite" / "evaluations" / "g" / "cifar_dgc" / "seed0.json"
    evaluation.parent.mkdir(parents=True)
    evaluation.write_text(
        json.dumps(
            {
                "run": "cifar_dgc",
                "seed": 0,
                "test_accuracy": 0.8123,
                "test_examples": 10000.0,
                "training_run_id": "a" * 32,
                "mlflow_run_id": "c" * 32,
                "git_sha": "abc1234",
            }
        )
    )
    (root / "suite" / "report.md").write_text("# report\n")
    return root


def test_fresh_store_gets_every_run_nested_and_in_the_training_view(results: Path, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'fresh.db'}"
    records = mlflow_import.collect(results)
    assert mlflow_import.import_records(records, uri) == {"imported": 4}
    client = MlflowClient(tracking_uri=uri)
    suite = client.get_experiment_by_name("suite")
    assert suite.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = {r.info.run_name: r for r in client.search_runs([suite.experiment_id])}
    assert set(runs) == {"g/cifar_dgc/seed0", "cifar_dgc-seed0-evaluate", "report"}
    train = runs["g/cifar_dgc/seed0"]
    assert train.data.tags["thinwire.original_run_id"] == "a" * 32
    assert train.data.params["compressor_options.density"] == "0.001"
    assert train.data.params["lr_milestones"] == "[30, 60]"
    assert train.data.metrics["final_test_accuracy"] == 0.81
    history = client.get_metric_history(train.info.run_id, "train_loss")
    assert [(m.step, m.value) for m in history] == [(10, 2.0), (20, 1.5)]
    evaluation = runs["cifar_dgc-seed0-evaluate"]
    assert evaluation.data.tags["mlflow.parentRunId"] == train.info.run_id
    assert evaluation.data.metrics["test_accuracy"] == 0.8123
    artifacts = {a.path for a in client.list_artifacts(train.info.run_id)}
    assert {"run.json", "metrics.json", "train_curve.csv", "eval_curve.csv"} <= artifacts
    assert "model.pt" not in artifacts
    # again: nothing new
    assert mlflow_import.import_records(mlflow_import.collect(results), uri) == {"skipped": 4}
    # every id a summary quotes is in the store, as a run or as a run's original id
    quoted = f"| `{'a' * 32}` | `{train.info.run_id}` | `{'c' * 32}` | `{'f' * 32}` |"
    assert mlflow_import.missing_ids(quoted, uri) == ["f" * 32]


def test_sparse_axonns_prune_run_and_its_evaluations_are_imported(results: Path, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    sparse = results / "sparse_axonn"
    (sparse / "evaluations").mkdir(parents=True)
    (sparse / "prune.json").write_text(
        json.dumps(
            {
                "mlflow_run_id": "d" * 32,
                "git_sha": "abc1234",
                "wall_seconds": 12.5,
                "scale_config": {"steps": 40},
            }
        )
    )
    (sparse / "prune.md").write_text("# prune\n")
    (sparse / "evaluations" / "dense.json").write_text(
        json.dumps(
            {
                "mlflow_run_id": "e" * 32,
                "prune_run_id": "d" * 32,
                "model": "dense",
                "sparsity": 0.0,
                "test_loss": 1.7,
            }
        )
    )
    uri = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert mlflow_import.import_records(mlflow_import.collect(results), uri) == {"imported": 6}
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("sparse_axonn")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"prune", "dense-evaluate"}
    prune = runs["prune"]
    assert prune.data.tags["thinwire.original_run_id"] == "d" * 32
    assert prune.data.params["steps"] == "40" and prune.data.metrics["wall_seconds"] == 12.5
    evaluation = runs["dense-evaluate"]
    assert evaluation.data.tags["mlflow.parentRunId"] == prune.info.run_id
    assert evaluation.data.metrics["test_loss"] == 1.7


def test_listing_counts_per_experiment(results: Path) -> None:
    text = mlflow_import.listing(mlflow_import.collect(results))
    assert "| suite | 1 | 1 | 1 |" in text and "| baseline | 1 | 0 | 0 |" in text
