"""The suite's two parts, told apart by what a test starts, and the guard that keeps them honest.

A test says with markers (MARKERS) what it starts that takes more than a moment: `spark` a JVM
(local Spark, spark-submit, a Spark standalone cluster), `tensorflow` TensorFlow beyond building a
small model (a training or generation process, the XLA-compiled generation loop), `airflow` an
Airflow database (a migration, dag.test(), `airflow dags test`), `pip` pip (wheels, a virtual
environment), `slow` an end-to-end run, which may start any of them. A module whose tests mostly
start one is marked as a whole (`pytestmark`), so that a test added to it is too.

`--part check` keeps the tests marked none of them (`make check`: the inner loop, minutes), `--part
rest` the others (`make test` runs check, then rest). Unlike a second `-m`, which would replace the
first, `--part` combines with whatever else selects tests: `-m`, `-k`, paths, `make test ARGS=…`.

The guard fails a test that starts what its markers do not say, in any part: while a test not
marked `spark` or `slow` runs, every JVM its processes start leaves a file in a folder of this
session (JAVA_TOOL_OPTIONS, which every HotSpot JVM reads); a test not marked `airflow` or `slow`
must leave the session's Airflow database (conftest's AIRFLOW_HOME) as it found it, absent until a
test makes it. TensorFlow and pip leave no such trace: their markers are the ones nothing checks.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

MARKERS = {
    "slow": "an end-to-end run (the DAG, the rehearsal, make run, a browser); it may start any of the below",
    "spark": "starts a JVM: local Spark, spark-submit, a Spark standalone cluster",
    "tensorflow": "runs TensorFlow beyond a small model: a training or generation process, compiled generation",
    "airflow": "makes an Airflow database: migrates one, or runs the DAG (dag.test(), airflow dags test)",
    "pip": "runs pip to build wheels or install into a new virtual environment",
}
HEAVY = tuple(MARKERS)
PARTS = ("check", "rest")
LEFT_OUT = pytest.StashKey[int]()  # how many collected tests --part left out
# A test using one of these fixtures gets the marker without saying so.
MARKED_BY_FIXTURE = {"airflow_db": "airflow"}  # tests/dags/conftest.py: a reset Airflow database
JVM_TRACES = Path(tempfile.mkdtemp(prefix="gpt-pipeline-test-jvms-"))
JVM_TRACE_OPTION = f"-Xlog:gc:file={JVM_TRACES}/jvm-%p.log"


def pytest_configure(config: pytest.Config) -> None:
    for name, description in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {description}")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--part",
        choices=PARTS,
        help=f"check: only the tests marked none of {', '.join(HEAVY)} (make check); rest: only the others",
    )


def marked(item: pytest.Item, *names: str) -> bool:
    return any(item.get_closest_marker(name) for name in names)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, name in MARKED_BY_FIXTURE.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(name)
    part = config.getoption("part")
    if part is None:
        return
    keep, left_out = [], []
    for item in items:
        (keep if marked(item, *HEAVY) == (part == "rest") else left_out).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = keep
    config.stash[LEFT_OUT] = len(left_out)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A part that holds none of the tests asked for (`make test ARGS=tests/e2e/...` runs check on
    it first) has run all of them that are its own: none, which is no failure."""
    left_out = session.config.stash.get(LEFT_OUT, 0)
    if hasattr(session.config, "workeroutput"):  # a pytest-xdist worker: its controller decides
        session.config.workeroutput["left_out"] = left_out
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and left_out:
        session.exitstatus = pytest.ExitCode.OK


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist's controller collects nothing itself: it learns from each worker what --part left out."""
    stash = node.config.stash
    stash[LEFT_OUT] = stash.get(LEFT_OUT, 0) + node.workeroutput.get("left_out", 0)


def airflow_database() -> Path:
    return Path(os.environ["AIRFLOW_HOME"]) / "airflow.db"


def database_state() -> tuple[int, int] | None:
    """(modification time, size) of the session's Airflow database, None while there is none."""
    try:
        found = airflow_database().stat()
    except FileNotFoundError:
        return None
    return found.st_mtime_ns, found.st_size


class Guard:
    """What one test started that its markers do not allow."""

    def __init__(self) -> None:
        self.java_options = os.environ.get("JAVA_TOOL_OPTIONS")
        self.database: tuple[int, int] | None = None
        self.watch_jvms = self.watch_database = False

    def arm(self, item: pytest.Item) -> None:
        # Made again if gone: a cleaner of /tmp (a test's, a person's) may have removed it meanwhile.
        JVM_TRACES.mkdir(parents=True, exist_ok=True)
        for trace in JVM_TRACES.iterdir():
            trace.unlink()
        self.database = database_state()
        self.watch_jvms = not marked(item, "spark", "slow")
        self.watch_database = not marked(item, "airflow", "slow")
        if self.watch_jvms:
            os.environ["JAVA_TOOL_OPTIONS"] = " ".join(filter(None, [self.java_options, JVM_TRACE_OPTION]))

    def disarm(self) -> list[str]:
        """What the test started unmarked, each as a sentence."""
        if self.java_options is None:
            os.environ.pop("JAVA_TOOL_OPTIONS", None)
        else:
            os.environ["JAVA_TOOL_OPTIONS"] = self.java_options
        found = []
        jvms = len(list(JVM_TRACES.iterdir())) if JVM_TRACES.is_dir() else 0
        if self.watch_jvms and jvms:
            found.append(f"it started {jvms} JVM(s) (Spark) but is not marked spark")
        if self.watch_database and database_state() != self.database:
            found.append(f"it made or wrote the Airflow database {airflow_database()} but is not marked airflow")
        return found


GUARD = Guard()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    GUARD.arm(item)  # before the fixtures: a module's fixtures start in its first test's set-up


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    try:
        yield
    finally:
        found = GUARD.disarm()
    if found:
        pytest.fail(
            f"{item.nodeid}: {'; '.join(found)}. Mark it (tests/layers.py), so that `make check` leaves it out.",
            pytrace=False,
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(JVM_TRACES, ignore_errors=True)
