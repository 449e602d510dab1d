"""The rehearsal's Spark standalone cluster: a master and two workers on their own loopback
addresses run a barrier stage whose tasks sit on distinct nodes, and stop() leaves nothing running."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from local_platform.rehearsal.cluster import SPARK_HOME, SparkStandaloneCluster

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
