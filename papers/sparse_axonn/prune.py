"""The prune stage: train a small GPT-2 densely, then prune it by magnitude with weight rewinding.

    python -m papers.sparse_axonn.prune                    # into scratch/sparse_axonn (DVC: --out results/sparse_axonn)
    python -m papers.sparse_axonn.prune --scale smoke --out /tmp/prune

One process. Dense AdamW training for ``prune.steps`` steps on character-level Tiny Shakespeare;
the weights after ``prune.rewind_step`` steps are the rewind state (Frankle et al. 2020, late
rewinding). Then, for each sparsity s (50, 80, 90 %):

- ``oneshot_<scope>_<s>``: the trained dense weights pruned by magnitude at s, globally (one
  threshold over every prunable weight) or layer-wise (each weight matrix loses s of its entries);
- ``imp_global_<s>``: iterative magnitude pruning, the lottery-ticket procedure: round 1 is the
  one-shot global mask at the first sparsity; each next round prunes the *retrained* previous
  round's weights further (``existing`` masks stay pruned) up to the next sparsity;

and every mask is retrained: unpruned weights rewound, the mask applied, ``steps - rewind_step``
steps with the compact optimizer (pruned weights stay exactly zero), the same batches as the dense
run from the rewind step on. Validation perplexity of the dense model, of each mask applied to the
trained dense weights without retraining, and of each retrained model.

Outputs (under ``--out``, default ``results/sparse_axonn``): ``masks/<name>.pt``
(:func:`~papers.sparse_axonn.pruning.save_masks`), ``rewind.pt`` (the rewind state dict),
``prune.json`` (perplexities, sparsities, per-tensor kept fractions, loss curves, the stage-split
memory table of :mod:`papers.sparse_axonn.memory`, MLflow run id, git sha) and ``prune.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from common.comm import CommStats
from harness.verdict import plateau
from trainer.distributed import seed_everything
from trainer.fileio import atomic_write, atomic_write_json, atomic_write_text
from trainer.tracking import Tracker, experiment_for, git_sha

from .compact import CompactTraining
from .config import ScaleConfig
from .memory import configurations
from .model import batch, build_gpt2, evaluate, load_split, logits_of
from .params import OUT, PIPELINE, convergence, flatten, load_config, out_dir
from .pruning import (
    apply_masks,
    magnitude_masks,
    masks_sparsity,
    prunable_parameters,
    pruned_nonzero,
    save_masks,
)
from .sparse_state import dense_optimizer

log = logging.getLogger("sparse_axonn.prune")

State = dict[str, Tensor]


def mask_name(family: str, sparsity: float) -> str:
    return f"{family}_{round(100 * sparsity)}"


def _snapshot(model: nn.Module) -> State:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train(
    model: nn.Module,
    config: ScaleConfig,
    data: Any,
    first_step: int,
    masks: dict[str, Tensor] | None,
    *,
    label: str,
    on_step: Any = None,
    after_step: Any = None,
) -> list[list[float]]:
    """Train steps ``[first_step, prune.steps)``: dense AdamW without masks, compact AdamW with;
    the learning rate of :meth:`PruneConfig.lr_at`. ``on_step(step)`` runs before a step,
    ``after_step(steps_done)`` after it.

    Returns ``[step, loss]`` rows every ``prune.log_every`` steps (and the last).
    """
    prune, optim = config.prune, config.optim
    training = (
        CompactTraining(model, masks, lr=optim.lr_at(0), weight_decay=optim.weight_decay)
        if masks is not None
        else None
    )
    dense = dense_optimizer(model, optim) if masks is None else None
    stats = CommStats()
    curve = []
    start = time.perf_counter()
    for step in range(first_step, prune.steps):
        if on_step is not None:
            on_step(step)
        x, y = batch(data, config.seed, step, prune.batch_size)
        lr = prune.lr_at(optim, step)
        loss = nn.functional.cross_entropy(logits_of(model, x).flatten(0, 1), y.flatten())
        if training is not None:
            training.zero_grad()
            loss.backward()
            training(model, None, stats=stats)  # packs the kept entries (no all-reduce in one process)
            training.set_lr(lr)
            training.step()
        else:
            assert dense is not None
            dense.zero_grad(set_to_none=True)
            loss.backward()
            for group in dense.param_groups:
                group["lr"] = lr
            dense.step()
        if after_step is not None:
            after_step(step + 1)
        if (step + 1) % prune.log_every == 0 or step + 1 == prune.steps:
            curve.append([step + 1, loss.item()])
            log.info(
                "%s: step %d/%d loss %.4f (%.1f s)",
                label,
                step + 1,
                prune.steps,
                loss.item(),
                time.perf_counter() - start,
            )
    return curve


def kept_fractions(masks: dict[str, Tensor]) -> dict[str, float]:
    return {n: float(m.float().mean()) for n, m in masks.items()}


def run(config: ScaleConfig, out: Path, tracker: Tracker | None = None) -> dict[str, Any]:
    """The whole stage; returns what ``prune.json`` holds."""
    prune = config.prune
    seed_everything(config.seed)
    train_data = load_split(config, "train")
    val_data = load_split(config, "val", limit=prune.eval_windows)
    model = build_gpt2(config.model, len(train_data.vocab))
    num_params = sum(p.numel() for p in model.parameters())
    num_prunable = sum(p.numel() for _, p in prunable_parameters(model))
    log.info("GPT-2 %s: %d parameters, %d prunable", config.model, num_params, num_prunable)

    rewind: State = {}

    def keep_rewind(step: int) -> None:
        if step == prune.rewind_step:
            rewind.update(_snapshot(model))

    evaluations = set(prune.evaluation_steps())
    eval_curve: list[list[float]] = []

    def evaluate_dense(steps_done: int) -> None:
        if steps_done in evaluations:
            eval_curve.append([steps_done, evaluate(model, val_data)["loss"]])
            log.info("dense: step %d validation loss %.4f", steps_done, eval_curve[-1][1])

    start = time.perf_counter()
    dense_curve = train(
        model, config, train_data, 0, None, label="dense", on_step=keep_rewind, after_step=evaluate_dense
    )
    dense_seconds = time.perf_counter() - start
    trained = _snapshot(model)
    dense_eval = evaluate(model, val_data)
    converged = plateau(
        [e[0] for e in eval_curve],
        [e[1] for e in eval_curve],
        tolerance=prune.plateau,
        higher_is_better=False,
    )
    log.info(
        "dense: validation perplexity %.3f; last fifth gained %.4f nats (plateau below %.4f: %s)",
        dense_eval["perplexity"],
        converged.improvement,
        prune.plateau,
        "reached" if converged.reached else "NOT reached",
    )
    (out / "masks").mkdir(parents=True, exist_ok=True)
    (out / "models").mkdir(parents=True, exist_ok=True)
    atomic_write(out / "rewind.pt", lambda tmp: torch.save(rewind, tmp))
    atomic_write(out / "models" / "dense.pt", lambda tmp: torch.save(trained, tmp))

    results: dict[str, dict[str, Any]] = {}
    retrained: dict[str, State] = {}
    all_masks: dict[str, dict[str, Tensor]] = {}

    def finish(name: str, family: str, target: float, masks: dict[str, Tensor], weights: State) -> None:
        """Evaluate ``masks`` on ``weights`` without retraining, then retrain from the rewind."""
        model.load_state_dict(weights)
        apply_masks(model, masks)
        unretrained = evaluate(model, val_data)
        model.load_state_dict(rewind)
        apply_masks(model, masks)
        curve = train(model, config, train_data, prune.rewind_step, masks, label=name)
        after = evaluate(model, val_data)
        zeros_kept = not any(pruned_nonzero(model, masks).values())
        assert zeros_kept, f"{name}: a pruned weight is nonzero after retraining"
        retrained[name] = _snapshot(model)
        atomic_write(out / "models" / f"{name}.pt", lambda tmp: torch.save(retrained[name], tmp))
        all_masks[name] = masks
        save_masks(
            out / "masks" / f"{name}.pt", masks, model, "layerwise" if "layerwise" in family else "global"
        )
        results[name] = {
            "family": family,
            "target_sparsity": target,
            "sparsity": masks_sparsity(masks),  # over the prunable weights
            "model_density": sum(int(m.sum()) for m in masks.values()) / num_prunable,
            "perplexity_pruned": unretrained["perplexity"],
            "perplexity_retrained": after["perplexity"],
            "loss_retrained": after["loss"],
            "curve": curve,
            "kept_fraction": kept_fractions(masks),
        }
        log.info(
            "%s: sparsity %.4f, perplexity %.3f pruned, %.3f retrained",
            name,
            masks_sparsity(masks),
            unretrained["perplexity"],
            after["perplexity"],
        )
        if tracker is not None:
            tracker.log_metrics(
                {
                    f"{name}_perplexity_pruned": unretrained["perplexity"],
                    f"{name}_perplexity_retrained": after["perplexity"],
                },
                step=prune.steps,
            )

    for scope in prune.scopes:
        for s in prune.sparsities:
            model.load_state_dict(trained)
            masks = magnitude_masks(model, s, scope)  # type: ignore[arg-type]
            finish(mask_name(f"oneshot_{scope}", s), f"oneshot_{scope}", s, masks, trained)
    if prune.iterative and "global" in prune.scopes:
        first = mask_name("oneshot_global", prune.sparsities[0])
        results[mask_name("imp_global", prune.sparsities[0])] = {**results[first], "family": "imp_global"}
        all_masks[mask_name("imp_global", prune.sparsities[0])] = all_masks[first]
        save_masks(
            out / "masks" / f"{mask_name('imp_global', prune.sparsities[0])}.pt",
            all_masks[first],
            model,
            "global",
        )
        first_weights = retrained[first]  # round 1 of IMP is the one-shot global mask
        atomic_write(
            out / "models" / f"{mask_name('imp_global', prune.sparsities[0])}.pt",
            lambda tmp: torch.save(first_weights, tmp),
        )
        previous, previous_s = first, prune.sparsities[0]
        for s in prune.sparsities[1:]:
            model.load_state_dict(retrained[previous])
            remaining = 1.0 - (1.0 - s) / (1.0 - previous_s)  # of the entries the last round kept
            masks = magnitude_masks(model, remaining, "global", existing=all_masks[previous])
            name = mask_name("imp_global", s)
            finish(name, "imp_global", s, masks, retrained[previous])
            previous, previous_s = name, s

    family = config.train.masks
    grids = [n for n in (1, 2, 4) if n <= config.model.n_layer and config.train.world_size % n == 0]
    model.load_state_dict(rewind)
    configs = configurations(
        model,
        {s: all_masks[mask_name(family, s)] for s in prune.sparsities},
        grids,
        capacity_stages=2 if 2 in grids else grids[-1],
    )
    return {
        "scale_config": config.to_dict(),
        "vocab_size": len(train_data.vocab),
        "num_params": num_params,
        "num_prunable": num_prunable,
        "dense": {
            "perplexity": dense_eval["perplexity"],
            "loss": dense_eval["loss"],
            "curve": dense_curve,
            "eval_curve": eval_curve,  # [step, validation loss]
            "plateau": {
                "improvement": converged.improvement,  # nats gained over the last fifth
                "tolerance": converged.tolerance,
                "from_step": converged.start_step,
                "reached": converged.reached,
            },
            "wall_seconds": dense_seconds,
        },
        "eval_windows": len(val_data),
        "masks": results,
        "train_masks": family,
        "configurations": configs,
    }


def markdown(record: dict[str, Any]) -> str:
    prune = record["scale_config"]["prune"]
    lines = [
        "# Sparse AxoNN: pruning\n",
        f"GPT-2 ({record['num_params']:,} parameters, {record['num_prunable']:,} prunable), "
        f"{prune['steps']} dense steps, rewind to step {prune['rewind_step']}, every mask retrained "
        f"{prune['steps'] - prune['rewind_step']} steps from the rewind. Validation perplexity on "
        f"{record['eval_windows']} windows. MLflow run `{record.get('mlflow_run_id')}`, git {record.get('git_sha')}.\n",
        f"Dense: perplexity **{record['dense']['perplexity']:.3f}**. {convergence(record['dense'])}\n",
        "| masks | sparsity (prunable) | perplexity pruned, not retrained | perplexity retrained | vs dense |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in record["masks"].items():
        lines.append(
            f"| {name} | {100 * r['sparsity']:.2f} % | {r['perplexity_pruned']:.3f} | "
            f"{r['perplexity_retrained']:.3f} | {r['perplexity_retrained'] / record['dense']['perplexity']:.3f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", default=None, help="override params.yaml's scale")
    parser.add_argument(
        "--out",
        default=None,
        help="output folder (default scratch/sparse_axonn, git-ignored; the DVC stage passes results/sparse_axonn)",
    )
    args = parser.parse_args(argv)
    from harness.entry import quiet_environment, setup_logging

    quiet_environment()
    setup_logging()
    try:
        config, _ = load_config(args.scale)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    out = out_dir(args.out)
    tracker = Tracker(experiment_for(PIPELINE, out, OUT), "prune")  # a hand run: scratch-sparse_axonn
    run_id = tracker.start(flatten(config.to_dict()), {"git_sha": git_sha(), "stage": "prune"})
    start = time.perf_counter()
    try:
        record = run(config, out, tracker)
    except BaseException:
        tracker.finish("FAILED")
        raise
    record.update(mlflow_run_id=run_id, git_sha=git_sha(), wall_seconds=time.perf_counter() - start)
    atomic_write_json(out / "prune.json", record)
    atomic_write_text(out / "prune.md", markdown(record))
    tracker.log_metrics({"dense_perplexity": record["dense"]["perplexity"]}, step=config.prune.steps)
    tracker.log_artifact(out / "prune.json")
    tracker.finish()
    print(
        json.dumps(
            {
                "dense": record["dense"]["perplexity"],
                **{k: v["perplexity_retrained"] for k, v in record["masks"].items()},
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
