"""Checkpoints that survive a killed worker, a torn write and a flipped bit.

Layout under ``root/<config fingerprint>/``::

    step-000120/rank0.pt, rank1.pt, ...          one file per rank (error-feedback residuals and
                                                 RNG states differ between ranks)
    step-000120/rank0.sha256, rank1.sha256, ...  each file's SHA-256, written after the file
    latest.json                                  {"step": 120, "steps": [120, 100], "complete": false,
                                                  "world_size": 4}

Each rank writes its tensors atomically, then their hash; after a barrier, rank 0 replaces
``latest.json`` atomically and only then removes step folders beyond the last ``keep``. A crash at
any point leaves the previous checkpoints readable.

Resume (:meth:`Checkpointer.resume_step`, a collective): every rank verifies its own file of each
step, listed in ``latest.json`` or on disk, against its hash; the ranks then agree on the newest
listed step every rank verified. A damaged or missing file costs one warning naming it and a
fall-back to the step before; when no listed step is intact on every rank (the marker names a
folder that is gone, or only damaged ones), the newest step folder on disk intact on every rank is
resumed, with a warning; if none is, the run stops with an error naming what the marker lists and
what is on disk (it never trains on from a damaged state). The loop marks a run complete
(:meth:`Checkpointer.mark_complete`) only after its outputs are written: a run killed between its
last checkpoint and its outputs resumes at its last step and writes them without retraining. A run
whose ``latest.json`` is marked
complete starts from scratch (its files stay until the new run's first checkpoint replaces them);
a missing or unreadable ``latest.json`` is named and the step folders on disk are tried instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .distributed import barrier
from .fileio import WriteError, atomic_write, atomic_write_json, atomic_write_text, check_writable

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointError(RuntimeError):
    """No checkpoint can be resumed safely (damaged on some rank, or written by another world size)."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Checkpointer:
    def __init__(
        self, root: str | Path, fingerprint: str, *, rank: int, world_size: int, keep: int = 2
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1 checkpoint, got {keep!r}")
        self.dir = Path(root) / fingerprint
        self.rank = rank
        self.world_size = world_size
        self.keep = keep
        self.resumed: int | None = None  # the step resume_step chose

    def _step_dir(self, step: int) -> Path:
        return self.dir / f"step-{step:08d}"

    def _file(self, step: int) -> Path:
        return self._step_dir(step) / f"rank{self.rank}.pt"

    # -- resume ------------------------------------------------------------------------------------

    def _steps_on_disk(self) -> list[int]:
        """The steps whose folders exist, newest first (listed in ``latest.json`` or not)."""
        return sorted(
            (int(m.group(1)) for p in self.dir.glob("step-*") if (m := _STEP_DIR.match(p.name))),
            reverse=True,
        )

    def _listed(self) -> tuple[list[int], bool]:
        """(the steps ``latest.json`` lists, newest first; complete?), or ([], False) without a
        readable marker (named in a warning when step folders are on disk)."""
        marker = self.dir / "latest.json"
        if not marker.exists():
            if self.rank == 0 and (on_disk := self._steps_on_disk()):
                log.warning("%s is missing; trying the step folders on disk: %s", marker, on_disk)
            return [], False
        try:
            info = json.loads(marker.read_text())
            steps = sorted((int(s) for s in info.get("steps", [info["step"]])), reverse=True)
            complete, world_size = bool(info.get("complete")), info.get("world_size")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            if self.rank == 0:
                log.warning(
                    "checkpoint marker %s is unreadable (%s: %s); trying the step folders on disk: %s",
                    marker,
                    type(error).__name__,
                    error,
                    self._steps_on_disk(),
                )
            return [], False
        if world_size != self.world_size:
            raise CheckpointError(
                f"checkpoint in {self.dir} was written by {world_size} ranks, this run has "
                f"{self.world_size}: resume with the same world size, or move the folder away to start fresh"
            )
        return steps, complete

    def verify(self, step: int) -> str | None:
        """None if this rank's file of ``step`` matches its hash, else what is wrong with it."""
        path = self._file(step)
        digest_file = path.with_suffix(".sha256")
        if not path.exists():
            return f"{path} is missing"
        if not digest_file.exists():
            return f"{path} has no hash ({digest_file.name} is missing: its write did not finish)"
        try:
            expected = digest_file.read_text().split()[0]
            actual = file_sha256(path)
        except (OSError, IndexError) as error:
            return f"{path} cannot be verified ({type(error).__name__}: {error})"
        if actual != expected:
            return (
                f"{path} does not match its hash {digest_file.name} (sha256 {actual[:12]} != {expected[:12]})"
            )
        return None

    def resume_step(self) -> int | None:
        """The step every rank resumes from, or None to start fresh. A collective: call on every rank.

        The newest step that ``latest.json`` lists and every rank verified; if none is (the marker
        lists a folder that is gone, or only damaged ones), the newest step folder on disk that
        every rank verified, whether the marker lists it or not (a folder outside the marker is a
        checkpoint of this run whose marker update or clean-up did not happen)."""
        self.resumed = None
        # a read-only folder fails here, before any step is trained, not at the first checkpoint
        check_writable(self.dir, "checkpoint folder")
        listed, complete = self._listed()
        # a finished run starts fresh (its files go at the new run's first checkpoint)
        on_disk = [] if complete else self._steps_on_disk()
        listed = [] if complete else listed
        verified = []
        for step in sorted(set(listed) | set(on_disk), reverse=True):
            problem = self.verify(step)
            if problem is None:
                verified.append(step)
            else:
                log.warning(
                    "rank %d: checkpoint step %d is damaged: %s; falling back", self.rank, step, problem
                )
        mine = (listed, on_disk, verified)
        if dist.is_available() and dist.is_initialized() and self.world_size > 1:
            everyone: list[Any] = [None] * self.world_size
            dist.all_gather_object(everyone, mine)
        else:
            everyone = [mine]
        if not any(their_listed or their_disk for their_listed, their_disk, _ in everyone):
            return None  # no checkpoint anywhere: a fresh run
        common = set.intersection(*(set(v) for _, _, v in everyone))
        any_listed = set().union(*(set(their_listed) for their_listed, _, _ in everyone))
        if common & any_listed:
            step = self.resumed = max(common & any_listed)
            if step != max(any_listed) and self.rank == 0:
                log.info("all ranks resume from step %d, the newest checkpoint intact on every rank", step)
            return step
        if common:
            step = self.resumed = max(common)
            if any_listed and self.rank == 0:
                log.warning(
                    "no step that %s lists (%s) is intact on every rank; all ranks resume from step %d, "
                    "the newest step folder on disk intact on every rank",
                    self.dir / "latest.json",
                    sorted(any_listed, reverse=True),
                    step,
                )
            return step
        report = "; ".join(
            f"rank {r}: " + (f"latest.json lists {their_listed}, " if their_listed else "")
            + f"step folders on disk {their_disk}, {v or 'none'} intact"
            for r, (their_listed, their_disk, v) in enumerate(everyone)
        )  # fmt: skip
        raise CheckpointError(
            f"no checkpoint in {self.dir} is intact on every rank ({report}): refusing to train on from a "
            "damaged or missing state. Move that folder away to start the run from scratch"
        )

    def load(self, step: int) -> dict[str, Any]:
        path = self._file(step)
        try:
            state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as error:  # verified moments ago: only a concurrent writer gets here
            raise CheckpointError(
                f"{path} matched its hash but cannot be read ({type(error).__name__}: {error}); is another "
                "launch writing this run folder?"
            ) from error
        log.info("rank %d resumed from %s", self.rank, path)
        return state

    # -- save --------------------------------------------------------------------------------------

    def mark_complete(self) -> None:
        """Mark the newest checkpoint the run's end (rank 0; not a collective): a rerun then starts
        afresh. Called once rank 0 has written the run's outputs; a run killed before has its last
        checkpoint to resume from, which writes the outputs without training a step. No barrier:
        the other ranks may have left (a barrier would time out while rank 0 writes its outputs
        under a short ``collective_timeout_s``)."""
        if self.rank == 0:
            marker = self.dir / "latest.json"
            try:
                info = json.loads(marker.read_text())
            except (OSError, ValueError) as error:
                log.warning("cannot mark %s complete (%s): a rerun resumes its last step", marker, error)
            else:
                atomic_write_json(marker, {**info, "complete": True})

    def save(self, step: int, state: dict[str, Any], *, complete: bool = False) -> None:
        """Write this rank's state of ``step`` (a collective). A full or read-only disk raises
        :class:`~trainer.fileio.WriteError` naming the file; the checkpoints before stay intact."""
        path = self._file(step)
        try:
            atomic_write(path, lambda p: torch.save(state, p))
            atomic_write_text(path.with_suffix(".sha256"), f"{file_sha256(path)}  {path.name}\n")
        except WriteError as error:
            error.detail += (
                f". Checkpoint step {step} is not written; any before it in {self.dir} are intact and "
                "a rerun resumes from the newest"
            )
            raise
        barrier()  # every rank's file and hash are on disk before the marker points at them
        if self.rank == 0:
            earlier: set[int] = set()
            try:
                previous = json.loads((self.dir / "latest.json").read_text())
                if not previous.get("complete"):
                    earlier = {int(s) for s in previous.get("steps", [previous["step"]])}
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                pass  # no (readable) marker: this is the only checkpoint listed
            if self.resumed is not None:  # perhaps a folder the marker did not list (resume_step)
                earlier.add(self.resumed)
            earlier = {s for s in earlier if s < step and self._step_dir(s).is_dir()}
            kept = [step, *sorted(earlier, reverse=True)][: self.keep]
            atomic_write_json(
                self.dir / "latest.json",
                {"step": step, "steps": kept, "complete": complete, "world_size": self.world_size},
            )
            for old in self.dir.glob("step-*"):
                match = _STEP_DIR.match(old.name)
                if not match or int(match.group(1)) not in kept:
                    shutil.rmtree(old, ignore_errors=True)
        barrier()
