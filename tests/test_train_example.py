"""examples/train_decoder.py on the CPU in fp32: a tiny model trained a few steps with waveboost's
attention and with the framework's own, from the same weights on the same batches."""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import replace

import numpy as np
import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "train_decoder.py")


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("train_decoder", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def _tiny(example):
    return replace(example.SMALL, layers=1, d_model=32, heads=4, kv_heads=2, vocab=16, string=8, batch=4, steps=6,
                   lr=3e-3)


def _check(ours, theirs):
    assert len(ours) == len(theirs) == 6
    rel = np.abs(np.asarray(ours) - np.asarray(theirs)) / np.abs(np.asarray(theirs))
    assert rel.max() < 1e-5, rel
    assert ours[-1] < ours[0] - 0.05, ours  # it learns: the successor rule alone is worth much more


def test_torch_waveboost_and_sdpa_losses_agree(example):
    pytest.importorskip("torch")
    cfg = _tiny(example)
    _check(example.train_torch(cfg, "waveboost"), example.train_torch(cfg, "sdpa"))


def test_jax_waveboost_and_jax_nn_losses_agree(example):
    pytest.importorskip("jax")
    import waveboost.jax

    if not waveboost.jax.ffi_available():
        pytest.skip("this build of waveboost has no XLA FFI handlers")
    cfg = _tiny(example)
    _check(example.train_jax(cfg, "waveboost"), example.train_jax(cfg, "jax"))


def test_batches_and_weights_are_fixed_by_the_seed(example):
    cfg = _tiny(example)
    first, again = list(example.batches(cfg)), list(example.batches(cfg))
    assert all(np.array_equal(a, b) for x, y in zip(first, again) for a, b in zip(x, y))
    inputs, targets, _ = first[0]
    n = cfg.string
    assert np.array_equal(inputs[:, n + 1:], inputs[:, n - 1:0:-1])  # the reversed half (inputs: minus the last)
    assert np.array_equal(targets[:, :-1], inputs[:, 1:])
    a, b = example.init_params(cfg), example.init_params(cfg)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
