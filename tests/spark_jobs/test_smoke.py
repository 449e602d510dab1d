"""The EMR target's cluster check (spark_jobs/smoke.py): the driver's verdicts on what the nodes
reported, a node's probe of the run folder and of its packages, and the one line of findings."""

from __future__ import annotations

import pytest

from pipeline import lake, run_folder
from spark_jobs import smoke

EXECUTOR_MB = {"spark.executor.memory": 6656, "spark.executor.memoryOverhead": 19968}
YARN = {"yarn.scheduler.maximum-allocation-mb": 28672, "yarn.nodemanager.resource.memory-mb": 28672}


def node(worker: int, address: str, **fields) -> dict:
    versions = {"python": "3.11.14", "numpy": "2.4.0", "pyarrow": "26.0.0", "pyspark": "3.5.9", "tensorflow": "2.21.0"}
    probed = {"worker": worker, "address": address, "versions": versions, "import_errors": {}, "run_folder_error": None}
    return probed | fields


def found(*nodes: dict, master: str = "yarn", yarn: dict | None = YARN) -> dict:
    return {"master": master, "nodes": list(nodes), "yarn": yarn, "executor_mb": EXECUTOR_MB}


def test_a_cluster_whose_nodes_are_distinct_and_whole_passes():
    assert smoke.cluster_problems(found(node(0, "10.0.1.17"), node(1, "10.0.1.18"))) == []
    # The rehearsal's standalone master has no YARN to check against.
    assert (
        smoke.cluster_problems(found(node(0, "127.0.0.2"), node(1, "127.0.0.3"), master="spark://m", yarn=None)) == []
    )


def test_two_workers_on_one_node_fail_the_check_naming_the_node_and_the_settings():
    (problem,) = smoke.cluster_problems(found(node(0, "10.0.1.17"), node(1, "10.0.1.17")))
    assert "but workers 0, 1 on 10.0.1.17 (hosts by worker: 10.0.1.17, 10.0.1.17)" in problem
    assert "train.num_workers must not exceed the cluster's nodes (emr.core_instance_count)" in problem
    # On local[N] the workers share this machine by design.
    assert smoke.cluster_problems(found(node(0, "127.0.0.1"), node(1, "127.0.0.1"), master="local[2]", yarn=None)) == []


def test_an_executor_bigger_than_yarns_largest_container_fails_the_check_naming_both_sides():
    small = {"yarn.scheduler.maximum-allocation-mb": 12288, "yarn.nodemanager.resource.memory-mb": 28672}
    (problem,) = smoke.cluster_problems(found(node(0, "10.0.1.17"), node(1, "10.0.1.18"), yarn=small))
    assert problem.startswith(
        "an executor asks YARN for 26,624 MB (spark.executor.memory 6,656 MB + spark.executor.memoryOverhead "
        "19,968 MB), more than its largest container (yarn.scheduler.maximum-allocation-mb 12,288 MB, "
        "yarn.nodemanager.resource.memory-mb 28,672 MB)"
    )
    assert "emr.core_instance_type's yarn_memory_mb in include/config/emr_cluster.yaml" in problem
    exact = dict.fromkeys(YARN, sum(EXECUTOR_MB.values()))
    assert smoke.allocation_problem(exact, EXECUTOR_MB) is None
    assert smoke.allocation_problem(None, EXECUTOR_MB) is None


def test_a_package_that_does_not_import_and_a_run_folder_out_of_reach_are_named_with_their_node():
    broken = node(1, "10.0.1.18", import_errors={"tensorflow": "ImportError: libstdc++.so.6: GLIBCXX_3.4.30"})
    unreachable = node(0, "10.0.1.17", run_folder_error="s3://b/runs/r/_smoke/node-0: OSError: AccessDenied")
    assert smoke.cluster_problems(found(unreachable, broken)) == [
        "worker 0 on 10.0.1.17: the run folder is not writable and readable: "
        "s3://b/runs/r/_smoke/node-0: OSError: AccessDenied",
        "worker 1 on 10.0.1.18: tensorflow does not import (ImportError: libstdc++.so.6: GLIBCXX_3.4.30)",
    ]


def test_the_findings_line_names_each_workers_address_and_versions_and_yarns_limits():
    line = smoke.summary(found(node(0, "10.0.1.17"), node(1, "10.0.1.18")))
    assert line.startswith(
        "worker 0 on 10.0.1.17: python 3.11.14, numpy 2.4.0, pyarrow 26.0.0, pyspark 3.5.9, tensorflow 2.21.0; "
        "worker 1 on 10.0.1.18: "
    )
    assert "; yarn.scheduler.maximum-allocation-mb 28,672 MB, yarn.nodemanager.resource.memory-mb 28,672 MB; " in line
    assert line.endswith("executors ask spark.executor.memory 6,656 MB + spark.executor.memoryOverhead 19,968 MB")
    assert "no YARN (spark://m)" in smoke.summary(found(node(0, "127.0.0.2"), master="spark://m", yarn=None))


def test_a_package_that_does_not_import_is_reported_with_its_error(monkeypatch):
    monkeypatch.setattr(smoke, "PACKAGES", ("numpy", "no_such_package_here"))
    versions, errors = smoke.package_versions()
    assert set(versions) == {"python", "numpy"} and versions["python"].startswith("3.11.")
    assert errors == {"no_such_package_here": "ModuleNotFoundError: No module named 'no_such_package_here'"}


def test_a_node_writes_reads_back_and_removes_its_probe_in_the_run_folder(folder):
    assert smoke.probe_run_folder(folder, 1) is None
    assert not lake.exists(lake.join(folder, run_folder.smoke_probe_path(1)))


def test_a_run_folder_the_node_cannot_write_is_named(tmp_path):
    blocked = tmp_path / "run"
    blocked.write_text("a file where the run folder should be")
    problem = smoke.probe_run_folder(blocked.as_uri(), 0)
    assert problem is not None and problem.startswith(f"{blocked.as_uri()}/_smoke/node-0: ")


@pytest.mark.parametrize("master", ["yarn", "spark://127.0.0.1:7077"])
def test_the_check_applies_to_the_masters_training_checks(master):
    twice = found(node(0, "10.0.1.17"), node(1, "10.0.1.17"), master=master, yarn=None)
    assert smoke.address_problem(twice["nodes"], master) is not None
