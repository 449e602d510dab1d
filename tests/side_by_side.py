"""Which tests may run beside each other on pytest-xdist's workers.

`make test` runs the rest part on two workers with `--dist loadfile`: a worker takes a whole test
file at a time, so that a module's fixture (a DAG run, a trained model, a rehearsal) is made once,
on the worker whose tests use it. Tests bind the ports they are given (tests/listening.py's
free_port), except the files below, which hold a fixed address; they form one unit of work,
which one worker runs a file after the other while the other worker works through the rest.
"""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadScopeScheduling

FIXED_ADDRESSES = "fixed-addresses"
FIXED_ADDRESS_FILES = {
    "tests/e2e/test_rehearsal.py": "the rehearsal's loopback nodes, 127.0.0.2 and 127.0.0.3",
    "tests/local_platform/test_rehearsal_cluster.py": "the rehearsal's loopback nodes, 127.0.0.2 and 127.0.0.3",
    "tests/e2e/test_compose_stack.py": "the compose stack's published ports, 127.0.0.1:8080 and :4566",
}


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its file, or the one unit of the fixed-address files."""
    path = nodeid.split("::", 1)[0]
    return FIXED_ADDRESSES if path in FIXED_ADDRESS_FILES else path


class FilesSideBySide(LoadScopeScheduling):
    """pytest-xdist's loadfile, with the fixed-address files as one unit."""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log) -> LoadScopeScheduling | None:
    if config.getoption("dist") == "loadfile":
        return FilesSideBySide(config, log)
    return None
