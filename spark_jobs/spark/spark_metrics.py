"""Spark's own metrics of a stage's application, the `spark` entry of its stats file, read from the
application's event log (the JSON lines of SparkListener events that Spark's History Server reads).

The event log, not the live UI's REST API: it is complete once Spark has stopped (the listener bus
is drained; a REST call right after the last action can miss its last tasks), it reads the same on
every target (local, the standalone cluster, YARN), and it is kept: the log goes into the run folder
(run_folder.spark_event_log_path) for the History Server (docs/monitoring.md).

The driver writes the log to a local temporary folder (event_log_conf); after Spark has stopped,
`record` summarises it and uploads it. Metrics never fail a stage: whatever goes wrong is a WARNING
and `spark: null`.
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
from collections.abc import Iterable, Iterator
from pathlib import Path
from urllib.parse import urlparse

from pipeline import lake, run_folder

logger = logging.getLogger(__name__)


def event_log_conf(folder: str | Path) -> dict[str, str]:
    """The settings that make the application log its events into `folder` (an existing local folder),
    uncompressed and in one file, so that `record` reads it as JSON lines."""
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": Path(folder).resolve().as_uri(),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }


def event_log_folder(spark) -> Path | None:
    """The local folder the running application logs its events into (a session made elsewhere, by
    a test, has its own settings); None when it logs none there."""
    try:
        conf = spark.sparkContext.getConf()
        folder = urlparse(conf.get("spark.eventLog.dir", ""))
        if conf.get("spark.eventLog.enabled", "false").lower() == "true" and folder.scheme == "file":
            return Path(folder.path)
    except Exception as error:  # metrics never fail a stage
        logger.debug("no event log folder: %s", error)
    return None


def record(run: str, stage: str, folder: Path | None) -> dict | None:
    """After Spark has stopped: the summary of the event log in `folder`, which is uploaded into the
    run folder (`event_log`) and then removed; None, with a WARNING, when there is none to read."""
    try:
        if folder is None:
            raise FileNotFoundError("the application logged no events to a local folder (spark.eventLog.*)")
        log_file = event_log_file(folder)
        with log_file.open(encoding="utf-8") as lines:
            summary = summarise(events(lines))
        summary["event_log"] = keep_event_log(run, stage, log_file)
    except Exception as error:  # metrics never fail a stage
        logger.warning("no Spark metrics for this stage: %s: %s", type(error).__name__, error)
        summary = None
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
    return summary


def keep_event_log(run: str, stage: str, log_file: Path) -> str | None:
    """The event log's path in the run folder once uploaded there; None, with a WARNING, when it cannot be."""
    path = run_folder.spark_event_log_path(stage)
    try:
        lake.write_bytes(lake.join(run, path), log_file.read_bytes())
    except Exception as error:
        logger.warning("Spark event log not kept in the run folder: %s: %s", type(error).__name__, error)
        return None
    return path


def event_log_file(folder: Path) -> Path:
    logs = [path for path in folder.iterdir() if path.is_file() and not path.name.startswith(".")]
    if len(logs) != 1:
        raise FileNotFoundError(
            f"expected one Spark event log in {folder}, found {len(logs)} (spark.eventLog.enabled set too late?)"
        )
    if logs[0].name.endswith(".inprogress"):
        raise ValueError(f"Spark event log {logs[0].name} is unfinished: Spark has not stopped")
    return logs[0]


def events(lines: Iterable[str]) -> Iterator[dict]:
    return (json.loads(line) for line in lines if line.strip())


def summarise(events: Iterable[dict]) -> dict:
    """The `spark` entry of a stage's stats from its application's events (event_log is set by `record`)."""
    app_id, executors, jobs, stages, tasks = None, set(), 0, set(), []
    for event in events:
        kind = event.get("Event")
        if kind == "SparkListenerApplicationStart":
            app_id = event.get("App ID")
        elif kind == "SparkListenerExecutorAdded":
            executors.add(event["Executor ID"])
        elif kind == "SparkListenerJobStart":
            jobs += 1
        elif kind == "SparkListenerStageCompleted":
            stages.add(event["Stage Info"]["Stage ID"])
        elif kind == "SparkListenerTaskEnd":
            tasks.append(event)
    metrics = [task.get("Task Metrics") or {} for task in tasks]
    return {
        "app_id": app_id,
        "executors": len(executors),
        "jobs": jobs,
        "stages": len(stages),
        "tasks": len(tasks),
        "failed_tasks": sum(1 for task in tasks if task["Task Info"].get("Failed")),
        "task_seconds": task_seconds(tasks),
        "executor_run_seconds": round(total(metrics, "Executor Run Time") / 1000, 3),
        "gc_seconds": round(total(metrics, "JVM GC Time") / 1000, 3),
        "input_bytes": total(metrics, "Input Metrics", "Bytes Read"),
        "input_records": total(metrics, "Input Metrics", "Records Read"),
        "output_bytes": total(metrics, "Output Metrics", "Bytes Written"),
        "output_records": total(metrics, "Output Metrics", "Records Written"),
        "shuffle_read_bytes": total(metrics, "Shuffle Read Metrics", "Remote Bytes Read")
        + total(metrics, "Shuffle Read Metrics", "Local Bytes Read"),
        "shuffle_write_bytes": total(metrics, "Shuffle Write Metrics", "Shuffle Bytes Written"),
        "peak_execution_memory_bytes": max((task.get("Peak Execution Memory", 0) for task in metrics), default=0),
        "event_log": None,
    }


def task_seconds(tasks: list[dict]) -> dict[str, float | None]:
    """Each task's wall time, launch to finish; None for an application that ran no task."""
    seconds = [(task["Task Info"]["Finish Time"] - task["Task Info"]["Launch Time"]) / 1000 for task in tasks]
    if not seconds:
        return {"min": None, "median": None, "max": None}
    return {
        "min": round(min(seconds), 3),
        "median": round(statistics.median(seconds), 3),
        "max": round(max(seconds), 3),
    }


def total(metrics: list[dict], *keys: str) -> int:
    """The sum over tasks of one metric, `keys` its path in the tasks' metrics."""
    result = 0
    for values in metrics:
        for key in keys:
            values = values.get(key) or {}
        result += values or 0
    return result
