"""A stage's spark-submit ends with the task that started it, however the task ends: killed
outright (kill -9, the OOM killer, a worker lost), it takes its spark-submit along within
STOP_GRACE_S, and the run folder's lock stays held until that has happened, so a retry never
trains beside a stage still running in the same run folder."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from include.local_spark import LOOPBACK_CONF, STOP_GRACE_S
from local_platform.process_tree import descendants
from pipeline.config import REPO_ROOT

pytestmark = pytest.mark.spark

# A Spark application whose one task, in a Python worker, marks that it runs, then works for ten minutes.
APPLICATION = """
import sys, time
from pyspark.sql import SparkSession

def work(_, marker=sys.argv[1]):
    open(marker, "w").close()
    time.sleep(600)
    yield 0

SparkSession.builder.getOrCreate().sparkContext.parallelize([0], 1).mapPartitions(work).collect()
"""

# The task: holds a run folder's lock and runs the application with spark-submit as a stage is run.
TASK = """
import sys
from pathlib import Path
from include import local_spark, locks, loopback_only

lock, contained, argv = Path(sys.argv[1]), sys.argv[2] == "contained", sys.argv[3:]
launched = loopback_only.contained(argv) if contained else argv
with locks.held(lock, "the DAG's task train", str):
    sys.exit(local_spark.run_spark_submit(launched, local_spark.spark_env()))
"""


def alive(pid: int) -> bool:
    """True until every thread of `pid` has exited: a JVM's leader thread shows as a zombie while
    its other threads are still closing the process's files, the lock among them."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z" or len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def holds_open(pid: int, path: Path) -> bool:
    folder = Path(f"/proc/{pid}/fd")
    try:
        return any(os.readlink(folder / fd) == str(path) for fd in os.listdir(folder))
    except OSError:
        return False


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {seconds} s")
        time.sleep(0.2)


@pytest.mark.parametrize("how", ["contained", "plain"])
def test_a_killed_task_takes_its_spark_submit_along_and_the_lock_lasts_until_it_has_ended(how, tmp_path):
    (tmp_path / "app.py").write_text(APPLICATION)
    lock, marker = tmp_path / "run" / ".in-use.lock", tmp_path / "working"
    conf = [arg for key, value in LOOPBACK_CONF.items() for arg in ("--conf", f"{key}={value}")]
    spark_submit = str(Path(sys.executable).parent / "spark-submit")
    argv = [spark_submit, "--master", "local[1]", *conf, str(tmp_path / "app.py"), str(marker)]
    task = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(TASK), str(lock), how, *argv],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    stage: list[int] = []
    try:
        wait_for(marker.exists, 120, "the application's task did not start")
        stage += descendants(task.pid)
        assert any(holds_open(pid, lock) for pid in stage), "spark-submit does not hold the run folder's lock"

        task.send_signal(signal.SIGKILL)
        task.wait()
        wait_for(lambda: not any(map(alive, stage)), STOP_GRACE_S, "spark-submit and its workers did not end")
    finally:
        for pid in [task.pid, *stage, *descendants(task.pid)]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    with open(lock, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again: BlockingIOError otherwise
