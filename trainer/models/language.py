"""Language models: a word-level LSTM and a small, randomly initialised GPT-2.

Input int64 token ids ``[B, T]``, output logits ``[B, T, V]``.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn


class LSTMLanguageModel(nn.Module):
    """Word-level LSTM language model (as PyTorch's word_language_model example, Zaremba et al. 2014).

    embedding -> dropout -> LSTM(``num_layers``, dropout between layers) -> dropout -> linear to the
    vocabulary. ``tie_weights`` shares the embedding and output matrices (Press & Wolf 2017; needs
    ``embed_dim == hidden_dim``).

    Stateless: the hidden state starts at zero on every forward and is not returned, so consecutive
    batches are independent sequences (no hidden state carried across truncated-BPTT windows).
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        embed_dim: int = 200,
        hidden_dim: int = 200,
        num_layers: int = 2,
        dropout: float = 0.2,
        tie_weights: bool = False,
    ) -> None:
        super().__init__()
        if tie_weights and embed_dim != hidden_dim:
            raise ValueError(
                f"lstm_lm tie_weights needs embed_dim == hidden_dim, got {embed_dim} and {hidden_dim}"
            )
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        # nn.LSTM warns when given inter-layer dropout with a single layer, where it does nothing.
        inter_layer_dropout = dropout if num_layers > 1 else 0.0
        self.lstm = nn.LSTM(
            embed_dim, hidden_dim, num_layers=num_layers, dropout=inter_layer_dropout, batch_first=True
        )
        self.dropout = nn.Dropout(dropout)
        self.decoder = nn.Linear(hidden_dim, vocab_size)
        # The word_language_model example's init: U(-0.1, 0.1) embeddings and output, zero output bias.
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        if tie_weights:
            self.decoder.weight = self.embedding.weight

    def forward(self, x: Tensor) -> Tensor:
        embedded = self.dropout(self.embedding(x))
        if embedded.device.type == "cpu" and _bf16_autocast_cpu() and not bf16_lstm_supported():
            # oneDNN has no bf16 LSTM on this CPU (no AVX512-BF16 or AMX: "could not create a
            # primitive descriptor for the LSTM forward propagation primitive"): the recurrence runs
            # in fp32 here, everything around it in bf16 as elsewhere.
            with torch.autocast("cpu", enabled=False):
                hidden, _ = self.lstm(embedded.float())
        else:
            hidden, _ = self.lstm(embedded)
        return self.decoder(self.dropout(hidden))


def _bf16_autocast_cpu() -> bool:
    return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


@functools.cache
def bf16_lstm_supported() -> bool:
    """Whether this CPU runs ``nn.LSTM`` under bf16 autocast (oneDNN's bf16 RNN needs AVX512-BF16 or
    AMX; on an AVX2-only CPU it fails). Probed once with a 2-unit LSTM, the global RNG untouched."""
    with torch.random.fork_rng(devices=[]), torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        try:
            nn.LSTM(2, 2, batch_first=True)(torch.zeros(1, 1, 2))
        except RuntimeError:
            return False
    return True


class GPT2LanguageModel(nn.Module):
    """A small GPT-2 (Radford et al. 2019) from ``transformers.GPT2LMHeadModel``, randomly initialised.

    ``forward(input_ids [B, T])`` returns the logits ``[B, T, V]`` as a plain tensor (no cache, no
    loss). ``dropout`` sets the embedding, attention and residual dropout. Nothing is downloaded:
    only a config is built, never ``from_pretrained``. The output matrix is tied to the token
    embedding, as in GPT-2, unless ``tied=False`` (a pipeline puts the two on different stages:
    ``strategy: pipeline``, sparse AxoNN's ``GPT2Stage``). ``self.gpt2`` is the
    ``transformers.GPT2LMHeadModel``; its parameter names (``transformer.h.0.attn.c_attn.weight``)
    are the ones mask files and pipeline stages use.
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        n_layer: int = 2,
        n_head: int = 2,
        n_embd: int = 128,
        n_positions: int = 256,
        dropout: float = 0.1,
        tied: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(tied, bool):
            raise ValueError(f"gpt2_small tied must be true or false, got {tied!r}")
        if n_embd % n_head != 0:
            raise ValueError(f"gpt2_small n_embd ({n_embd}) must be divisible by n_head ({n_head})")
        # Imported here: importing transformers takes seconds, and only this model needs it.
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            vocab_size=vocab_size,
            n_positions=n_positions,
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_head,
            resid_pdrop=dropout,
            embd_pdrop=dropout,
            attn_pdrop=dropout,
            use_cache=False,
            # GPT-2's special-token id (50256) lies outside a small vocabulary and makes transformers
            # warn; these models never generate, so they need no BOS/EOS token.
            bos_token_id=None,
            eos_token_id=None,
            tie_word_embeddings=tied,
        )
        self.n_positions = n_positions
        self.gpt2 = GPT2LMHeadModel(config)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] > self.n_positions:
            raise ValueError(f"sequence length {x.shape[-1]} exceeds n_positions={self.n_positions}")
        logits = self.gpt2(input_ids=x, use_cache=False).logits
        assert logits is not None
        return logits
