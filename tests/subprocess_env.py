"""What the command that started the tests must not pass on to the processes they start.

`make test ARGS='-m "not slow"'` exports ARGS and writes it into MAKEFLAGS, so a test's own `make
run` would take those arguments as its own; CORPUS, SET, VERBOSE and the Makefile's other settings
would reach it the same way, and PYTEST_ADDOPTS a nested pytest. conftest drops them from the test
session's environment, which every process a test starts inherits."""

from __future__ import annotations

import re
from collections.abc import MutableMapping

from pipeline.config import REPO_ROOT

MAKE_OWN = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")
# Every setting the Makefile takes from a command line or the environment (`NAME ?= default`).
MAKEFILE_SETTINGS = tuple(re.findall(r"^(\w+) \?=", (REPO_ROOT / "Makefile").read_text(), re.MULTILINE))
OUTER_COMMAND = (*MAKE_OWN, *MAKEFILE_SETTINGS, "PYTEST_ADDOPTS")


def drop_outer_command(environment: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """`environment` without the outer make's and pytest's variables (changed in place, and returned)."""
    for name in OUTER_COMMAND:
        environment.pop(name, None)
    return environment
