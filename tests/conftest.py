"""Shared fixtures: the GPU marker's skip rule and a seeded random generator per test."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/reference.py

# JAX would otherwise take 75% of the GPU's memory when its GPU backend starts, starving the other
# processes of the run (pytest-xdist workers, the tests' child processes): set before any test module
# imports JAX, whichever files a run selects.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# torch.compile's on-disk caches in a folder of this run's own: the machine-wide default
# (/tmp/torchinductor_<user>) can hold graphs compiled against another build of waveboost, whose
# custom op then had another schema, and a cache hit replays that call (seen with the op's FP8
# descale arguments: a 9-argument graph replayed against a 6-argument op).
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="waveboost-tests-inductor-")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)


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
