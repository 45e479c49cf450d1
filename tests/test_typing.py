"""Typing: the installed package carries py.typed and stubs for the compiled module, and the
public Python functions are annotated."""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import sys

import pytest
import waveboost
from waveboost import _waveboost


def test_py_typed_marker_is_installed():
    assert pathlib.Path(waveboost.__file__).with_name("py.typed").is_file()


def test_stub_covers_every_function_of_the_compiled_module():
    stub = pathlib.Path(_waveboost.__file__).with_name("_waveboost.pyi")
    assert stub.is_file(), f"no stub beside {_waveboost.__file__} (nanobind_add_stub in CMakeLists.txt)"
    declared = {node.name for node in ast.parse(stub.read_text()).body if isinstance(node, ast.FunctionDef)}
    public = {name for name in dir(_waveboost) if not name.startswith("_")}
    assert public <= declared, f"missing from the stub: {sorted(public - declared)}"


@pytest.mark.parametrize(
    "module,names",
    [("waveboost", ["attention", "resolve_backend", "info", "flash_attn_func"]),
     ("waveboost.torch", ["attention", "scaled_dot_product_attention"]),
     ("waveboost.jax", ["attention", "ffi_available"])],
)
def test_public_functions_are_annotated(module, names):
    if module != "waveboost":
        pytest.importorskip(module.split(".")[1], reason=f"{module} needs {module.split('.')[1]}")
    mod = importlib.import_module(module)
    for name in names:
        sig = inspect.signature(getattr(mod, name))
        missing = [p.name for p in sig.parameters.values() if p.annotation is inspect.Parameter.empty]
        assert not missing, f"{module}.{name}: parameters without annotations: {missing}"
        assert sig.return_annotation is not inspect.Signature.empty, f"{module}.{name} has no return annotation"


# A type checker run over a small program: the stubs (python/waveboost/_api.pyi) give the result
# type of q's framework, a tuple only with return_lse=True, and refuse unknown backend names.
_TYPED_EXAMPLE = '''
from typing import Union

from typing_extensions import assert_type

import numpy as np
import numpy.typing as npt
import waveboost

q: npt.NDArray[np.float32] = np.ones((1, 8, 2, 16), np.float32)
assert_type(waveboost.attention(q, q, q), npt.NDArray[np.float32])
out, lse = waveboost.attention(q, q, q, causal=True, return_lse=True)
assert_type(out, npt.NDArray[np.float32])
assert_type(lse, npt.NDArray[np.float32])
flag: bool = bool(np.random.rand() > 0.5)
either = waveboost.attention(q, q, q, return_lse=flag)
assert_type(either, Union[npt.NDArray[np.float32], tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]])
assert_type(waveboost.flash_attn_func(q, q, q, 0.0, None, True), npt.NDArray[np.float32])
o, l, none = waveboost.flash_attn_func(q, q, q, causal=True, return_attn_probs=True)
assert_type(none, None)
backend = waveboost.resolve_backend(q, q, q, backend="cpu")
version: str = waveboost.info()["version"]
capability = waveboost.capabilities()[0]
assert_type(capability["available"], bool)
assert_type(capability["head_dims"], list[int])
waveboost.attention(q, q, q, backend=capability["backend"])
'''

_MISTAKES = {
    "unknown_backend": "waveboost.attention(q, q, q, backend='flash')",
    "out_is_not_a_tuple": "pair: tuple[object, object] = waveboost.attention(q, q, q)",
    "resolve_backend_causal_is_keyword_only": "waveboost.resolve_backend(q, q, q, True)",
    "info_has_no_such_key": "waveboost.info()['versions']",
    "capability_has_no_such_key": "waveboost.capabilities()[0]['dtypes']",
}


def _mypy(tmp_path, source):
    api = pytest.importorskip("mypy.api", reason="mypy is not installed (pip install '.[test]' brings it)")
    path = tmp_path / "example.py"
    path.write_text(source)
    stdout, stderr, status = api.run(
        [str(path), "--strict", "--no-incremental", "--cache-dir", str(tmp_path / "cache"),
         "--python-executable", sys.executable])
    return stdout + stderr, status


def test_public_api_type_checks_with_mypy(tmp_path):
    output, status = _mypy(tmp_path, _TYPED_EXAMPLE)
    assert status == 0, output


@pytest.mark.parametrize("mistake", sorted(_MISTAKES))
def test_mypy_catches_mistakes(tmp_path, mistake):
    header = "import numpy as np\nimport waveboost\nq = np.ones((1, 8, 2, 16), np.float32)\n"
    output, status = _mypy(tmp_path, header + _MISTAKES[mistake] + "\n")
    assert status == 1 and "example.py:4: error" in output, output
