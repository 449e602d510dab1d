"""The EMR rehearsal's runner: the substitutions made in a step's arguments (and only those), the
cluster's Spark settings with the nodes' Python replaced, and EMR's states and step logs played on
moto's backend with real commands (no Spark: a step here is any command-runner command)."""

from __future__ import annotations

import gzip
import sys
import time

import boto3
import pytest
from moto.server import ThreadedMotoServer

from include import emr_cluster, emr_code, emr_steps
from local_platform.rehearsal import emr_runner
from local_platform.rehearsal.emr_runner import EmrRehearsalRunner, memory_mb, spark_settings, substitute
from pipeline.config_files import load_config

MASTER = "spark://127.0.0.1:7077"
REGION = "us-east-1"
BUCKET = "rehearsal"
OVERRIDES = {"target": "emr", "corpus": f"s3://{BUCKET}/corpus/a.txt", "lake": f"s3://{BUCKET}/lake"}


def fetched(uri: str) -> str:
    return "/fetched/" + uri.rsplit("/", 1)[1]


def test_a_stage_steps_arguments_change_only_in_master_s3_files_and_resources():
    config = load_config(overrides=OVERRIDES)
    args = emr_steps.stage_step("train", config, "run-1")["HadoopJarStep"]["Args"]

    argv, changes = substitute(args, MASTER, fetched, worker_cores=1)

    assert len(argv) == len(args)
    changed = {(before, after) for before, after in zip(args, argv, strict=True) if before != after}
    assert changed == {
        ("yarn", MASTER),
        (f"{emr_code.code_uri(config, 'run-1')}/spark_jobs.zip", "/fetched/spark_jobs.zip"),
        (f"{emr_code.code_uri(config, 'run-1')}/spark_jobs/train.py", "/fetched/train.py"),
        ("spark.executor.cores=8", "spark.executor.cores=1"),
        ("spark.task.cpus=8", "spark.task.cpus=1"),
        (f"spark.executor.memory={emr_steps.train_executor_memory_mb(config)[0]}m", "spark.executor.memory=1024m"),
        (
            f"spark.executor.memoryOverhead={emr_steps.train_executor_memory_mb(config)[1]}m",
            "spark.executor.memoryOverhead=512m",
        ),
    }
    assert len(changes) == len(changed)
    # the time limit before spark-submit and the application's arguments are EMR's
    assert argv[:4] == args[:4] and argv[-2:] == args[-2:] and argv[-2] == "--run-dir"


def test_settings_that_fit_this_machine_are_kept():
    args = ["spark-submit", "--master", "yarn", "--conf", "spark.executor.memory=512m", "--conf", "spark.task.cpus=1"]
    args += ["/local/app.py", "--run-dir", "s3://b/lake/runs/x"]
    argv, changes = substitute(args, MASTER, fetched, worker_cores=1)
    assert argv == [*args[:2], MASTER, *args[3:]] and changes == [f"--master yarn -> {MASTER}"]


@pytest.mark.parametrize("value, mb", [("5632m", 5632), ("4g", 4096), ("512M", 512), (str(3 * 1024 * 1024), 3)])
def test_memory_settings_read_as_spark_does(value, mb):
    assert memory_mb(value) == mb


