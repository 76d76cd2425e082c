"""thinwire's training loop: what the pipelines and the examples run. One ``RunConfig`` in, a
trained model and its metrics out. The method library is ``common/`` (compressors, error feedback,
GradientSync, the DDP hook, the sync strategies): a user's own training script imports that and
none of this package; this package adds the loop, its data sets and models, checkpoints, MLflow
tracking and the run's outputs. Arrows: pipelines -> papers -> harness -> trainer -> common ->
kernels, one way.

The one training loop. A sync strategy decides what crosses the wire.

Run from an entry point under torchrun, e.g. (what ``pipelines/train.py`` does)::

    torchrun --standalone --nproc_per_node 4 -m pipelines.train baseline fp32

Each step: batch -> ``strategy.forward_backward`` -> ``strategy.after_backward`` (data parallel:
average gradients) -> optimizer step -> ``strategy.after_step`` (decentralized: gossip).
Checkpoints every ``checkpoint_every`` steps hold the model, optimizer, scheduler, strategy
(residuals, generator states, counters), torch's RNG state and the curves so far, so a killed run
restarted by torchrun continues bit-exactly. Rank 0 writes, atomically, into ``out_dir``:

- ``metrics.json``: flat final numbers (accuracy, loss, bits per step, compression factor, seconds);
- ``train_curve.csv`` / ``eval_curve.csv``: per-step curves (``dvc plots``);
- ``plot.png``: both curves;
- ``run.json``: MLflow run id, git sha, config fingerprint and the config;
- ``model.pt``: the final model's state as evaluated (the evaluate stage reads it; not committed).

``model.pt`` and the checkpoints (``ckpt/``) go to ``artifacts_dir`` when one is given (the
pipelines keep them out of the committed results folder, so that a fresh clone, which lacks them,
holds every training stage's outputs complete; ``run.json`` records where, relative to ``out_dir``).

Recipe settings the loop applies to every method alike: label smoothing of the training loss,
local gradient clipping before anything is sent, bf16 autocast and channels_last for compute.

The modules, in the order a run meets them: ``checks`` (the run checked whole before any process
starts), ``run`` (:func:`train`: every component built from the ``RunConfig`` once),
``components`` (their constructors), ``precision``, ``plan`` (the built
objects the step reads), ``state`` (what a run has done; what a checkpoint holds), ``loop`` (the
steps, which never read the config), ``evaluate``, ``outputs`` (metrics.json, curves, model file).
Beside them: ``data/`` and ``models/`` (the registries a run names), ``distributed`` (the process
group from torchrun's environment), ``checkpoint``, ``tracking`` and ``code_version`` (MLflow and
the git sha a run records), ``step_time``, ``loss_scale`` (fp16) and ``plots`` (figures).
"""

from .components import INIT_FROM_DATA_EXAMPLES, default_strategy, prepare_model
from .evaluate import evaluate, evaluate_trained
from .loop import Callback, StepInfo
from .outputs import MODEL_FILE, trained_model_file
from .precision import autocast, compute_precision, cpu_has_bf16
from .run import train

__all__ = [
    "INIT_FROM_DATA_EXAMPLES",
    "MODEL_FILE",
    "Callback",
    "StepInfo",
    "autocast",
    "compute_precision",
    "cpu_has_bf16",
    "default_strategy",
    "evaluate",
    "evaluate_trained",
    "prepare_model",
    "train",
    "trained_model_file",
]
