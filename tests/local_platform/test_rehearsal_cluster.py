"""The rehearsal's Spark standalone cluster, a master and workers on their own loopback addresses:
the train stage's barrier stage fails at once on it when it cannot have a node per worker, and
stop() leaves nothing running; on a node that would take two workers, the workers stop before
TensorFlow and the cluster check names the node. That the barrier tasks of a two-node cluster
land on distinct nodes is shown by the whole rehearsal (tests/e2e/test_rehearsal.py)."""

from __future__ import annotations

import os
import re

import pytest

from include import emr_steps
from local_platform.rehearsal.cluster import SparkStandaloneCluster
from tests.local_platform.barrier_jobs import submit_smoke_tasks, submit_train_tasks


@pytest.fixture(scope="module")
def one_node():
    """A cluster of one node with two cores, which takes two barrier tasks at once."""
    with SparkStandaloneCluster(workers=1, cores_per_worker=2, memory_per_worker_mb=1024) as cluster:
        yield cluster


@pytest.mark.slow
def test_workers_the_cluster_cannot_place_fail_the_stage_with_the_steps_settings_and_stop_leaves_nothing(tmp_path):
    """Three workers on two one-core nodes. With the train step's settings Spark checks 12 times and
    fails the stage, where its defaults wait 10 minutes. The checks are 1 s apart here instead of the
    step's 5 s (tests/include/test_emr_steps.py; benchmarks/barrier_placement.py times the step's own)."""
    conf = {**emr_steps.BARRIER_SLOTS_CHECK, "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s"}
    with SparkStandaloneCluster(workers=2, memory_per_worker_mb=1024) as cluster:
        done = submit_train_tasks(cluster, tmp_path, 3, conf)
        daemons, folder = cluster.pids(), cluster.folder
        assert len(daemons) >= 3  # the master and two workers (their executors have ended with the application)
    alive = [pid for pid in daemons if os.path.exists(f"/proc/{pid}")]
    assert alive == [] and not folder.exists(), "stop() left the cluster's processes or its folder"
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
def test_two_training_workers_on_one_node_stop_before_tensorflow_naming_the_node(one_node, tmp_path):
    """One node with two cores takes both barrier tasks: Spark places them, the workers refuse (and
    the run folder they were given, which does not exist, is never read)."""
    done = submit_train_tasks(one_node, tmp_path, 2, {})
    assert (
        "PipelineError: training worker 0: the training workers must run on distinct nodes, but workers 0, 1 on "
        "127.0.0.2 (hosts by worker: 127.0.0.2, 127.0.0.2)"
    ) in done.stdout, done.stderr[-3000:]


@pytest.mark.slow
def test_the_cluster_check_names_the_node_two_workers_would_share(one_node, tmp_path):
    """As the train stage's workers above: the cluster check's tasks land on one node, each reaches
    the run folder, and the driver names the node before any training would start."""
    run = (tmp_path / "run").as_uri()
    done = submit_smoke_tasks(one_node, tmp_path, 2, run)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ADDRESSES 127.0.0.2 127.0.0.2\n" in done.stdout, done.stderr[-3000:]
    problems = [line for line in done.stdout.splitlines() if line.startswith("PROBLEM")]
    assert problems == [
        "PROBLEM the training workers must run on distinct nodes, but workers 0, 1 on 127.0.0.2 (hosts by worker: "
        "127.0.0.2, 127.0.0.2): train.num_workers must not exceed the cluster's nodes (emr.core_instance_count), "
        "each of whose executors must own the whole node (include/emr_steps.py train_resources)"
    ], done.stdout
