"""The README's Quick start builds once: one pip install with the extras both commands need, and
CI runs exactly that install before the tests."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _quick_start_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.strip().splitlines() if line.strip()]


@pytest.mark.skipif(not (ROOT / ".ci" / "run").is_file(), reason="needs the repository checkout (README, .ci)")
def test_quick_start_installs_once_and_ci_runs_the_same_install():
    commands = _quick_start_commands()
    assert len(commands) == 2, commands
    installs = [part.strip() for c in commands for part in c.split("&&") if "pip install" in part]
    assert installs == ['pip install ".[bench,test]"'], installs
    assert commands[0].endswith("python -m waveboost.bench --quick") and commands[1] == "python -m pytest"
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"{installs[0]} && python -m pytest" in ci
    pyproject = (ROOT / "pyproject.toml").read_text()
    for extra in ("bench", "test"):
        assert re.search(rf"^{extra} = \[", pyproject, re.MULTILINE), f"no [{extra}] extra in pyproject.toml"
