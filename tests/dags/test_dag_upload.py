"""Retraining on upload in Airflow itself: the DAG deployed with corpus_queue, Airflow's DAG
processor, triggerer and scheduler running on a home and SQLite database of the test's own, and a
moto server whose corpus bucket notifies the queue as docs/dag.md says. An object put under the
corpus's prefix becomes an asset event, and the event a queued run of the DAG with the deployment's
settings. (The trigger alone, on moto: tests/include/test_upload_trigger.py.)"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest

from include.airflow_names import DAG_ID
from local_platform.airflow_home import AIRFLOW, airflow_env
from local_platform.moto_s3 import LocalS3
from pipeline.config import REPO_ROOT
from tests.deployments import write_deployment
from tests.upload_queue import UploadQueue

pytestmark = [pytest.mark.slow, pytest.mark.airflow]  # Airflow's components on a database they migrate

BUCKET = "corpus-bucket"
# The scheduler and the triggerer without their log servers, which would listen on every interface
# (ports 8793 and 8794), as `make airflow` runs them (local_platform/standalone.py).
COMPONENTS = (["dag-processor"], ["triggerer", "--skip-serve-logs"], ["scheduler", "--skip-serve-logs"])
# How long a component has to end after SIGTERM before it is killed. How they stop is not what this
# test checks, and a graceful stop takes long: the triggerer waits out its trigger's long poll
# (20 s), the scheduler the queued run's first task.
STOP_SECONDS = 5


def query(home: Path, sql: str, *args) -> list[tuple]:
    try:
        with closing(sqlite3.connect(home / "airflow.db", timeout=30)) as db:
            return db.execute(sql, args).fetchall()
    except sqlite3.OperationalError:  # a table the components have not made yet, or a busy database
        return []


def wait_for(found: Callable[[], list], what: str, seconds: float, logs: Path) -> list:
    deadline = time.monotonic() + seconds
    while not (rows := found()):
        if time.monotonic() > deadline:
            tails = {path.name: path.read_text(errors="replace")[-3000:] for path in logs.glob("*.log")}
            pytest.fail(f"no {what} in {seconds} s; the components' last output: {json.dumps(tails, indent=1)}")
        time.sleep(1)
    return rows


@contextmanager
def airflow_components(env: dict[str, str], home: Path) -> Iterator[None]:
    """The DAG processor, triggerer and scheduler, each in a process group of its own, stopped with
    what they started."""
    started = []
    try:
        for name, *options in COMPONENTS:
            log = (home / f"{name}.log").open("w")
            started.append(
                subprocess.Popen(
                    [str(AIRFLOW), name, *options],
                    env=env,
                    cwd=REPO_ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        yield
    finally:
        for process in started:
            os.killpg(process.pid, signal.SIGTERM)
        for process in started:
            try:
                process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture
def deployed(tmp_path) -> Iterator[tuple[UploadQueue, Path]]:
    """A moto server with the corpus bucket notifying its queue, and Airflow's components running
    the DAG deployed with that corpus and queue, its watcher's trigger started by the triggerer."""
    home = tmp_path / "airflow_home"
    home.mkdir()
    with LocalS3() as s3:
        uploads = UploadQueue(s3.endpoint_url, BUCKET, prefix="books/")
        deployment = {
            "corpus": f"s3://{BUCKET}/books/*.txt",
            "corpus_queue": uploads.url,
            "lake": str(tmp_path / "lake"),
        }
        env = airflow_env(home, s3) | {
            "GPT_PIPELINE_CONFIG": str(write_deployment(tmp_path / "pipeline.yaml", deployment))
        }
        subprocess.run([str(AIRFLOW), "db", "migrate"], env=env, cwd=REPO_ROOT, capture_output=True, check=True)
        with airflow_components(env, home):
            running = "SELECT id FROM trigger WHERE classpath = ? AND triggerer_id IS NOT NULL"
            classpath = "include.upload_trigger.CorpusUploadTrigger"
            wait_for(lambda: query(home, running, classpath), "watcher's trigger in the triggerer", 300, home)
            yield uploads, home


def test_an_upload_under_the_corpus_prefix_queues_a_run_with_the_deployments_settings(deployed):
    uploads, home = deployed
    uploaded = uploads.upload("books/new.txt")
    runs = "SELECT id, run_type, conf FROM dag_run WHERE dag_id = ?"
    # After the trigger's quiet poll (20 s) that ends the burst of uploads.
    ((run_id, run_type, conf),) = wait_for(lambda: query(home, runs, DAG_ID), "run of the DAG", 180, home)
    assert run_type == "asset_triggered"
    assert json.loads(conf or "{}") == {}  # no settings: the run takes the deployment's
    events = "SELECT extra FROM asset_event JOIN dagrun_asset_event ON asset_event.id = event_id WHERE dag_run_id = ?"
    (extra,) = [json.loads(extra) for (extra,) in query(home, events, run_id)]
    assert extra == {"from_trigger": True, "payload": {"uploads": [uploaded], "count": 1}}
    assert uploads.messages_left() == 0
