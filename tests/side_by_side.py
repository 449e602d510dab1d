"""Which tests may run beside each other on pytest-xdist's workers, and in which order.

`make test` runs the rest part on the Makefile's TEST_WORKERS workers with `--dist loadfile`: a
worker takes a whole test file at a time, so that a module's fixture (a DAG run, a trained model, a
rehearsal) is made once, on the worker whose tests use it. Tests bind the ports they are given
(tests/listening.py's free_port), except the files below, which hold fixed addresses; they form one
unit of work, which one worker runs a file after the other while the other workers work through
the rest.

The units are handed out longest first (LONG_FILE_SECONDS, then by number of tests as pytest-xdist
does): a long file handed out last would leave the other workers idle for its whole length.
"""

from __future__ import annotations

from collections import Counter

import pytest
from xdist.scheduler import LoadScopeScheduling

FIXED_ADDRESSES = "fixed-addresses"
FIXED_ADDRESS_FILES = {
    "tests/e2e/test_rehearsal.py": "the rehearsal's loopback nodes, 127.0.0.2 and 127.0.0.3",
    "tests/local_platform/test_rehearsal_cluster.py": "the rehearsal's loopback nodes, 127.0.0.2 and 127.0.0.3",
}
# Seconds each file took in a fresh clone's `make test` on 2 cores (2026-11-28, the 25 slowest
# tests' share, rounded), for the longest files. A guess does for a new one: this only orders the work.
LONG_FILE_SECONDS = {
    "tests/e2e/test_rehearsal.py": 310,
    "tests/local_platform/test_rehearsal_cluster.py": 85,
    "tests/e2e/test_compose_stack.py": 265,
    "tests/e2e/test_ui_trigger.py": 210,
    "tests/spark_jobs/test_train.py": 175,
    "tests/e2e/test_dag_local.py": 120,
    "tests/dags/test_dag_imports.py": 45,
}


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its file, or the one unit of the fixed-address files."""
    path = file_of(nodeid)
    return FIXED_ADDRESSES if path in FIXED_ADDRESS_FILES else path


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def longest_first(nodeids: list[str]) -> list[str]:
    """The tests grouped by unit, the units by their LONG_FILE_SECONDS, then by their number of tests,
    longest first; a unit's tests keep their order."""
    tests_of = Counter(unit_of(nodeid) for nodeid in nodeids)
    seconds_of = Counter()
    for path in {file_of(nodeid) for nodeid in nodeids}:
        seconds_of[unit_of(path)] += LONG_FILE_SECONDS.get(path, 0)
    units = sorted(tests_of, key=lambda unit: (-seconds_of[unit], -tests_of[unit]))
    rank = {unit: index for index, unit in enumerate(units)}
    return sorted(nodeids, key=lambda nodeid: rank[unit_of(nodeid)])


class FilesSideBySide(LoadScopeScheduling):
    """pytest-xdist's loadfile, with the fixed-address files as one unit, handed out in the order
    the workers collected them (pytest_collection_modifyitems below)."""

    def __init__(self, config: pytest.Config, log=None):
        super().__init__(config, log)
        config.option.loadscopereorder = False

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every process collects the tests longest unit first (after tests/layers.py kept a part's)."""
    position = {nodeid: index for index, nodeid in enumerate(longest_first([item.nodeid for item in items]))}
    items.sort(key=lambda item: position[item.nodeid])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log) -> LoadScopeScheduling | None:
    if config.getoption("dist") == "loadfile":
        return FilesSideBySide(config, log)
    return None
