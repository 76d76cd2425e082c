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
    metrics = {
        "test_accuracy": accuracy,
        "steps": 20.0,
        "bad": None,
        "compression_factor": 32.0,
        "wall_seconds": 90.0,
    }
    (folder / "metrics.json").write_text(json.dumps(metrics))
    (folder / "train_curve.csv").write_text(
        "step,epoch,train_loss,lr,wall_seconds\n10,0,2.0,0.4,45.0\n20,0,1.5,0.2,90.0\n"
    )
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
    # the charts are the curves: a final value is its curve's last point, the rest summary tags
    assert train.data.metrics == {"train_loss": 1.5, "lr": 0.2, "wall_seconds": 90.0, "test_accuracy": 0.81}
    summary = {k: v for k, v in train.data.tags.items() if k.startswith("summary.")}
    assert summary == {"summary.steps": "20.0", "summary.compression_factor": "32.0"}
    history = client.get_metric_history(train.info.run_id, "train_loss")
    assert [(m.step, m.value) for m in history] == [(10, 2.0), (20, 1.5)]
    # the run's own times: ended when its metrics.json was written, started its training time before
    end = int(
        (results / "suite" / "runs" / "g" / "cifar_dgc" / "seed0" / "metrics.json").stat().st_mtime * 1000
    )
    assert (train.info.start_time, train.info.end_time) == (end - 90_000, end)
    assert [m.timestamp for m in history] == [end - 45_000, end]
    assert train.data.tags["thinwire.times"] == "file time; start = end - wall_seconds"
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


def test_imported_runs_carry_the_readmes_tags_and_their_recorded_times(tmp_path: Path) -> None:
    """Tags a run logs (stage, pipeline, method, world_size, scale) on runs whose run.json predates
    recording them: the scale and DVC stage from the dvc.lock whose outputs hold the run. A run.json
    that records its tags and times is taken as it is."""
    from mlflow.tracking import MlflowClient

    results = tmp_path / "results"
    old = results / "suite" / "runs" / "g" / "cifar_dgc" / "seed1"
    _run(old, "a" * 32, 0.8)
    info = json.loads((old / "run.json").read_text())
    (old / "run.json").write_text(json.dumps({**info, "config": {**info["config"], "world_size": 2}}))
    lock = tmp_path / "pipelines" / "suite" / "dvc.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text(
        "schema: '2.0'\nstages:\n  train@g:\n    cmd: python -m pipelines.launch suite cifar_dgc --seeds 1 "
        "--out results/suite/runs/g\n    params:\n      pipelines/suite/params.yaml:\n        scale: cpu\n"
        "    outs:\n    - path: results/suite/runs/g\n"
    )
    evaluation = results / "suite" / "evaluations" / "g" / "cifar_dgc" / "seed1.json"
    evaluation.parent.mkdir(parents=True)
    evaluation.write_text(
        json.dumps({"run": "cifar_dgc", "seed": 1, "test_accuracy": 0.8, "mlflow_run_id": "c" * 32})
    )
    new = results / "baseline" / "fp32"
    _run(new, "b" * 32, 0.9)
    recorded = {"stage": "fp32", "scale": "paper", "device": "cuda", "backend": "nccl", "world_size": "8"}
    info = json.loads((new / "run.json").read_text())
    times = {"started_at": "2026-12-03T21:00:00Z", "ended_at": "2026-12-03T21:15:22Z"}
    (new / "run.json").write_text(json.dumps({**info, "tags": recorded, **times}))

    uri = f"sqlite:///{tmp_path / 'fresh.db'}"
    mlflow_import.import_records(mlflow_import.collect(results), uri)
    client = MlflowClient(tracking_uri=uri)
    runs = {
        r.info.run_name: r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
    }
    derived = runs["g/cifar_dgc/seed1"].data.tags
    assert {
        k: derived.get(k) for k in ("stage", "pipeline", "method", "world_size", "scale", "dvc_stage")
    } == {
        "stage": "cifar_dgc-seed1",
        "pipeline": "suite",
        "method": "cifar_dgc",
        "world_size": "2",
        "scale": "cpu",
        "dvc_stage": "pipelines/suite/dvc.yaml:train@g",
    }
    assert derived["git_sha"] == "abc1234" and derived["fingerprint"] == "f00d"
    found = client.search_runs([runs["g/cifar_dgc/seed1"].info.experiment_id], "tags.scale = 'cpu'")
    assert sorted(r.info.run_name for r in found) == ["cifar_dgc-seed1-evaluate", "g/cifar_dgc/seed1"]
    kept = runs["fp32"]
    assert {k: kept.data.tags[k] for k in recorded} == recorded
    assert (kept.info.start_time, kept.info.end_time) == (1796331600000, 1796332522000)
    assert kept.data.tags["thinwire.times"] == "run.json"
