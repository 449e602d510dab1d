"""The code passes ruff's lint rules and is formatted as ruff formats it (pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pipeline.config import REPO_ROOT

RUFF = Path(sys.executable).parent / "ruff"


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(RUFF), *args], cwd=REPO_ROOT, capture_output=True, text=True)


def test_the_code_passes_the_lint_rules():
    result = ruff("check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_code_is_formatted():
    result = ruff("format", "--no-cache", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr
