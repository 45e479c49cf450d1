"""The installed wheel is a usable C++ package: find_package(waveboost) + waveboost::waveboost."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not on PATH")
def test_cpp_consumer_builds_and_passes(tmp_path):
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

    run("cmake", "-S", str(HERE / "cpp"), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release")
    run("cmake", "--build", str(build), "--parallel", "2")
    out = run("ctest", "--test-dir", str(build), "--output-on-failure")
    assert "100% tests passed" in out
