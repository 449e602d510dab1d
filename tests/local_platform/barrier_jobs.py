"""A barrier stage of the train stage's own tasks, or of the cluster check's, submitted to a
rehearsal SparkStandaloneCluster: tests/local_platform/test_rehearsal_cluster.py and
benchmarks/barrier_placement.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from include.spark_submit import package_code
from local_platform.rehearsal.cluster import SPARK_HOME, SparkStandaloneCluster

# The train stage's barrier stage (train.run_workers), stopped before TensorFlow starts: only when
# workers share a node (its run folder is then never read), or when Spark cannot place them all.
# The job prints the error and how long the stage took to fail.
TRAIN_TASKS_JOB = textwrap.dedent(
    """
    import sys, time
    from pyspark.sql import SparkSession
    from spark_jobs import train

    spark = SparkSession.builder.config("spark.executor.memory", "512m").getOrCreate()
    started = time.monotonic()
    try:
        train.run_workers(spark, "unused", int(sys.argv[1]))
    except Exception as error:
        message = " ".join(str(error).split())
        print(f"STAGE FAILED after {time.monotonic() - started:.1f} s: {type(error).__name__}: {message[:600]}")
    spark.stop()
    """
)


# The cluster check's barrier stage (smoke.probe_nodes) and its driver's verdicts, without a run's
# config: each task's address, then every problem found, one line each.
SMOKE_TASKS_JOB = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession
    from spark_jobs import smoke

    spark = SparkSession.builder.config("spark.executor.memory", "512m").getOrCreate()
    nodes = smoke.probe_nodes(spark, sys.argv[2], int(sys.argv[1]))
    print("ADDRESSES", " ".join(node["address"] for node in nodes))
    found = {"master": spark.sparkContext.master, "nodes": nodes, "yarn": None, "executor_mb": {}}
    for problem in smoke.cluster_problems(found):
        print("PROBLEM", problem)
    spark.stop()
    """
)


def submit_train_tasks(
    cluster: SparkStandaloneCluster, folder: Path, workers: int, conf: dict[str, str], timeout_s: float = 300
) -> subprocess.CompletedProcess:
    """spark-submit TRAIN_TASKS_JOB for `workers` barrier tasks with these settings; its output as text."""
    return submit_job(cluster, folder, TRAIN_TASKS_JOB, [str(workers)], conf, timeout_s)


def submit_smoke_tasks(
    cluster: SparkStandaloneCluster, folder: Path, workers: int, run: str, timeout_s: float = 300
) -> subprocess.CompletedProcess:
    """spark-submit SMOKE_TASKS_JOB for `workers` barrier tasks probing the run folder `run`."""
    return submit_job(cluster, folder, SMOKE_TASKS_JOB, [str(workers), run], {}, timeout_s)


def submit_job(
    cluster: SparkStandaloneCluster, folder: Path, text: str, args: list[str], conf: dict[str, str], timeout_s: float
) -> subprocess.CompletedProcess:
    job = folder / "barrier_job.py"
    job.write_text(text)
    library = package_code(folder / "code")
    env = dict(os.environ, SPARK_HOME=str(SPARK_HOME), PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    argv = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", cluster.master_url]
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    argv += ["--py-files", str(library), str(job), *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
