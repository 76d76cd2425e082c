"""A full or read-only disk is named: the file, the cause (ENOSPC even where torch hides it), what to do.

The full disk is a real 256 KiB tmpfs and the read-only folder a real read-only mount (as root) or
a folder without write permission (otherwise): no mocked errno.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.helpers.mounts import read_only_folder, tmpfs
from trainer.checkpoint import Checkpointer
from trainer.fileio import WriteError, atomic_write, atomic_write_text, check_writable

BIG = {"w": torch.zeros(200_000)}  # 800 KB: more than the 256 KiB disk


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "disk", size="256k") as disk:
        yield disk


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    with read_only_folder(tmp_path / "ro") as folder:
        yield folder


def _no_temporaries(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob(".*.tmp")]


def test_torch_save_on_a_full_disk_says_no_space_and_names_the_file(full_disk):
    """torch's writer raises 'unexpected pos' / 'basic_ios::clear: iostream error' without an
    errno: the error is an OSError with ENOSPC naming the file, and the old version survives."""
    target = full_disk / "ckpt" / "rank0.pt"
    atomic_write(target, lambda p: torch.save({"w": torch.ones(4)}, p))
    with pytest.raises(WriteError) as caught:
        atomic_write(target, lambda p: torch.save(BIG, p))
    error = caught.value
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC and error.filename == str(target)
    assert str(error).startswith(f"cannot write {target}: No space left on device (")
    assert f"free on the filesystem of {target.parent}): free some space there" in str(error)
    assert isinstance(error.__cause__, RuntimeError)  # torch's own error stays attached
    assert _no_temporaries(full_disk) == []
    assert torch.equal(torch.load(target)["w"], torch.ones(4))  # the previous version is intact


def test_a_text_write_on_a_full_disk_names_the_file(full_disk):
    with pytest.raises(
        WriteError, match=r"^cannot write .*metrics.json: No space left on device \("
    ) as caught:
        atomic_write_text(full_disk / "metrics.json", "x" * 1_000_000)
    assert caught.value.errno == errno.ENOSPC
    assert _no_temporaries(full_disk) == []


def test_a_checkpoint_on_a_full_disk_names_the_file_and_the_one_before_resumes(full_disk):
    ckpt = Checkpointer(full_disk / "ckpt", "fp", rank=0, world_size=1)
    ckpt.save(10, {"w": torch.ones(4)})
    with pytest.raises(WriteError) as caught:
        ckpt.save(20, BIG)
    message = str(caught.value)
    assert caught.value.errno == errno.ENOSPC
    assert message.startswith(f"cannot write {ckpt.dir / 'step-00000020' / 'rank0.pt'}: No space left")
    assert message.endswith(
        f"Checkpoint step 20 is not written; any before it in {ckpt.dir} are intact and a rerun "
        "resumes from the newest"
    )
    assert ckpt.resume_step() == 10


def test_a_read_only_folder_is_named_before_anything_is_written(read_only, tmp_path):
    with pytest.raises(WriteError) as caught:
        check_writable(read_only, "output folder")
    assert caught.value.errno in (errno.EROFS, errno.EACCES)
    assert str(caught.value).endswith(
        f": the output folder {read_only} is not writable; make it writable, or write elsewhere"
    )
    below = read_only / "run" / "ckpt"  # not there yet: the folder it would be made in is named
    with pytest.raises(WriteError, match=f"{below} would be created"):
        check_writable(below)
    with pytest.raises(WriteError, match=f"^cannot write {read_only}/run/metrics.json: .*not writable"):
        atomic_write_text(read_only / "run" / "metrics.json", "{}")
    check_writable(tmp_path / "fresh" / "run")  # a writable parent: fine, and nothing created
    assert not (tmp_path / "fresh").exists()


def test_a_checkpointer_refuses_a_read_only_folder_before_training(read_only):
    ckpt = Checkpointer(read_only / "ckpt", "fp", rank=0, world_size=1)
    with pytest.raises(WriteError, match=r"the checkpoint folder .*ckpt/fp .*is not writable"):
        ckpt.resume_step()


def test_other_errors_of_the_writer_pass_through_unchanged(tmp_path):
    def broken(path: Path) -> None:
        path.write_text("half")
        raise ValueError("not serialisable")

    with pytest.raises(ValueError, match="^not serialisable$"):
        atomic_write(tmp_path / "x.json", broken)
    with pytest.raises(RuntimeError, match="^shape mismatch$"):
        atomic_write(tmp_path / "y.pt", lambda p: (_ for _ in ()).throw(RuntimeError("shape mismatch")))
    assert sorted(os.listdir(tmp_path)) == []
