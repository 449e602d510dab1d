"""Spark's metrics of a stage (spark_jobs.spark.spark_metrics): the summary of a recorded event log,
a stage whose metrics cannot be had, and a real small stage run with spark-submit whose event log
the History Server that ships with pyspark serves."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from include.local_spark import LOOPBACK_CONF, spark_env
from include.spark_submit import stage_conf
from pipeline import lake, run_folder
from pipeline.config import REPO_ROOT
from pipeline.stages import Stage
from spark_jobs.spark import spark_metrics
from tests.conftest import SHARED_CORPUS, new_run, small_config
from tests.listening import free_port, listening_sockets
from tests.spark_jobs import metrics_stage

# The events spark_metrics reads of a real run of metrics_stage (local[2]), trimmed to the fields it reads.
RECORDED = Path(__file__).with_name("metrics_stage.events.jsonl")


def test_the_summary_of_a_recorded_event_log():
    with RECORDED.open(encoding="utf-8") as lines:
        summary = spark_metrics.summarise(spark_metrics.events(lines))
    assert summary == {
        "app_id": "local-1795648957074",
        "executors": 1,
        "jobs": 4,
        "stages": 4,
        "tasks": 8,
        "failed_tasks": 0,
        "task_seconds": {"min": 0.999, "median": 2.467, "max": 10.488},
        "executor_run_seconds": 25.273,
        "gc_seconds": 0.95,
        # Spark counts the rows a task reads from spark.range as input too: the write's 5,000 and the read's.
        "input_bytes": 9327,
        "input_records": 10000,
        "output_bytes": 23429,
        "output_records": 5000,
        "shuffle_read_bytes": 874,
        "shuffle_write_bytes": 874,
        "peak_execution_memory_bytes": 8650736,
        "event_log": None,
    }


def test_failed_tasks_are_counted_and_an_application_without_tasks_has_no_durations():
    failed = {
        "Event": "SparkListenerTaskEnd",
        "Task Info": {"Launch Time": 1000, "Finish Time": 3500, "Failed": True},
        "Task Metrics": {"Executor Run Time": 2000},
    }
    summary = spark_metrics.summarise([failed])
    assert (summary["tasks"], summary["failed_tasks"], summary["executor_run_seconds"]) == (1, 1, 2.0)
    assert summary["task_seconds"] == {"min": 2.5, "median": 2.5, "max": 2.5}
    assert spark_metrics.summarise([])["task_seconds"] == {"min": None, "median": None, "max": None}


@pytest.mark.parametrize("log_name", ["no folder", "no log", "local-1.inprogress"])
def test_a_stage_without_a_finished_event_log_gets_none_and_a_warning(tmp_path, caplog, log_name):
    folder = None if log_name == "no folder" else tmp_path / "events"
    if folder:
        folder.mkdir()
    if log_name.startswith("local-"):
        (folder / log_name).write_text(RECORDED.read_text())
    run = lake.join(f"file://{tmp_path}", "run")
    with caplog.at_level(logging.WARNING, logger="spark_jobs"):
        assert spark_metrics.record(run, "window", folder) is None
    assert "no Spark metrics for this stage" in caplog.text
    assert not lake.exists(lake.join(run, run_folder.spark_event_log_path("window")))


def submit(folder: Path, master: str) -> dict:
    """metrics_stage run with spark-submit, bound to loopback as the local stages are."""
    run = new_run(small_config(folder, SHARED_CORPUS), "metrics")
    stage = Stage(metrics_stage.STAGE, Path(metrics_stage.__file__).name, inputs=(), settings=())  # no barrier
    settings = stage_conf(stage) | LOOPBACK_CONF
    conf = [option for key, value in settings.items() for option in ("--conf", f"{key}={value}")]
    argv = [str(Path(sys.executable).parent / "spark-submit"), "--master", master, *conf]
    env = spark_env() | {"PYTHONPATH": str(REPO_ROOT)}
    # A small application: its limit leaves the test's time-out room to report it.
    subprocess.run([*argv, metrics_stage.__file__, "--run-dir", run], env=env, check=True, timeout=300)
    return {"run": run, "stats": lake.read_json(run_folder.stats_uri(run, metrics_stage.STAGE))}


def test_an_event_log_that_cannot_be_kept_leaves_the_metrics_without_it(tmp_path, caplog):
    folder = tmp_path / "events"
    folder.mkdir()
    (folder / "local-1795648957074").write_text(RECORDED.read_text())
    (tmp_path / "a file").write_text("where the run folder would be")
    with caplog.at_level(logging.WARNING, logger="spark_jobs"):
        summary = spark_metrics.record(f"file://{tmp_path}/a file", "window", folder)
    assert summary["tasks"] == 8 and summary["event_log"] is None
    assert "Spark event log not kept in the run folder" in caplog.text and not folder.exists()


@pytest.fixture(scope="module")
def submitted(tmp_path_factory) -> dict:
    return submit(tmp_path_factory.mktemp("metrics"), "local[2]")


@pytest.mark.slow
def test_a_stage_records_its_spark_metrics_and_event_log(submitted):
    spark = submitted["stats"]["spark"]
    assert spark["app_id"].startswith("local-") and spark["executors"] == 1
    assert spark["tasks"] > 0 and spark["failed_tasks"] == 0 and spark["jobs"] >= 2
    assert spark["output_records"] == metrics_stage.ROWS and spark["input_records"] >= metrics_stage.ROWS
    assert spark["input_bytes"] > 0 and spark["shuffle_read_bytes"] > 0 and spark["shuffle_write_bytes"] > 0
    assert 0 <= spark["task_seconds"]["min"] <= spark["task_seconds"]["median"] <= spark["task_seconds"]["max"]
    assert spark["event_log"] == run_folder.spark_event_log_path(metrics_stage.STAGE)
    first = lake.read_text(lake.join(submitted["run"], spark["event_log"])).splitlines()[0]
    assert json.loads(first)["Event"] == "SparkListenerLogStart"


@pytest.mark.slow
def test_the_history_server_serves_the_run_folders_event_logs_on_loopback(submitted):
    """Started as docs/monitoring.md starts it."""
    port = free_port()
    logs = lake.join(submitted["run"], run_folder.SPARK_EVENTS_FOLDER)
    options = f"-Dspark.history.fs.logDirectory={logs} -Dspark.history.ui.port={port}"
    env = spark_env() | {"SPARK_HISTORY_OPTS": options}
    command = [f"{env['SPARK_HOME']}/bin/spark-class", "org.apache.spark.deploy.history.HistoryServer"]
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        applications = served_applications(f"http://127.0.0.1:{port}/api/v1/applications", server)
        sockets = listening_sockets(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert [application["id"] for application in applications] == [submitted["stats"]["spark"]["app_id"]]
    assert sockets and all(socket.loopback for socket in sockets), sockets


def served_applications(url: str, server: subprocess.Popen, patience_s: float = 120) -> list[dict]:
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        assert server.poll() is None, server.stderr.read().decode()[-3000:]
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                applications = json.load(response)
            if applications:  # the server lists the logs some seconds after it starts
                return applications
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"the History Server listed no application at {url} within {patience_s} s")
