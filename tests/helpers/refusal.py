"""The launcher's refusals, checked in the test's own process.

``pipelines.launch.main`` validates everything before it runs torchrun, so a refusal can be
checked by calling it here, without a subprocess that spends ~7 s importing torch to print one
line. Should a launch get past its checks, starting torchrun fails the test instead of training in
the test process; the environment it set is restored either way.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NoReturn

import pytest

from pipelines import launch


def _no_torchrun(args: Sequence[str]) -> NoReturn:
    raise AssertionError(f"the launch was not refused: it would start torchrun {' '.join(args)}")


def launch_refusal(monkeypatch: pytest.MonkeyPatch, argv: list[str], **env: str) -> str:
    """The message ``python -m pipelines.launch ARGV`` exits with (under ``env`` added)."""
    monkeypatch.setattr(launch, "run_torchrun", _no_torchrun)
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        with pytest.raises(SystemExit) as exit_:
            launch.main(argv)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert exit_.value.code not in (0, None), f"the launch exited with {exit_.value.code!r}"
    return str(exit_.value.code)
