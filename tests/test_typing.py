"""Typing: the installed package carries py.typed and stubs for the compiled module, and the
public Python functions are annotated."""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib

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
    [("waveboost", ["attention", "resolve_backend", "info"]),
     ("waveboost.torch", ["attention"]),
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
