"""Shared fixtures: the GPU marker's skip rule and a seeded random generator per test."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/reference.py


def _gpu_reason() -> str | None:
    """None when a CUDA device and a CUDA build of waveboost are present, else why not."""
    import waveboost

    facts = waveboost.info()
    if not facts["cuda_compiled"]:
        return "waveboost was built without CUDA"
    if not facts["gpus"]:
        return "no CUDA device visible"
    try:
        import torch  # noqa: F401
    except ImportError:
        return "the GPU tests drive the kernels through PyTorch, which is not installed"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng(request):
    """A generator seeded from the test's id: fresh inputs per case, reproducible per test."""
    import zlib

    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