def test_the_nodes_python_becomes_this_projects_in_the_clusters_spark_settings():
    config = load_config(overrides=OVERRIDES)
    request = emr_cluster.job_flow_overrides(config, "run-1")
    venv = emr_cluster.read_template()["venv"]
    defaults, exports = spark_settings(request["Configurations"], emr_runner.nodes_python(request))
    assert emr_runner.nodes_python(request) == f"{venv}/bin/python"
    assert defaults["spark.pyspark.python"] == defaults["spark.pyspark.driver.python"] == sys.executable
    assert exports == {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


@pytest.fixture
def moto(monkeypatch):
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client("s3", region_name=REGION, endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
    yield endpoint
    server.stop()


class FakeSpark:
    """Stands in for the Spark standalone cluster: these tests run plain commands as steps."""

    master_url = MASTER

    def __init__(self, *args, **kwargs):
        self.stopped = False

    def start(self):
        return self

    def stop(self):
        self.stopped = True


def wait_for(condition, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def run_cluster(endpoint, script: bytes, idle_timeout_s=3600):
    s3 = boto3.client("s3", region_name=REGION, endpoint_url=endpoint)
    s3.put_object(Bucket=BUCKET, Key="code/bootstrap.sh", Body=script)
    client = boto3.client("emr", region_name=REGION, endpoint_url=endpoint)
    request = {
        "Name": "rehearsal-test",
        "ReleaseLabel": "emr-7.12.0",
        "LogUri": f"s3://{BUCKET}/logs/",
        "Instances": {
            "InstanceGroups": [
                {"InstanceRole": "MASTER", "InstanceType": "m5.xlarge", "InstanceCount": 1},
                {"InstanceRole": "CORE", "InstanceType": "m5.xlarge", "InstanceCount": 2},
            ],
            "KeepJobFlowAliveWhenNoSteps": True,
        },
        "BootstrapActions": [{"Name": "b", "ScriptBootstrapAction": {"Path": f"s3://{BUCKET}/code/bootstrap.sh"}}],
        "AutoTerminationPolicy": {"IdleTimeout": idle_timeout_s},
        "JobFlowRole": "r",
        "ServiceRole": "s",
    }
    return s3, client, client.run_job_flow(**request)["JobFlowId"]


def state(client, cluster_id):
    return client.describe_cluster(ClusterId=cluster_id)["Cluster"]["Status"]


def test_steps_run_in_order_with_their_exit_status_and_logs_and_the_cluster_terminates(moto, monkeypatch):
    monkeypatch.setattr(emr_runner, "SparkStandaloneCluster", FakeSpark)
    s3_client = lambda: boto3.client("s3", region_name=REGION, endpoint_url=moto)  # noqa: E731
    with EmrRehearsalRunner(s3_client, {"AWS_ENDPOINT_URL": moto}, REGION) as runner:
        s3, client, cluster_id = run_cluster(moto, b"#!/bin/bash\necho ok\n")
        assert state(client, cluster_id)["State"] in ("STARTING", "BOOTSTRAPPING", "WAITING")
        wait_for(lambda: state(client, cluster_id)["State"] == "WAITING")  # as wait_for_cluster does
        timeline = state(client, cluster_id)["Timeline"]
        assert timeline["CreationDateTime"] <= timeline["ReadyDateTime"]  # what no step's time limit counts
        steps = [
            {
                "Name": "first",
                "HadoopJarStep": {"Jar": "command-runner.jar", "Args": ["sh", "-c", "sleep 1; echo out"]},
            },
            {
                "Name": "second",
                "HadoopJarStep": {"Jar": "command-runner.jar", "Args": ["sh", "-c", "echo bad >&2; exit 3"]},
            },
        ]
        first, second = client.add_job_flow_steps(JobFlowId=cluster_id, Steps=steps)["StepIds"]
        assert client.describe_step(ClusterId=cluster_id, StepId=second)["Step"]["Status"]["State"] == "PENDING"
        wait_for(
            lambda: client.describe_step(ClusterId=cluster_id, StepId=second)["Step"]["Status"]["State"] == "FAILED"
        )
        first_step = client.describe_step(ClusterId=cluster_id, StepId=first)["Step"]["Status"]
        second_step = client.describe_step(ClusterId=cluster_id, StepId=second)["Step"]["Status"]
        assert first_step["State"] == "COMPLETED"
        assert first_step["Timeline"]["EndDateTime"] <= second_step["Timeline"]["StartDateTime"]  # one at a time
        wait_for(lambda: state(client, cluster_id)["State"] == "WAITING")

        def log(step_id, name):
            key = f"logs/{cluster_id}/steps/{step_id}/{name}.gz"
            return gzip.decompress(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()).decode()

        assert log(first, "stdout") == "out\n" and log(second, "stderr").endswith("bad\n")
        client.terminate_job_flows(JobFlowIds=[cluster_id])
        runner.wait_ended(cluster_id)
        assert state(client, cluster_id)["State"] == "TERMINATED"
        assert runner.plays[cluster_id].spark.stopped


def test_a_bootstrap_script_that_is_not_valid_bash_ends_the_cluster_with_errors(moto, monkeypatch):
    monkeypatch.setattr(emr_runner, "SparkStandaloneCluster", FakeSpark)
    s3_client = lambda: boto3.client("s3", region_name=REGION, endpoint_url=moto)  # noqa: E731
    with EmrRehearsalRunner(s3_client, {}, REGION) as runner:
        _, client, cluster_id = run_cluster(moto, b"#!/bin/bash\nif then fi (\n")
        runner.wait_ended(cluster_id)
        status = state(client, cluster_id)
        assert status["State"] == "TERMINATED_WITH_ERRORS"
        assert "bootstrap action 1 (b) failed" in status["StateChangeReason"]["Message"]


def test_an_idle_cluster_is_terminated_after_its_idle_timeout(moto, monkeypatch):
    monkeypatch.setattr(emr_runner, "SparkStandaloneCluster", FakeSpark)
    s3_client = lambda: boto3.client("s3", region_name=REGION, endpoint_url=moto)  # noqa: E731
    with EmrRehearsalRunner(s3_client, {}, REGION) as runner:
        _, client, cluster_id = run_cluster(moto, b"echo ok\n", idle_timeout_s=2)
        runner.wait_ended(cluster_id, timeout_s=30)
        status = state(client, cluster_id)
        assert status["State"] == "TERMINATED" and "idle" in status["StateChangeReason"]["Message"].lower()
