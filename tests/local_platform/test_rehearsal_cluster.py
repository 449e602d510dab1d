"""The rehearsal's Spark standalone cluster: a master and two workers on their own loopback
addresses run a barrier stage whose tasks sit on distinct nodes, and stop() leaves nothing running;
the train stage's barrier stage fails at once on it when it cannot have a node per worker, and the
cluster check names the node two workers would share."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from include import emr_steps
from local_platform.rehearsal.cluster import SPARK_HOME, SparkStandaloneCluster
from tests.local_platform.barrier_jobs import submit_smoke_tasks, submit_train_tasks

BARRIER_JOB = textwrap.dedent(
    """
    import os, sys
    from pyspark import BarrierTaskContext
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master(sys.argv[1]).config("spark.executor.memory", "512m").getOrCreate()

    def task(_):
        context = BarrierTaskContext.get()
        return [(context.partitionId(), context.allGather(os.environ["SPARK_LOCAL_IP"]), os.getpid())]

    for partition, hosts, pid in spark.sparkContext.parallelize(range(2), 2).barrier().mapPartitions(task).collect():
        print("TASK", partition, ",".join(sorted(hosts)), pid)
    spark.stop()
    """
)


@pytest.mark.slow
def test_a_barrier_stage_runs_on_two_loopback_nodes_and_stop_leaves_nothing_running(tmp_path):
    job = tmp_path / "barrier.py"
    job.write_text(BARRIER_JOB)
    cluster = SparkStandaloneCluster(workers=2, memory_per_worker_mb=1024)
    with cluster:
        env = dict(os.environ, SPARK_HOME=str(SPARK_HOME), PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
        submit = [
            str(SPARK_HOME / "bin" / "spark-submit"),
            "--master",
            cluster.master_url,
            str(job),
            cluster.master_url,
        ]
        done = subprocess.run(submit, env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        tasks = [line.split() for line in done.stdout.splitlines() if line.startswith("TASK")]
        assert len(tasks) == 2
        assert {hosts for _, _, hosts, _ in tasks} == {"127.0.0.2,127.0.0.3"}
        daemons = cluster.pids()
        folder = cluster.folder
        assert len(daemons) >= 3  # the master and two workers (their executors have ended with the application)
    alive = [pid for pid in daemons if os.path.exists(f"/proc/{pid}")]
    assert alive == [] and not folder.exists()


@pytest.mark.slow
def test_training_workers_the_cluster_cannot_place_fail_the_stage_with_the_emr_steps_settings(tmp_path):
    """Three workers on two one-core nodes. With the train step's settings Spark checks 12 times and
    fails the stage, where its defaults wait 10 minutes. The checks are 1 s apart here instead of the
    step's 5 s (tests/include/test_emr_steps.py; benchmarks/barrier_placement.py times the step's own)."""
    conf = {**emr_steps.BARRIER_SLOTS_CHECK, "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s"}
    with SparkStandaloneCluster(workers=2, memory_per_worker_mb=1024) as cluster:
        done = submit_train_tasks(cluster, tmp_path, 3, conf)
    assert "STAGE FAILED after" in done.stdout and "BarrierJobSlotsNumberCheckFailed" in done.stdout, done.stderr[
        -3000:
    ]
    checks = emr_steps.BARRIER_SLOTS_CHECK["spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures"]
    # Spark's warning at each check, counting down to the last (the executors may register after the first).
    retries = re.findall(
        r"requires 3 slots, but only \d are available\. Will retry up to (\d+) more times", done.stderr
    )
    assert retries == [str(left) for left in range(int(checks), -1, -1)], done.stderr[-3000:]


@pytest.mark.slow
def test_two_training_workers_on_one_node_stop_before_tensorflow_naming_the_node(tmp_path):
    """One node with two cores takes both barrier tasks: Spark places them, the workers refuse (and
    the run folder they were given, which does not exist, is never read)."""
    with SparkStandaloneCluster(workers=1, cores_per_worker=2, memory_per_worker_mb=1024) as cluster:
        done = submit_train_tasks(cluster, tmp_path, 2, {})
    assert (
        "PipelineError: training worker 0: the training workers must run on distinct nodes, but workers 0, 1 on "
        "127.0.0.2 (hosts by worker: 127.0.0.2, 127.0.0.2)"
    ) in done.stdout, done.stderr[-3000:]


@pytest.mark.slow
def test_the_cluster_check_names_the_node_two_workers_would_share(tmp_path):
    """As the train stage's workers above: the cluster check's tasks land on one node, each reaches
    the run folder, and the driver names the node before any training would start."""
    run = (tmp_path / "run").as_uri()
    with SparkStandaloneCluster(workers=1, cores_per_worker=2, memory_per_worker_mb=1024) as cluster:
        done = submit_smoke_tasks(cluster, tmp_path, 2, run)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ADDRESSES 127.0.0.2 127.0.0.2\n" in done.stdout, done.stderr[-3000:]
    problems = [line for line in done.stdout.splitlines() if line.startswith("PROBLEM")]
    assert problems == [
        "PROBLEM the training workers must run on distinct nodes, but workers 0, 1 on 127.0.0.2 (hosts by worker: "
        "127.0.0.2, 127.0.0.2): train.num_workers must not exceed the cluster's nodes (emr.core_instance_count), "
        "each of whose executors must own the whole node (include/emr_steps.py train_resources)"
    ], done.stdout
