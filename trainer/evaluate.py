"""Loss and accuracy of a model on a data set's test split: during training (the loop's
evaluations) and after it (a finished run rebuilt from its folder, for the evaluate stage)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from common.comm.collectives import get_world_size
from common.config import RunConfig

from .components import cross_entropy_loss, model_for
from .data import Dataset, load_dataset
from .distributed import DistContext
from .outputs import trained_model_file
from .precision import AutocastFactory, autocast_factory, compute_precision


@torch.no_grad()
def evaluate(
    model: nn.Module,
    dataset: Dataset,
    ctx: DistContext,
    batch_size: int,
    *,
    channels_last: bool = False,
    autocast: AutocastFactory | None = None,
) -> dict[str, float]:
    """Loss and accuracy on ``dataset``, each rank a disjoint shard, summed over ranks; image
    batches in channels_last memory format where asked, the forward under ``autocast`` where one is
    given (its logits then read in fp32).

    Evaluation traffic (three numbers) is instrumentation, not training traffic: not counted.
    """
    model.eval()
    loss_fn = cross_entropy_loss(dataset.info.kind)
    indices = torch.arange(ctx.rank, len(dataset), ctx.world_size)
    # loss sum and correct predictions accumulate on the device (read once, after the last batch)
    loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
    correct = torch.zeros((), dtype=torch.float64, device=ctx.device)
    count = 0
    for batch in indices.split(batch_size):
        x, y = dataset.get_batch(batch)
        x, y = x.to(ctx.device), y.to(ctx.device)
        if channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        if autocast is not None:
            with autocast():
                logits = model(x).float()
        else:
            logits = model(x)
        n = y.numel()
        loss_sum += loss_fn(logits, y).double() * n
        correct += (logits.argmax(-1) == y).sum()
        count += n
    totals = torch.stack([loss_sum, correct, loss_sum.new_tensor(float(count))])
    if get_world_size() > 1:
        dist.all_reduce(totals)
    totals = totals.cpu()
    model.train()
    loss = float(totals[0] / totals[2])
    out = {"test_loss": loss, "test_accuracy": float(totals[1] / totals[2])}
    if dataset.info.kind == "text":
        out["test_perplexity"] = math.exp(min(loss, 50.0))
    return out


def evaluate_trained(out_dir: str | Path, *, eval_limit: int | None = None) -> dict[str, float]:
    """Rebuild a finished run from its folder (``run.json``'s config, ``model.pt``) in this process
    and evaluate it on its data set's test split (the whole split unless ``eval_limit``): the
    evaluate stage's measurement, independent of the subset the training curve was evaluated on."""
    out_dir = Path(out_dir)
    model_file = trained_model_file(out_dir)
    config = RunConfig.from_dict(json.loads((out_dir / "run.json").read_text())["config"])
    test_set = load_dataset(config.dataset, "test", limit=eval_limit, seq_len=config.seq_len)
    torch.manual_seed(config.seed)
    model = model_for(config, test_set)
    model.load_state_dict(torch.load(model_file, map_location="cpu", weights_only=True))
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    cpu = torch.device("cpu")
    ctx = DistContext(rank=0, world_size=1, local_rank=0, backend="gloo", device=cpu)
    result = evaluate(
        model,
        test_set,
        ctx,
        batch_size=max(config.batch_size, 256),
        channels_last=config.channels_last,
        autocast=autocast_factory(compute_precision(config, cpu), cpu),
    )
    return {**result, "test_examples": float(len(test_set))}
