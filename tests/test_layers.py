"""tests/layers.py on a suite of its own: --part keeps the tests by their markers, and a test that
starts a JVM or writes the Airflow database without saying so fails."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline.config import REPO_ROOT

SUITE = """
import os
import subprocess
from pathlib import Path

import pytest


def write_the_database():
    with (Path(os.environ["AIRFLOW_HOME"]) / "airflow.db").open("a") as database:
        database.write("a row")


def start_a_jvm():
    subprocess.run(["java", "-version"], check=True, capture_output=True)


def test_writes_the_database_unmarked():
    write_the_database()


@pytest.mark.airflow
def test_writes_the_database():
    write_the_database()


def test_starts_a_jvm_unmarked():
    start_a_jvm()


@pytest.mark.spark
def test_starts_a_jvm():
    start_a_jvm()


def test_starts_nothing():
    pass
"""


def pytest_on_the_suite(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """pytest with tests/layers.py on SUITE, an Airflow home of its own."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ("tests.layers",)\n')
    (tmp_path / "test_suite.py").write_text(SUITE)
    (tmp_path / "airflow").mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "AIRFLOW_HOME": str(tmp_path / "airflow")}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # none of the installed plugins: a quicker start
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", *args]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def selected(tmp_path, part: str) -> list[str]:
    listed = pytest_on_the_suite(tmp_path, "--collect-only", "--part", part).stdout
    return sorted(line.split("::")[1] for line in listed.splitlines() if "::" in line)


def test_check_keeps_the_unmarked_tests_and_rest_the_marked_ones(tmp_path):
    unmarked = ["test_starts_a_jvm_unmarked", "test_starts_nothing", "test_writes_the_database_unmarked"]
    assert selected(tmp_path, "check") == unmarked
    assert selected(tmp_path, "rest") == ["test_starts_a_jvm", "test_writes_the_database"]


# make check runs its tests on pytest-xdist's workers, whose controller collects nothing itself.
@pytest.mark.parametrize("workers", [[], ["-p", "xdist", "-n", "2"]], ids=["one process", "xdist workers"])
def test_a_part_that_holds_none_of_the_tests_asked_for_passes(tmp_path, workers):
    none_of_check = ["--part", "check", "-k", "test_writes_the_database and not unmarked"]
    assert pytest_on_the_suite(tmp_path, *workers, *none_of_check).returncode == 0
    no_such_test = pytest_on_the_suite(tmp_path, *workers, "-k", "no_such_test")
    assert no_such_test.returncode == pytest.ExitCode.NO_TESTS_COLLECTED


def test_a_test_that_writes_the_airflow_database_unmarked_fails(tmp_path):
    done = pytest_on_the_suite(tmp_path, "-k", "database or nothing")
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout
    assert "PASSED test_suite.py::test_writes_the_database\n" in done.stdout
    assert "PASSED test_suite.py::test_starts_nothing\n" in done.stdout
    assert "ERROR test_suite.py::test_writes_the_database_unmarked" in done.stdout
    assert "made or wrote the Airflow database" in done.stdout and "is not marked airflow" in done.stdout


@pytest.mark.spark
def test_a_test_that_starts_a_jvm_unmarked_fails(tmp_path):
    done = pytest_on_the_suite(tmp_path, "-k", "jvm")
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout
    assert "PASSED test_suite.py::test_starts_a_jvm\n" in done.stdout
    assert "ERROR test_suite.py::test_starts_a_jvm_unmarked" in done.stdout
    assert "it started 1 JVM(s) (Spark) but is not marked spark" in done.stdout
