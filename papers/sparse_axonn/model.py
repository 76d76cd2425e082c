"""The model, the batches and the evaluation that the prune and train stages share.

The model is ``transformers.GPT2LMHeadModel`` itself (not ``trainer.models.GPT2LanguageModel``,
which wraps it and ties the output matrix): :class:`~papers.sparse_axonn.pipeline_stages.GPT2Stage`
splits this one, and the mask files are keyed by its parameter names
(``transformer.h.0.attn.c_attn.weight``...).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from trainer.data import load_dataset
from trainer.data.text import TextDataset

from .config import ModelConfig, ScaleConfig


def build_gpt2(config: ModelConfig, vocab_size: int) -> Any:
    """A randomly initialised GPT-2 with untied embeddings (seed the global RNG first)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2Config(
        vocab_size=vocab_size,
        n_positions=config.n_positions,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        resid_pdrop=config.dropout,
        embd_pdrop=config.dropout,
        attn_pdrop=config.dropout,
        use_cache=False,
        bos_token_id=None,  # the small vocabulary has no GPT-2 special tokens; nothing is generated
        eos_token_id=None,
        tie_word_embeddings=False,  # wte and lm_head sit on different pipeline stages
    )
    return GPT2LMHeadModel(gpt2)


def load_split(config: ScaleConfig, split: str, limit: int | None = None) -> TextDataset:
    dataset = load_dataset(config.dataset, split, seq_len=config.seq_len, limit=limit)
    assert isinstance(dataset, TextDataset)
    return dataset


def batch(dataset: TextDataset, seed: int, step: int, batch_size: int) -> tuple[Tensor, Tensor]:
    """The global batch of ``step``: ``batch_size`` windows drawn from a generator seeded by (seed, step).

    Every rank, every method and every retraining gets the same batch for the same step.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return dataset.get_batch(torch.randint(len(dataset), (batch_size,), generator=g))


def logits_of(model: nn.Module, x: Tensor) -> Tensor:
    out = model(input_ids=x)
    return out.logits if hasattr(out, "logits") else out


@torch.no_grad()
def evaluate(model: nn.Module, dataset: TextDataset, batch_size: int = 64) -> dict[str, float]:
    """Mean next-token cross-entropy over every window of ``dataset`` and its perplexity."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(dataset), batch_size):
        x, y = dataset.get_batch(torch.arange(start, min(start + batch_size, len(dataset))))
        logits = logits_of(model, x)
        total += float(nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum"))
        count += y.numel()
    model.train(was_training)
    loss = total / count
    return {"loss": loss, "perplexity": math.exp(loss)}
