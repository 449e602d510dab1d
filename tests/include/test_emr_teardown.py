"""terminate_cluster (include/emr_tasks.EmrTerminateRunClustersOperator) against a moto server's EMR
API: it ends the run's clusters, found by their run_id tag, also when create_cluster left no
cluster id in XCom, and no other run's cluster."""

from __future__ import annotations

import runpy
from unittest.mock import MagicMock

import boto3
import pytest
from botocore.config import Config

from include import emr_cluster, emr_tasks
from local_platform.moto_s3 import REGION, LocalS3
from pipeline.config import REPO_ROOT
from tests.deployments import deploy
from tests.include.emr_configs import RUN_ID, emr_config


@pytest.fixture
def emr(monkeypatch):
    """An EMR client of a fresh moto server, which the Airflow connection aws_default points at."""
    with LocalS3() as server:
        for name, value in server.connection_env().items():
            monkeypatch.setenv(name, value)
        yield boto3.client("emr", region_name=REGION, endpoint_url=server.endpoint_url, config=Config(proxies={}))


@pytest.fixture
def request_of_run() -> dict:
    return emr_cluster.job_flow_overrides(emr_config(), RUN_ID)


def start(emr, request: dict, run_id: str | None) -> str:
    """A cluster of `request`, tagged with `run_id` (untagged with None)."""
    tags = [tag for tag in request["Tags"] if tag["Key"] != emr_cluster.RUN_TAG]
    if run_id:
        tags.append({"Key": emr_cluster.RUN_TAG, "Value": run_id})
    return emr.run_job_flow(**request | {"Tags": tags})["JobFlowId"]


def states(emr, *cluster_ids: str) -> list[str]:
    return [emr.describe_cluster(ClusterId=cluster_id)["Cluster"]["Status"]["State"] for cluster_id in cluster_ids]


def terminate(request: dict, cluster_id: str | None) -> None:
    """terminate_cluster's execute, with the cluster id create_cluster's XCom resolves to (None when
    it has none) and the run's request from validate_config's."""
    operator = emr_tasks.EmrTerminateRunClustersOperator(
        task_id="terminate_cluster", job_flow_id=cluster_id, job_flow_overrides=request, region_name=REGION
    )
    operator.execute({"ti": MagicMock()})  # only the console links use the task instance


def test_with_no_cluster_id_in_xcom_the_runs_tagged_clusters_are_terminated_and_no_other(emr, request_of_run):
    ours = [start(emr, request_of_run, RUN_ID), start(emr, request_of_run, RUN_ID)]
    others = [start(emr, request_of_run, "another-run"), start(emr, request_of_run, None)]

    terminate(request_of_run, None)

    assert states(emr, *ours) == ["TERMINATED", "TERMINATED"]
    assert states(emr, *others) == ["WAITING", "WAITING"]


def test_with_a_cluster_id_that_cluster_and_the_runs_other_tagged_ones_are_terminated(emr, request_of_run):
    created, earlier = start(emr, request_of_run, RUN_ID), start(emr, request_of_run, RUN_ID)
    other_run = start(emr, request_of_run, "another-run")

    terminate(request_of_run, created)

    assert states(emr, created, earlier, other_run) == ["TERMINATED", "TERMINATED", "WAITING"]


def test_with_no_cluster_of_the_run_nothing_is_terminated(emr, request_of_run):
    other_run = start(emr, request_of_run, "another-run")
    terminate(request_of_run, None)
    terminate(None, None)  # validate_config's request missing too: no tag to look for
    assert states(emr, other_run) == ["WAITING"]


def test_the_dags_terminate_cluster_is_the_teardown_that_looks_up_the_runs_tag(tmp_path, monkeypatch):
    deploy(monkeypatch, tmp_path / "pipeline-emr.yaml", {"target": "emr", "lake": "s3://test-lake/pipeline"})
    dag = runpy.run_path(str(REPO_ROOT / "dags" / "gpt_pipeline.py"))["dag"]

    terminate_task = dag.get_task("terminate_cluster")
    assert isinstance(terminate_task, emr_tasks.EmrTerminateRunClustersOperator) and terminate_task.is_teardown
    assert terminate_task.job_flow_overrides.operator.task_id == "validate_config"
    assert terminate_task.job_flow_overrides.key == "job_flow_overrides"
    assert terminate_task.job_flow_id.operator.task_id == "create_cluster"
