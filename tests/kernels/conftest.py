"""Fixtures for the kernel tests.

The root ``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` first, so ``backend="triton"`` runs the
kernels in the Triton interpreter on CPU tensors. GPU tests (``-m gpu``) compare the *compiled*
kernels on CUDA with the reference; run them with ``TRITON_INTERPRET=0 pytest -m gpu tests/kernels``
(they skip themselves while the interpreter is on).
"""

from __future__ import annotations

import pytest
import torch

from kernels._dispatch import interpreter_enabled, triton_available


@pytest.fixture
def gen() -> torch.Generator:
    """A seeded CPU generator (tests never touch the global RNG)."""
    return torch.Generator().manual_seed(1234)


@pytest.fixture
def interpreted() -> None:
    """Skip unless Triton kernels can run on CPU tensors (interpreter on, triton importable)."""
    if not triton_available():
        pytest.skip("triton is not installed")
    if not interpreter_enabled():
        pytest.skip("TRITON_INTERPRET=1 is needed to run Triton kernels on CPU")


@pytest.fixture
def cuda() -> torch.device:
    """The CUDA device, for ``gpu`` tests of the compiled kernels."""
    if not torch.cuda.is_available() or not triton_available():
        pytest.skip("needs CUDA and triton")
    if interpreter_enabled():
        pytest.skip("compiled kernels need TRITON_INTERPRET=0 (the interpreter is on)")
    return torch.device("cuda")
