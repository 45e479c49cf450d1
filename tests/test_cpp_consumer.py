"""The installed wheel is a usable C++ package: find_package(waveboost) + waveboost::waveboost, and
find_package(waveboost COMPONENTS cpu) + waveboost::cpu with no CUDA toolkit in sight."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not on PATH")
@pytest.mark.parametrize("cpu_only", [False, True], ids=["waveboost", "cpu_without_cuda_toolkit"])
def test_cpp_consumer_builds_and_passes(tmp_path, cpu_only):
    cmake_dir = subprocess.run(
        [sys.executable, "-m", "waveboost", "--cmake-dir"], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert (Path(cmake_dir) / "waveboostConfig.cmake").is_file()
    build = tmp_path / "build"
    env = dict(os.environ, CMAKE_PREFIX_PATH=cmake_dir)

    def run(*cmd):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    # The CPU-only consumer is configured as if no CUDA toolkit existed: finding it is disabled.
    extra = ["-DWAVEBOOST_CONSUMER_CPU_ONLY=ON", "-DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=TRUE"] if cpu_only else []
    run("cmake", "-S", str(HERE / "cpp"), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", *extra)
    run("cmake", "--build", str(build), "--parallel", "2")
    out = run("ctest", "--test-dir", str(build), "--output-on-failure", "-V")
    assert "100% tests passed" in out
    if cpu_only:
        assert "CUDA compiled: no" in out
