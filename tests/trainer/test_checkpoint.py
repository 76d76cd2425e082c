"""Checkpoints: the last N kept with hashes; a damaged one is named and skipped, never resumed."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from tests.distributed import run_ranks
from trainer.checkpoint import Checkpointer, CheckpointError


def _saved(
    tmp_path: Path, steps=(10, 20, 30), *, keep: int = 2, rank: int = 0, world: int = 1
) -> Checkpointer:
    ckpt = Checkpointer(tmp_path, "fp", rank=rank, world_size=world, keep=keep)
    for step in steps:
        ckpt.save(step, {"step": step, "w": torch.full((64,), float(step))})
    return ckpt


def _flip_one_bit(path: Path, offset: int = -40) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_the_last_n_are_kept_each_with_its_hash(tmp_path):
    ckpt = _saved(tmp_path, keep=2)
    assert sorted(p.name for p in ckpt.dir.glob("step-*")) == ["step-00000020", "step-00000030"]
    marker = json.loads((ckpt.dir / "latest.json").read_text())
    assert marker == {"step": 30, "steps": [30, 20], "complete": False, "world_size": 1}
    for step in (20, 30):
        assert ckpt.verify(step) is None
        assert (ckpt.dir / f"step-{step:08d}" / "rank0.sha256").read_text().endswith("  rank0.pt\n")
    assert ckpt.resume_step() == 30 and ckpt.load(30)["step"] == 30
    assert sorted(p.name for p in _saved(tmp_path / "three", keep=3).dir.glob("step-*")) == [
        "step-00000010",
        "step-00000020",
        "step-00000030",
    ]


@pytest.mark.parametrize("damage", ["bit_flip", "truncated", "hash_missing", "file_missing"])
def test_a_damaged_newest_checkpoint_is_named_and_the_one_before_resumed(tmp_path, caplog, damage):
    ckpt = _saved(tmp_path)
    newest = ckpt.dir / "step-00000030" / "rank0.pt"
    if damage == "bit_flip":
        _flip_one_bit(newest)
    elif damage == "truncated":
        newest.write_bytes(newest.read_bytes()[:100])
    elif damage == "hash_missing":  # killed between the tensors and their hash
        newest.with_suffix(".sha256").unlink()
    else:
        newest.unlink()
    with caplog.at_level(logging.WARNING):
        assert ckpt.resume_step() == 20
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(newest) in warnings[0] and "falling back" in warnings[0]
    assert ckpt.load(20)["w"][0] == 20.0


def test_an_emptied_marker_is_named_and_the_folders_on_disk_are_verified(tmp_path, caplog):
    ckpt = _saved(tmp_path)
    (ckpt.dir / "latest.json").write_text("")
    with caplog.at_level(logging.WARNING):
        assert ckpt.resume_step() == 30
    assert any("latest.json is unreadable" in r.getMessage() for r in caplog.records)
    _flip_one_bit(ckpt.dir / "step-00000030" / "rank0.pt")
    assert ckpt.resume_step() == 20


def _list_in_marker(ckpt: Checkpointer, steps: list[int]) -> None:
    marker = ckpt.dir / "latest.json"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "step": steps[0], "steps": steps}))


def test_a_marker_that_lists_a_missing_step_falls_back_to_the_intact_folders(tmp_path, caplog):
    """latest.json lists only step 40, whose folder is gone: the newest intact folder on disk (30)
    is resumed with a warning naming the marker, and the next save lists it again (issue 45)."""
    ckpt = _saved(tmp_path)  # step-20 and step-30 on disk
    _list_in_marker(ckpt, [40])
    with caplog.at_level(logging.WARNING):
        assert ckpt.resume_step() == 30
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("step-00000040/rank0.pt is missing" in w for w in warnings), warnings
    assert warnings[-1] == (
        f"no step that {ckpt.dir / 'latest.json'} lists ([40]) is intact on every rank; all ranks resume "
        "from step 30, the newest step folder on disk intact on every rank"
    )
    assert ckpt.load(30)["w"][0] == 30.0
    ckpt.save(35, {"step": 35})  # keeps the folder it resumed from; the missing step is not listed
    assert json.loads((ckpt.dir / "latest.json").read_text())["steps"] == [35, 30]
    assert sorted(p.name for p in ckpt.dir.glob("step-*")) == ["step-00000030", "step-00000035"]


def test_a_marker_that_lists_only_damaged_steps_falls_back_to_an_unlisted_folder(tmp_path):
    ckpt = _saved(tmp_path, keep=3)  # 10, 20, 30 on disk
    _list_in_marker(ckpt, [30, 20])
    _flip_one_bit(ckpt.dir / "step-00000030" / "rank0.pt")
    (ckpt.dir / "step-00000020" / "rank0.sha256").unlink()
    assert ckpt.resume_step() == 10


def test_a_marker_that_lists_a_missing_step_with_nothing_on_disk_says_so(tmp_path):
    ckpt = _saved(tmp_path)
    for step in (20, 30):
        shutil.rmtree(ckpt.dir / f"step-{step:08d}")
    _list_in_marker(ckpt, [40])
    with pytest.raises(CheckpointError) as error:
        ckpt.resume_step()
    assert "rank 0: latest.json lists [40], step folders on disk [], none intact" in str(error.value)
    assert "Move that folder away" in str(error.value)


def test_no_intact_checkpoint_stops_with_an_error_instead_of_training_on(tmp_path):
    ckpt = _saved(tmp_path)
    for step in (20, 30):
        _flip_one_bit(ckpt.dir / f"step-{step:08d}" / "rank0.pt")
    with pytest.raises(
        CheckpointError, match=r"no checkpoint in .* is intact on every rank .*Move that folder"
    ):
        ckpt.resume_step()


def test_complete_runs_start_fresh_and_other_world_sizes_are_refused(tmp_path):
    ckpt = _saved(tmp_path)
    ckpt.save(40, {"step": 40}, complete=True)
    assert ckpt.resume_step() is None
    assert json.loads((ckpt.dir / "latest.json").read_text())["steps"] == [40, 30]
    other = _saved(tmp_path / "other")
    with pytest.raises(CheckpointError, match="written by 1 ranks, this run has 2"):
        Checkpointer(tmp_path / "other", "fp", rank=0, world_size=2).resume_step()
    assert other.resume_step() == 30
    with pytest.raises(ValueError, match="keep must be >= 1 checkpoint, got 0"):
        Checkpointer(tmp_path, "fp", rank=0, world_size=1, keep=0)


def _agree(rank: int, world: int, root: str, damaged: dict[int, list[int]]) -> object:
    ckpt = Checkpointer(root, "fp", rank=rank, world_size=world)
    for step in (8, 16):
        ckpt.save(step, {"rank": rank, "step": step})
    torch.distributed.barrier()
    for step in damaged.get(rank, []):
        _flip_one_bit(Path(root) / "fp" / f"step-{step:08d}" / f"rank{rank}.pt")
    torch.distributed.barrier()
    try:
        return ckpt.resume_step()
    except CheckpointError as error:
        return str(error)


def _two_cases(rank: int, world: int, root: str) -> list[object]:
    return [_agree(rank, world, f"{root}/a", {1: [16]}), _agree(rank, world, f"{root}/b", {0: [16], 1: [8]})]


def test_ranks_agree_on_the_newest_step_intact_on_every_rank(tmp_path):
    """Rank 1's newest file is damaged: rank 0's newest is intact, yet both resume from the step
    before (a collective check); with no step intact on both, both stop with the same error."""
    (a0, b0), (a1, b1) = run_ranks(_two_cases, 2, str(tmp_path), tmp_path=tmp_path)
    assert a0 == a1 == 8
    assert b0 == b1
    assert (
        "rank 0: latest.json lists [16, 8], step folders on disk [16, 8], [8] intact; "
        "rank 1: latest.json lists [16, 8], step folders on disk [16, 8], [16] intact"
    ) in b0
