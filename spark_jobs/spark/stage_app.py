"""What every stage application shares: arguments, the Spark session, running the stage with the
run's config between its completion markers (pipeline.run_folder), and turning bad input into one
clear error line and exit code 2."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone

from pipeline import lake, log, run_folder
from pipeline.config import PipelineConfig, to_uri
from pipeline.errors import BAD_INPUT_EXIT, PipelineError
from spark_jobs.spark import spark_metrics

StageBody = Callable[["SparkSession", PipelineConfig, str], dict]  # noqa: F821
logger = logging.getLogger(__name__)


def run_dir_argument(text: str) -> str:
    """--run-dir as a URI: a local path becomes file://, as in the config."""
    try:
        return to_uri(text).rstrip("/")
    except ValueError as error:  # ConfigError included
        raise argparse.ArgumentTypeError(str(error)) from None


def parse_args(stage: str, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=stage, description=f"Pipeline stage {stage!r} (a spark-submit application).")
    parser.add_argument(
        "--run-dir",
        required=True,
        type=run_dir_argument,
        help="the run folder: a local path, file:///... or s3://bucket/prefix/runs/<run_id>",
    )
    return parser.parse_args(argv)


def spark_session(stage: str):
    from pyspark.sql import SparkSession

    # Settings come from spark-submit: include/spark_submit.stage_conf's on every target, plus on
    # EMR the parallelism and the train executors' sizing of include/emr_steps.py. The event log's
    # folder is made here, in the driver, on every target (spark_jobs.spark.spark_metrics). It is not
    # removed when the stage fails: Spark's shutdown still writes there.
    builder = SparkSession.builder.appName(f"gpt-pipeline-{stage}")
    for key, value in spark_metrics.event_log_conf(tempfile.mkdtemp(prefix=f"spark-events-{stage}-")).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def stop_spark(spark) -> None:
    """Stop Spark so that spark-submit exits. Spark 3.5 runs barrier() calls on a non-daemon
    java.util.Timer that nothing cancels; locally the barrier tasks run in the driver's JVM, so
    that timer alone keeps spark-submit running after a barrier stage: without the cancel, the
    train stage's spark-submit was still running 300 s after its driver had stopped Spark (in
    0.76 s), where it otherwise exits at once (benchmarks/spark_startup.py, docs/benchmarks.md).
    Needed for correctness, not speed.

    pyspark's stop() would also wait for its accumulator server, whose handler notices a shutdown
    only when its 1-second poll times out: stop() took 0.76-1.03 s per stage waiting, a median of
    0.21 s without, about 4 s over a run's six applications. That server runs on a daemon thread that
    ends with this process, which ends next, so it is only told to stop."""
    context = spark.sparkContext
    try:  # a private field: a Spark build without it (EMR's are patched) must not fail a finished stage
        barrier = getattr(getattr(context._jvm.org.apache.spark, "BarrierTaskContext$"), "MODULE$")
        getattr(barrier, "org$apache$spark$BarrierTaskContext$$timer")().cancel()
    except Exception as error:
        logger.warning(
            "barrier timer not cancelled (%s): after a barrier stage, spark-submit may not exit on its own",
            type(error).__name__,
        )
    # Private too: a pyspark without it is stopped the ordinary way, a second slower.
    accumulator_server = getattr(context, "_accumulatorServer", None)
    if accumulator_server is not None:
        context._accumulatorServer = None
    spark.stop()
    if accumulator_server is not None:
        accumulator_server.server_shutdown = True


def run_stage(stage: str, body: StageBody, argv: list[str] | None = None, resume_folder: str | None = None) -> dict:
    """Run one stage against a run folder; exits 2 with a one-line message on bad input.

    `resume_folder` (in the run folder) holds what an unfinished attempt of the stage resumes from
    (train's backups): it goes once the stage is complete, so the next run of the stage starts over."""
    log.setup(stage)
    run = parse_args(stage, argv).run_dir
    try:
        config = run_folder.read_config(run)
        leftovers = (
            run_folder.error_path(stage),
            run_folder.progress_path(stage),
            run_folder.spark_event_log_path(stage),
        )
        for leftover in leftovers:
            lake.delete(lake.join(run, leftover))
        cleared = run_folder.clear_stage(run, stage)
        if stage in cleared and resume_folder:  # left by a completed run that could not remove it
            lake.delete(lake.join(run, resume_folder))
        stale = [name for name in cleared if name != stage]
        if stale:
            logger.log(log.NOTE, "%s read this stage's outputs: no longer complete", ", ".join(stale))
        started_at = utc_now()  # with Spark's start-up and teardown, for the report's timeline
        spark = spark_session(stage)
        started = time.perf_counter()
        stats = body(spark, config, run)
        # The stage's own work; stopping Spark is teardown, like start-up.
        stats["duration_s"] = round(time.perf_counter() - started, 3)
        if "timings" in stats:  # seconds of each part of the body, to the millisecond as duration_s
            stats["timings"] = {part: round(seconds, 3) for part, seconds in stats["timings"].items()}
        stats["stage"] = stage
        event_log_folder = spark_metrics.event_log_folder(spark)
        stop_spark(spark)
        stats["spark"] = spark_metrics.record(run, stage, event_log_folder)
        stats |= {"started_at": started_at, "finished_at": utc_now()}
        run_folder.complete_stage(run, stage, stats)
        if resume_folder:
            remove_resume_folder(run, stage, resume_folder)
    except PipelineError as error:
        logger.error("%s", error)
        record_error(run, stage, str(error), bad_input=True)
        sys.exit(BAD_INPUT_EXIT)
    except Exception as error:
        record_error(run, stage, f"{type(error).__name__}: {error}", bad_input=False)
        raise
    logger.info("done: %s", json.dumps(brief(stats, run_folder.stats_path(stage)), sort_keys=True))
    return stats


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def remove_resume_folder(run: str, stage: str, folder: str) -> None:
    """After the completion marker, never before: a stage that fails before its marker is written
    resumes from the folder. A completed stage does not fail for it either: its next start removes it."""
    try:
        lake.delete(lake.join(run, folder))
    except OSError as error:
        logger.warning(
            "could not remove %s (%s); the stage's next run removes it",
            lake.join(run, folder),
            error,
            extra={"stage": stage},
        )


def record_error(run: str, stage: str, message: str, bad_input: bool, longest: int = 2000) -> None:
    """Leave the error in the run folder (errors/{stage}.json) for whoever runs the stage from
    elsewhere: an EMR step's own log reaches S3 only minutes after it ends, and the DAG's task shows
    this file at once and does not retry bad input. Only in a real run folder (one with its config),
    and only as far as writing works: the error itself is what the stage reports."""
    uri = lake.join(run, run_folder.error_path(stage))
    if len(message) > longest:
        message = message[:longest] + " ..."
    try:
        if lake.exists(lake.join(run, run_folder.CONFIG_FILE)):
            lake.write_json(uri, {"stage": stage, "error": message, "bad_input": bad_input})
    except Exception as failure:  # the stage's own error must still be reported
        logger.warning("could not write %s: %s", uri, failure, extra={"stage": stage})


def brief(stats: dict, where: str, longest: int = 10) -> dict:
    """The stats for the log line: a list longer than `longest` (one entry per corpus file, say)
    is only counted there; the stats file holds it all."""
    return {
        key: brief(value, where, longest)
        if isinstance(value, dict)
        else f"{len(value)} entries, see {where}"
        if isinstance(value, list) and len(value) > longest
        else value
        for key, value in stats.items()
    }
