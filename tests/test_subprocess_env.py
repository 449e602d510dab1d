"""The processes the tests start get none of the variables of the command that started the tests
(tests/subprocess_env.py): `make test ARGS=…` does not reach a test's own `make run`."""

from __future__ import annotations

import os
import subprocess
import sys

from pipeline.config import REPO_ROOT
from tests.subprocess_env import OUTER_COMMAND, drop_outer_command

LEAKED = "--from-the-outer-make"


def make_run_command(environment: dict[str, str]) -> str:
    """The command `make run` would run in `environment` (make -n runs nothing)."""
    make = ["make", "--no-print-directory", "-n", "-o", "venv", f"VENV={sys.prefix}", "run"]
    done = subprocess.run(make, cwd=REPO_ROOT, env=environment, capture_output=True, text=True, check=True)
    return done.stdout


def test_a_nested_make_run_takes_none_of_the_outer_makes_arguments():
    # What `make test ARGS=…` hands its recipe's processes: ARGS exported, and in MAKEFLAGS.
    outer = {**os.environ, "ARGS": LEAKED, "MAKEFLAGS": f" -- ARGS={LEAKED}", "MAKELEVEL": "1"}
    assert LEAKED in make_run_command(outer)
    assert LEAKED not in make_run_command(drop_outer_command(outer))
    assert {"ARGS", "CORPUS", "SET", "VERBOSE", "MAKEFLAGS", "PYTEST_ADDOPTS"} <= set(OUTER_COMMAND)


def test_the_test_sessions_environment_holds_none_of_them():
    assert not set(OUTER_COMMAND) & set(os.environ)
