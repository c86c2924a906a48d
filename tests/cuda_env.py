"""What the GPU test files share (importable without tests/conftest.py, which `scripts/gpu_check.sh` skips)."""

from __future__ import annotations

import os

import pytest

from marin_model.cuda import dispatch


@pytest.fixture(scope="module", autouse=True)
def cuda_kernels():
    """The kernels must serve CUDA tensors, or a GPU test would run the CPU reference and prove nothing.
    Skips when they cannot load; fails instead under ``MARIN_CUDA_KERNELS=require`` (the GPU check)."""
    if not dispatch.register_cuda_kernels():
        reason = f"CUDA kernels unavailable: {dispatch.status()['reason']}"
        if os.environ.get("MARIN_CUDA_KERNELS") == "require":
            pytest.fail(reason)
        pytest.skip(reason)
