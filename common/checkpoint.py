"""Checkpoints that survive a killed worker and never leave a half-written state behind.

Layout under ``root/<config fingerprint>/``::

    step-000120/rank0.pt, rank1.pt, ...   one file per rank (error-feedback residuals and RNG
                                          states differ between ranks)
    latest.json                           {"step": 120, "complete": false, "world_size": 4}

Each rank writes its file atomically; after a barrier, rank 0 replaces ``latest.json`` atomically
and only then removes older step folders. A crash at any point leaves the previous checkpoint
readable. A run resumes from ``latest.json`` unless it is marked complete (a finished run started
again trains from scratch; its files stay until the new run's first checkpoint replaces them).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch

from .distributed import barrier
from .fileio import atomic_write, atomic_write_json

log = logging.getLogger(__name__)


class Checkpointer:
    def __init__(self, root: str | Path, fingerprint: str, *, rank: int, world_size: int) -> None:
        self.dir = Path(root) / fingerprint
        self.rank = rank
        self.world_size = world_size

    def _step_dir(self, step: int) -> Path:
        return self.dir / f"step-{step:08d}"

    def latest_step(self) -> int | None:
        """Step to resume from, or None to start fresh."""
        marker = self.dir / "latest.json"
        if not marker.exists():
            return None
        info = json.loads(marker.read_text())
        if info.get("complete"):
            return None
        if info.get("world_size") != self.world_size:
            raise ValueError(
                f"checkpoint in {self.dir} was written by {info.get('world_size')} ranks, this run has "
                f"{self.world_size}: resume with the same world size, or move the folder away to start fresh"
            )
        return int(info["step"])

    def load(self, step: int) -> dict[str, Any]:
        path = self._step_dir(step) / f"rank{self.rank}.pt"
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
        log.info("rank %d resumed from %s", self.rank, path)
        return state

    def save(self, step: int, state: dict[str, Any], *, complete: bool = False) -> None:
        step_dir = self._step_dir(step)
        atomic_write(step_dir / f"rank{self.rank}.pt", lambda p: torch.save(state, p))
        barrier()  # every rank's file is on disk before the marker points at it
        if self.rank == 0:
            atomic_write_json(
                self.dir / "latest.json", {"step": step, "complete": complete, "world_size": self.world_size}
            )
            for old in self.dir.glob("step-*"):
                if old != step_dir:
                    shutil.rmtree(old, ignore_errors=True)
        barrier()
