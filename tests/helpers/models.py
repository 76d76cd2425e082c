"""Tiny models for unit tests."""

from __future__ import annotations

import torch
from torch import nn


def tiny_gpt2(seed: int = 0) -> nn.Module:
    """``transformers.GPT2LMHeadModel``: 2 layers of width 32, 2 heads, vocabulary 64, no dropout.

    Built from a config (nothing downloaded). transformers is imported here, not at module level:
    the import takes seconds and distributed tests' ranks re-import the test modules.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, use_cache=False, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    return GPT2LMHeadModel(config)
