"""The rest part's two workers: which tests share a unit of work (tests/side_by_side.py)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

from pipeline.config import REPO_ROOT
from tests.side_by_side import (
    FIXED_ADDRESS_FILES,
    FIXED_ADDRESSES,
    LONG_FILE_SECONDS,
    longest_first,
    pytest_collection_modifyitems,
    unit_of,
)


def test_a_test_file_is_a_unit_of_its_own():
    assert (
        unit_of("tests/e2e/test_dag_local.py::test_the_dag_run_succeeds_with_every_task")
        == "tests/e2e/test_dag_local.py"
    )
    assert unit_of("tests/spark_jobs/test_generate.py::test_x[top-k]") == "tests/spark_jobs/test_generate.py"


def test_the_fixed_address_files_are_one_unit():
    assert {unit_of(f"{path}::test_any[a::b]") for path in FIXED_ADDRESS_FILES} == {FIXED_ADDRESSES}


def test_each_fixed_address_file_exists():
    """A file renamed or moved would leave the group and run beside the others."""
    missing = [path for path in FIXED_ADDRESS_FILES if not (REPO_ROOT / path).is_file()]
    assert not missing


def test_each_timed_file_exists():
    missing = [path for path in LONG_FILE_SECONDS if not (REPO_ROOT / path).is_file()]
    assert not missing


def test_units_come_longest_first_then_by_number_of_tests_each_in_its_own_order():
    nodeids = [
        "tests/a.py::one",
        "tests/b.py::one",
        "tests/b.py::two",
        "tests/e2e/test_dag_local.py::first",
        "tests/e2e/test_dag_local.py::second",
        "tests/local_platform/test_rehearsal_cluster.py::cluster",
        "tests/e2e/test_rehearsal.py::rehearsal",
    ]
    assert longest_first(nodeids) == [
        "tests/local_platform/test_rehearsal_cluster.py::cluster",  # the fixed-address unit: both files' minutes
        "tests/e2e/test_rehearsal.py::rehearsal",
        "tests/e2e/test_dag_local.py::first",
        "tests/e2e/test_dag_local.py::second",
        "tests/b.py::one",  # no minutes: more tests first
        "tests/b.py::two",
        "tests/a.py::one",
    ]


def test_every_process_collects_the_longest_unit_first():
    items = [SimpleNamespace(nodeid=nodeid) for nodeid in ("tests/a.py::one", "tests/e2e/test_dag_local.py::one")]
    pytest_collection_modifyitems(items)
    assert [item.nodeid for item in items] == ["tests/e2e/test_dag_local.py::one", "tests/a.py::one"]


def test_make_test_schedules_with_it():
    """pytest-xdist takes the plugin's scheduler for --dist loadfile, as `make test` runs the rest part."""
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile", "-v",
         "tests/test_side_by_side.py::test_a_test_file_is_a_unit_of_its_own"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-3000:]
    assert "scheduling tests via FilesSideBySide" in completed.stdout
