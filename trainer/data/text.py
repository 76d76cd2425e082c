"""Language-modelling corpora: Tiny Shakespeare (characters) and Penn Treebank (words).

A split is one token stream; example ``i`` is the ``i``-th non-overlapping window of ``seq_len``
tokens, with the target shifted by one token. The vocabulary is built from the train split only and
used unchanged for val and test; tokens it lacks become ``<unk>``, which every vocabulary contains
(Tiny Shakespeare's train split has all 65 characters of the file, so its vocabulary has 66 entries
and ``<unk>`` goes unused there).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from .base import Arrays, DataError, DatasetInfo, DatasetSource

log = logging.getLogger(__name__)

UNK = "<unk>"
EOS = "<eos>"
_SPLITS = ("train", "val", "test")


def _read_utf8(path: Path) -> str:
    try:
        # Bytes, then decode: keep the characters exactly (no newline translation).
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not UTF-8 text ({exc}); restore it from ../shared/data") from exc
    if not text.strip():
        raise DataError(f"{path} is empty; restore it from ../shared/data")
    return text


def _encode(tokens: Sequence[str], vocab: Sequence[str]) -> np.ndarray:
    index = {token: i for i, token in enumerate(vocab)}
    unk = index[UNK]
    ids = np.fromiter((index.get(t, unk) for t in tokens), dtype=np.int32, count=len(tokens))
    return ids


class TextDataset:
    """One split of a corpus: ``get_batch(indices) -> (x int64 [B, seq_len], y int64 [B, seq_len])``.

    Window ``i`` is ``tokens[i * seq_len : (i + 1) * seq_len]`` and its target is the same window
    shifted by one token. ``vocab[i]`` is token ``i``'s string.
    """

    def __init__(
        self,
        info: DatasetInfo,
        tokens: torch.Tensor,
        *,
        seq_len: int,
        vocab: tuple[str, ...],
        limit: int | None = None,
    ) -> None:
        assert tokens.dtype == torch.int64 and tokens.dim() == 1
        self._info = info
        self.tokens = tokens
        self.seq_len = seq_len
        self.vocab = vocab
        num_windows = max(tokens.numel() - 1, 0) // seq_len
        self.num_windows = num_windows if limit is None else min(num_windows, limit)
        self._offsets = torch.arange(seq_len + 1)

    @property
    def info(self) -> DatasetInfo:
        return self._info

    def __len__(self) -> int:
        return self.num_windows

    def get_batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        indices = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= len(self)):
            raise IndexError(f"window index out of range [0, {len(self)}) in {self!r}")
        windows = self.tokens[indices[:, None] * self.seq_len + self._offsets]
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

    def __repr__(self) -> str:
        return f"TextDataset({self.info.name!r}, {len(self)} windows of {self.seq_len})"


class TextSource(DatasetSource):
    """A corpus decoded into ``vocab`` (str) and one int32 token stream per split."""

    kind: Literal["image", "text"] = "text"

    def __init__(self, name: str, *, folder: str, files: tuple[str, ...]) -> None:
        self.name = name
        self.folder = folder
        self.files = files

    def split_tokens(self, folder: Path) -> dict[str, list[str]]:
        raise NotImplementedError

    def build_vocab(self, train: list[str]) -> list[str]:
        raise NotImplementedError

    def decode(self, folder: Path) -> Arrays:
        tokens = self.split_tokens(folder)
        vocab = self.build_vocab(tokens["train"])
        if UNK not in vocab:
            vocab.append(UNK)
        known = set(vocab)
        arrays: Arrays = {"vocab": np.array(vocab)}
        for split in _SPLITS:
            arrays[split] = _encode(tokens[split], vocab)
            num_unknown = len(set(tokens[split]) - known)
            if num_unknown:
                log.info(
                    "%s %s: %d distinct tokens not in the train vocabulary", self.name, split, num_unknown
                )
        self.check_arrays(arrays, where=str(folder))
        return arrays

    def check_arrays(self, arrays: Arrays, where: str = "the cache") -> None:
        vocab = arrays.get("vocab")
        if vocab is None or vocab.ndim != 1 or vocab.dtype.kind != "U" or UNK not in vocab.tolist():
            raise DataError(f"{self.name}: no vocabulary with {UNK} in {where}")
        if len(set(vocab.tolist())) != len(vocab):
            raise DataError(f"{self.name}: vocabulary in {where} has duplicate entries")
        for split in _SPLITS:
            ids = arrays.get(split)
            if ids is None or ids.dtype != np.int32 or ids.ndim != 1 or len(ids) < 2:
                raise DataError(f"{self.name}: no {split} token stream (int32, >= 2 tokens) in {where}")
            if ids.min() < 0 or ids.max() >= len(vocab):
                raise DataError(f"{self.name} {split} in {where}: token ids outside [0, {len(vocab)})")

    def make_split(self, arrays: Arrays, split: str, *, seq_len: int, limit: int | None) -> TextDataset:
        vocab = tuple(str(t) for t in arrays["vocab"].tolist())
        info = DatasetInfo(name=self.name, kind="text", vocab_size=len(vocab))
        tokens = torch.from_numpy(arrays[split].astype(np.int64))
        dataset = TextDataset(info, tokens, seq_len=seq_len, vocab=vocab, limit=limit)
        if len(dataset) == 0:
            raise ValueError(
                f"{self.name} {split}: {tokens.numel()} tokens hold no window of seq_len={seq_len}"
            )
        return dataset


class CharTextSource(TextSource):
    """One text file, character tokens, split contiguously 90/5/5 % by characters (train/val/test).

    Vocabulary: the train split's characters in code-point order, then ``<unk>``.
    """

    def split_tokens(self, folder: Path) -> dict[str, list[str]]:
        text = _read_utf8(folder / self.files[0])
        n = len(text)
        cut_val, cut_test = n * 90 // 100, n * 95 // 100
        parts = (text[:cut_val], text[cut_val:cut_test], text[cut_test:])
        return {split: list(part) for split, part in zip(_SPLITS, parts)}

    def build_vocab(self, train: list[str]) -> list[str]:
        return sorted(set(train))


class WordTextSource(TextSource):
    """Three files (train, valid, test); whitespace-separated words, ``<eos>`` at the end of every line
    (as in Mikolov's PTB language-modelling setup).

    Vocabulary: the train split's words by decreasing count, ties in string order.
    """

    def split_tokens(self, folder: Path) -> dict[str, list[str]]:
        tokens = {}
        for split, file in zip(_SPLITS, self.files):
            lines = _read_utf8(folder / file).split("\n")
            if lines[-1] == "":
                lines.pop()
            tokens[split] = [word for line in lines for word in [*line.split(), EOS]]
        return tokens

    def build_vocab(self, train: list[str]) -> list[str]:
        counts = Counter(train)
        return sorted(counts, key=lambda token: (-counts[token], token))
