"""The pipeline DAG with target emr (dags/gpt_pipeline.py with the amazon provider's real
operators from include/emr_tasks.py) run by Airflow's dag.test() against a moto server: EMR and S3
over HTTP, fake credentials, every AWS endpoint forced to moto. moto never runs a step, so a
thread plays the cluster: it finishes each step as it is added (failing one when asked) and writes
what the stage would (its completion marker; the cluster check's findings, train's stats and
generate's sample for collect).
validate_config's other refusals, which need no run, call its task's function with Airflow's
context stood in for (`refusal`); one of them runs the DAG, to show the run stops there."""

from __future__ import annotations

import functools
import io
import json
import re
import runpy
import threading
import time
import zipfile
from datetime import datetime, timedelta, timezone
from unittest.mock import MagicMock

import boto3
import botocore.loaders
import botocore.session
import pytest
import requests
from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
from airflow.sdk.bases.sensor import BaseSensorOperator
from airflow.sdk.exceptions import AirflowFailException
from moto.core import DEFAULT_ACCOUNT_ID
from moto.core.exceptions import JsonRESTError
from moto.emr.exceptions import ValidationException
from moto.emr.models import emr_backends
from moto.emr.responses import ElasticMapReduceResponse
from moto.server import ThreadedMotoServer

from include import emr_cluster, emr_code, emr_cost, emr_steps, emr_tasks, wheelhouse
from include.alerts import FailureAlert
from include.spark_submit import package_code
from pipeline import lake, run_folder
from pipeline.config import REPO_ROOT
from pipeline.config_files import load_config
from pipeline.deployment import deployment_settings
from pipeline.errors import PipelineError
from pipeline.stages import CLUSTER_CHECK, EMR_STEP_NAMES, STAGE_NAMES
from spark_jobs.spark import stage_app
from tests.alert_topic import AlertTopic
from tests.deployments import amend_deployment, deploy

REGION = "us-east-1"
BUCKET = "gpt-pipeline-test"
DAG_FILE = REPO_ROOT / "dags" / "gpt_pipeline.py"
CORPUS = f"s3://{BUCKET}/corpus/*.txt"
OVERRIDES = {
    "target": "emr",
    "corpus": CORPUS,
    "lake": f"s3://{BUCKET}/lake",
    "s3": {"bucket": BUCKET},
    "emr": {"log_uri": f"s3://{BUCKET}/emr-logs/", "code_prefix": f"s3://{BUCKET}/code/", "poke_interval_seconds": 1},
    "corpus_roots": [f"s3://{BUCKET}/corpus/"],
}
# The sensors' poke interval here, and the longest sleep of dag.test()'s loop, which sleeps a second
# whenever only sensors waiting for their next poke are left: a run takes seconds, not half a minute.
POKE_S = 0.2
SONNET_LINE = b"Shall I compare thee to a summer's day?\n"
TRAIN_STATS = {"final_val_loss": 4.2, "final_val_nats_per_char": 1.3}
SMOKE_STATS = {
    "master": "yarn",
    "nodes": [
        {
            "worker": worker,
            "address": f"10.0.1.{17 + worker}",
            "versions": {"python": "3.11.14", "tensorflow": "2.21.0"},
        }
        for worker in range(2)
    ],
    "distinct_addresses": True,
    "yarn": {"yarn.scheduler.maximum-allocation-mb": 28672},
    "executor_mb": {"spark.executor.memory": 6656, "spark.executor.memoryOverhead": 19968},
}
TRAIN_PROGRESS = {
    "step": 1200,
    "max_steps": 3000,
    "loss": 3.21,
    "tokens_per_s": 25000,
    "seconds_left": 700,
    "updated_at": "2026-11-22T10:00:00Z",
}


@pytest.fixture(scope="module")
def moto_endpoint():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def emr_defaults(tmp_path, monkeypatch):
    """pipeline.yaml with target emr, as the DAG's defaults file."""
    return deploy(monkeypatch, tmp_path / "pipeline-emr.yaml", OVERRIDES)


@pytest.fixture
def aws(moto_endpoint, monkeypatch, emr_defaults):
    """Fake credentials and every client (boto3, pyarrow, the Airflow connection) on moto."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    connection = {"conn_type": "aws", "extra": {"endpoint_url": moto_endpoint, "region_name": REGION}}
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(connection))
    requests.post(f"{moto_endpoint}/moto-api/reset", timeout=10).raise_for_status()
    s3 = boto3.client("s3", region_name=REGION, endpoint_url=moto_endpoint)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="corpus/sonnets.txt", Body=SONNET_LINE * 100)
    # The nodes' wheelhouse, as if built, so validate_config downloads nothing; moto's EMR runs no
    # bootstrap to install it (tests/include/test_wheelhouse.py tests building and installing one).
    code_prefix = load_config(emr_defaults).emr.code_prefix
    wheelhouse.write_manifest({"test": "stand-in, no wheels"}, emr_code.wheelhouse_uri(code_prefix), s3)
    return {"s3": s3, "emr": boto3.client("emr", region_name=REGION, endpoint_url=moto_endpoint)}


@pytest.fixture
def run_job_flow_requests(monkeypatch) -> list[dict]:
    """The RunJobFlow requests as moto received them (moto drops some fields, e.g. AutoTerminationPolicy)."""
    received = []
    original = ElasticMapReduceResponse.run_job_flow

    def recording(self):
        received.append(json.loads(self.body))
        return original(self)

    monkeypatch.setattr(ElasticMapReduceResponse, "run_job_flow", recording)
    return received


def emr_backend():
    return emr_backends[DEFAULT_ACCOUNT_ID][REGION]


@pytest.fixture
def starting_clusters(monkeypatch) -> list[str]:
    """Clusters start STARTING as EMR's do (moto's are WAITING at once; the Cluster thread starts
    them); returns the cluster's state at each AddJobFlowSteps call."""
    states_at_add = []
    original_run, original_add = ElasticMapReduceResponse.run_job_flow, ElasticMapReduceResponse.add_job_flow_steps

    def run_job_flow(self):
        before = set(emr_backend().clusters)
        result = original_run(self)
        for cluster_id in set(emr_backend().clusters) - before:
            cluster = emr_backend().clusters[cluster_id]
            cluster.state, cluster.ready_datetime = "STARTING", None
        return result

    def add_job_flow_steps(self):
        states_at_add.append(emr_backend().clusters[json.loads(self.body)["JobFlowId"]].state)
        return original_add(self)

    monkeypatch.setattr(ElasticMapReduceResponse, "run_job_flow", run_job_flow)
    monkeypatch.setattr(ElasticMapReduceResponse, "add_job_flow_steps", add_job_flow_steps)
    return states_at_add


class Cluster(threading.Thread):
    """Plays the EMR cluster: finishes every added step in order, as its stage would. `failures`
    maps a stage to how many of its steps fail, each leaving its error in the run folder as the
    stage does (bad input when `bad_input`); a completed step writes its stage's marker. The steps
    of the stages in `hanging` run forever, and those in `timed_out` end as their time limit ends
    them. With `ends_with`, the cluster ends with that reason once
    it has a step, or, with `ends_after` too, once that stage's step has completed. A cluster that
    is STARTING (see `starting_clusters`) is WAITING `start_s` seconds after it is first seen (never
    with None), or ends then as a failed bootstrap does with `bootstrap_error` as EMR's reason."""

    def __init__(
        self,
        s3,
        failures: dict[str, int] | None = None,
        bad_input: bool = False,
        hanging=(),
        slow_train=False,
        ends_with: str | None = None,
        ends_after: str | None = None,
        timed_out=(),
        start_s: float | None = 0,
        bootstrap_error: str | None = None,
    ):
        super().__init__(daemon=True)
        self.start_s, self.bootstrap_error, self.first_seen = start_s, bootstrap_error, {}
        self.s3, self.failures, self.bad_input, self.hanging = s3, dict(failures or {}), bad_input, hanging
        self.timed_out = timed_out
        self.slow_train, self.train_started, self.ends_with, self.ends_after = slow_train, None, ends_with, ends_after
        self.finished: list[str] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        """Plays the cluster. Should that fail, it ends every cluster from then on, so that the DAG's
        sensors fail at their next poke instead of waiting on steps no one finishes, and `__exit__`
        raises the error once the run is over."""
        try:
            self.play()
        except BaseException as error:
            self.error = error
            while not self.stop.is_set():
                for cluster in list(emr_backend().clusters.values()):
                    if cluster.state not in ("TERMINATED", "TERMINATED_WITH_ERRORS"):
                        self.end(cluster, f"the test's cluster thread failed: {error!r}")
                time.sleep(0.05)

    def play(self) -> None:
        backend = emr_backend()
        while not self.stop.is_set():
            for cluster in list(backend.clusters.values()):
                self.start_up(cluster)
                if self.ends_with and cluster.steps and cluster.state not in ("TERMINATED", "TERMINATED_WITH_ERRORS"):
                    if self.ends_after is None:
                        self.end(cluster, self.ends_with)
                    elif self.ends_after in self.finished:
                        cluster.state, cluster.last_state_change_reason = "TERMINATED", self.ends_with
                for step in cluster.steps:
                    if step.state in ("PENDING", "RUNNING"):
                        self.finish(step)
            time.sleep(0.05)

    def start_up(self, cluster) -> None:
        if cluster.state != "STARTING":
            return
        seen = self.first_seen.setdefault(cluster.id, time.monotonic())
        if self.start_s is None or time.monotonic() - seen < self.start_s:
            return
        if self.bootstrap_error:
            self.end(cluster, self.bootstrap_error)
        else:
            cluster.state, cluster.ready_datetime = "WAITING", datetime.now(timezone.utc)

    def end(self, cluster, reason: str) -> None:
        """What EMR does to a cluster whose bootstrap fails: it ends, and its steps are cancelled."""
        cluster.state, cluster.last_state_change_reason = "TERMINATED_WITH_ERRORS", reason
        for step in cluster.steps:
            step.state = "CANCELLED"

    def finish(self, step) -> None:
        if step.start_date_time is None:
            step.start()  # as EMR starts it
        stage_name = step.name.split(" (try ")[0]
        if stage_name in self.hanging:
            step.state = "RUNNING"
            return
        if stage_name in self.timed_out:  # `timeout` ended spark-submit: no error left in the run folder
            step.start_date_time = datetime.now(timezone.utc) - timedelta(seconds=int(step.args[2]))
            step.state, step.end_date_time = "FAILED", datetime.now(timezone.utc)
            self.finished.append(step.name)
            return
        run_dir = step.args[step.args.index("--run-dir") + 1]
        if stage_name == "train" and self.slow_train and self.still_training(run_dir):
            step.state = "RUNNING"
            return
        if self.failures.get(stage_name, 0) > 0:
            self.failures[stage_name] -= 1
            message = "the corpus is not UTF-8" if self.bad_input else "RuntimeError: the executor was lost"
            stage_app.record_error(run_dir, stage_name, message, bad_input=self.bad_input)
            step.state = "FAILED"
        else:
            outputs = {run_folder.stats_uri(run_dir, stage_name): b"{}"}
            if stage_name == CLUSTER_CHECK.name:
                outputs[run_folder.stats_uri(run_dir, stage_name)] = json.dumps(SMOKE_STATS).encode()
            if stage_name == "train":
                outputs[run_folder.stats_uri(run_dir, "train")] = json.dumps(TRAIN_STATS).encode()
                outputs[lake.join(run_dir, run_folder.EPOCHS_CSV_PATH)] = b"epoch,step,val_loss\n1,3,2.5\n"
            if stage_name == "generate":
                outputs[lake.join(run_dir, run_folder.SAMPLES_PATH)] = b"The man starts with a song"
            for uri, body in outputs.items():
                bucket, key = emr_code.split_s3_uri(uri)
                self.s3.put_object(Bucket=bucket, Key=key, Body=body)
            step.state = "COMPLETED"
        step.end_date_time = datetime.now(timezone.utc)
        self.finished.append(step.name)

    def still_training(self, run_dir: str) -> bool:
        """A train step that runs for a few pokes, its progress in the run folder as the stage keeps it."""
        if self.train_started is None:
            self.train_started = time.monotonic()
            bucket, key = emr_code.split_s3_uri(lake.join(run_dir, run_folder.progress_path("train")))
            self.s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(TRAIN_PROGRESS).encode())
        return time.monotonic() - self.train_started < 10 * POKE_S  # a few pokes, with room for a busy machine

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.join()
        if self.error is not None:
            raise self.error


def run_dag(
    aws,
    failures: dict[str, int] | None = None,
    bad_input: bool = False,
    hanging=(),
    time_limit_s=None,
    slow_train=False,
    ends_with=None,
    ends_after=None,
    form: dict | None = None,
    timed_out=(),
    start_s: float | None = 0,
    bootstrap_error: str | None = None,
    startup_timeout_s=None,
):
    dag = runpy.run_path(str(DAG_FILE))["dag"]
    if startup_timeout_s:
        dag.get_task("wait_for_cluster").timeout = startup_timeout_s
    for task_id in (*EMR_STEP_NAMES, "terminate_cluster"):
        dag.get_task(task_id).retry_delay = timedelta(0)  # the test need not wait a minute for a retry
    for stage_name in hanging if time_limit_s else ():  # only theirs: the others finish at any machine load
        dag.get_task(stage_name).timeout = time_limit_s
    for sensor in dag.tasks:
        if isinstance(sensor, BaseSensorOperator):
            sensor.poke_interval = POKE_S
    played = Cluster(
        aws["s3"], failures, bad_input, hanging, slow_train, ends_with, ends_after, timed_out, start_s, bootstrap_error
    )
    with played as cluster, pytest.MonkeyPatch.context() as patch:
        # Every AWS hook makes its own boto3 session, which would read botocore's service models from
        # JSON again, and names its caller in the User-Agent header by reading the source of each
        # frame on the stack: seconds of each run, testing nothing here.
        patch.setattr(botocore.session, "create_loader", functools.cache(botocore.loaders.create_loader))
        patch.setattr(AwsBaseHook, "_get_caller", lambda self, target_function_name="execute": "Unknown")
        patch.setattr(time, "sleep", functools.partial(shorter_sleep, time.sleep))
        dag_run = dag.test(run_conf=form)
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    return dag_run, states, cluster.finished


def shorter_sleep(sleep, seconds: float) -> None:
    sleep(min(seconds, POKE_S))


def asset_events(dag_run) -> list[tuple[str, dict]]:
    """(asset URI, extra) of each asset event the run sent."""
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        events = session.scalars(select(AssetEvent).where(AssetEvent.source_run_id == dag_run.run_id)).all()
        return [(event.asset.uri, event.extra) for event in events]


def only_cluster(aws) -> dict:
    (summary,) = aws["emr"].list_clusters()["Clusters"]
    return aws["emr"].describe_cluster(ClusterId=summary["Id"])["Cluster"]


def s3_bytes(aws, uri: str) -> bytes:
    bucket, key = emr_code.split_s3_uri(uri)
    return aws["s3"].get_object(Bucket=bucket, Key=key)["Body"].read()


def zip_members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def test_run_creates_the_templated_cluster_runs_every_step_in_order_and_terminates(
    airflow_db, aws, run_job_flow_requests, starting_clusters, capfd, tmp_path, monkeypatch
):
    """The cluster starts as EMR's do (STARTING for a few seconds) and train runs for a few pokes;
    collect logs the run to MLflow (a SQLite store), and promote registers its model."""
    mlflow_store = f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"
    monkeypatch.setenv("AIRFLOW_VAR_MLFLOW_TRACKING_URI", mlflow_store)
    dag_run, states, finished = run_dag(aws, start_s=3, slow_train=True)
    config = load_config(overrides=OVERRIDES)
    run_id = run_folder.safe_run_id(f"{config.run_name}-{dag_run.run_id}")

    assert dag_run.state == "success", states
    assert states.pop("end_orphaned_clusters") == "skipped"  # create_cluster succeeded
    assert set(states.values()) == {"success"}
    logged = "".join(capfd.readouterr())

    # The cluster: exactly the template filled from the config, and terminated at the end.
    (request,) = run_job_flow_requests
    assert request == emr_cluster.job_flow_overrides(config, run_id)
    assert request["AutoTerminationPolicy"] == {"IdleTimeout": config.emr.idle_timeout_minutes * 60}
    cluster = only_cluster(aws)
    assert cluster["ReleaseLabel"] == config.emr.release_label
    assert cluster["Status"]["State"] == "TERMINATED"
    groups = aws["emr"].list_instance_groups(ClusterId=cluster["Id"])["InstanceGroups"]
    assert sorted(
        (g["InstanceGroupType"], g["InstanceType"], g["RequestedInstanceCount"], g["Market"]) for g in groups
    ) == [
        ("CORE", config.emr.core_instance_type, config.emr.core_instance_count, "ON_DEMAND"),
        ("MASTER", config.emr.master_instance_type, 1, "ON_DEMAND"),
    ]
    (action,) = aws["emr"].list_bootstrap_actions(ClusterId=cluster["Id"])["BootstrapActions"]
    assert s3_bytes(aws, action["ScriptPath"]) == emr_code.RUN_FILES["bootstrap.sh"].read_bytes()

    # The steps: the cluster check, then one per stage, in order, each the shared spark-submit command.
    assert finished == list(EMR_STEP_NAMES) == [CLUSTER_CHECK.name, *STAGE_NAMES]
    steps = aws["emr"].list_steps(ClusterId=cluster["Id"])["Steps"]
    assert sorted(step["Name"] for step in steps) == sorted(EMR_STEP_NAMES)
    for step in steps:
        expected = emr_steps.stage_step(step["Name"], config, run_id)
        assert step["Config"]["Args"] == expected["HadoopJarStep"]["Args"]
        assert step["Config"]["Jar"] == "command-runner.jar" and step["ActionOnFailure"] == "CONTINUE"
        assert step["Status"]["State"] == "COMPLETED"
    # The first step was added once the cluster had started and bootstrapped: wait_for_cluster waited.
    assert f"cluster {cluster['Id']} is STARTING" in logged
    assert starting_clusters[0] == "WAITING" and set(starting_clusters) <= set(emr_tasks.READY_STATES)
    assert len(starting_clusters) == len(EMR_STEP_NAMES)
    first = steps[-1]
    assert first["Name"] == CLUSTER_CHECK.name
    assert first["Status"]["Timeline"]["CreationDateTime"] >= cluster["Status"]["Timeline"]["ReadyDateTime"]
    # The train task logged the progress its running step reported.
    assert (
        "train: step 1,200 of 3,000 (40%), loss 3.2100, 25,000 tokens/s, about 12 min left (at 2026-11-22T10:00:00Z)"
        in logged
    )

    # The code, the bootstrap's requirements and the resolved config are in S3.
    code = emr_code.code_uri(config, run_id)
    package_code(tmp_path)
    for file in tmp_path.rglob("*.py"):
        assert s3_bytes(aws, lake.join(code, file.relative_to(tmp_path).as_posix())) == file.read_bytes()
    local_zip = zip_members((tmp_path / "spark_jobs.zip").read_bytes())
    assert zip_members(s3_bytes(aws, lake.join(code, "spark_jobs.zip"))) == local_zip
    for name, path in emr_code.RUN_FILES.items():
        assert s3_bytes(aws, lake.join(code, name)) == path.read_bytes()
    run_dir = run_folder.run_dir(config, run_id)
    assert json.loads(s3_bytes(aws, lake.join(run_dir, run_folder.CONFIG_FILE))) == json.loads(config.to_json())
    # collect copied the record and wrote the report.
    report = json.loads(s3_bytes(aws, f"s3://{BUCKET}/{config.s3.prefix}/{run_id}/report.json"))
    assert report["val_nats_per_char"] == TRAIN_STATS["final_val_nats_per_char"]
    assert report["sample"] == "The man starts with a song"
    # with the cluster's steps, as EMR reported them just before the cluster was terminated
    assert report["emr"]["cluster_id"] == cluster["Id"] and report["emr"]["release"] == config.emr.release_label
    assert [(step["name"], step["state"]) for step in report["emr"]["steps"]] == [
        (stage, "COMPLETED") for stage in EMR_STEP_NAMES
    ]
    assert report["emr"]["cost_usd_so_far"] >= 0 and all(step["seconds"] is not None for step in report["emr"]["steps"])
    report_md = s3_bytes(aws, f"s3://{BUCKET}/{config.s3.prefix}/{run_id}/report.md").decode()
    assert (
        f"## EMR\n\nCluster {cluster['Id']} ({config.emr.release_label})" in report_md
        and "| train | COMPLETED |" in report_md
    )
    # and what the cluster check found on the nodes
    assert report["cluster_check"]["nodes"] == SMOKE_STATS["nodes"]
    assert "## Cluster check\n" in report_md and "| 1 | 10.0.1.18 | 3.11.14 | 2.21.0 |" in report_md
    # promote pointed the run name's latest pointer at the collected model.
    pointer = json.loads(s3_bytes(aws, f"s3://{BUCKET}/{config.s3.prefix}/latest/{config.run_name}.json"))
    assert pointer["model"] == report["s3_uri"] + f"{run_folder.MODEL_FOLDER}/" and pointer["run"] == run_id
    ((asset_uri, extra),) = asset_events(dag_run)
    assert asset_uri == f"s3://{BUCKET}/{config.s3.prefix}/latest" and extra["pointer"] == pointer
    # The run in MLflow, logged on Airflow's side, and its model the run name's champion.
    from mlflow import MlflowClient

    mlflow = MlflowClient(mlflow_store)
    (tracked,) = mlflow.search_runs([mlflow.get_experiment_by_name("gpt-pipeline").experiment_id])
    assert tracked.data.tags["gpt_pipeline.target"] == "emr" and tracked.data.tags["airflow.run_id"] == dag_run.run_id
    assert tracked.data.tags["gpt_pipeline.record"] == report["s3_uri"]
    assert tracked.data.metrics["final_val_nats_per_char"] == TRAIN_STATS["final_val_nats_per_char"]
    assert "emr.core_instance_count" not in tracked.data.params and tracked.data.params["train.max_steps"] == str(
        config.train.max_steps
    )
    assert mlflow.get_model_version_by_alias(config.run_name, "champion").run_id == tracked.info.run_id


def test_an_error_in_the_thread_playing_the_cluster_ends_the_run_and_fails_the_test(airflow_db, aws, monkeypatch):
    """The test's own helper: the thread's error is raised as soon as the run is over, and the run
    is over at once, rather than the DAG waiting on steps no one finishes until the test times out."""

    def broken(self, step):
        raise RuntimeError("the played cluster broke")

    monkeypatch.setattr(Cluster, "finish", broken)
    with pytest.raises(RuntimeError, match="the played cluster broke"):
        run_dag(aws)
    assert only_cluster(aws)["Status"]["State"] in ("TERMINATED", "TERMINATED_WITH_ERRORS")


def test_promote_if_better_is_skipped_when_latest_points_at_a_better_model(airflow_db, aws, emr_defaults):
    amend_deployment(emr_defaults, {"s3": {"promote": "if_better"}})
    config = load_config(emr_defaults)
    key = f"{config.s3.prefix}/latest/{config.run_name}.json"
    better = {"run": "an-earlier-run", "model": f"s3://{BUCKET}/runs/an-earlier-run/model/", "val_nats_per_char": 1.0}
    aws["s3"].put_object(Bucket=BUCKET, Key=key, Body=json.dumps(better).encode())

    dag_run, states, finished = run_dag(aws)

    assert dag_run.state == "success" and finished == list(EMR_STEP_NAMES)
    assert states["collect"] == "success" and states["promote"] == "skipped"
    assert json.loads(s3_bytes(aws, f"s3://{BUCKET}/{key}")) == better
    assert asset_events(dag_run) == []


def step_states(aws) -> list[tuple[str, str]]:
    """(name, state) of the only cluster's steps, oldest first."""
    steps = aws["emr"].list_steps(ClusterId=only_cluster(aws)["Id"])["Steps"]
    return [(step["Name"], step["Status"]["State"]) for step in reversed(steps)]


def test_a_step_that_fails_once_is_added_again_and_the_run_succeeds(airflow_db, aws, capfd):
    dag_run, states, finished = run_dag(aws, failures={"window": 1})

    assert states.pop("end_orphaned_clusters") == "skipped"
    assert dag_run.state == "success" and set(states.values()) == {"success"}, states
    assert finished == [CLUSTER_CHECK.name, "tokenize", "window", "window (try 2)", *STAGE_NAMES[2:]]
    assert step_states(aws)[1:4] == [("tokenize", "COMPLETED"), ("window", "FAILED"), ("window (try 2)", "COMPLETED")]
    assert "window stopped: RuntimeError: the executor was lost" in "".join(capfd.readouterr())
    # the retried step is the same command
    steps = {
        step["Name"]: step["Config"]["Args"]
        for step in aws["emr"].list_steps(ClusterId=only_cluster(aws)["Id"])["Steps"]
    }
    assert steps["window (try 2)"] == steps["window"]
    # the retried step does not report the previous try's error as its own
    config = load_config(overrides=OVERRIDES)
    run = run_folder.safe_run_id(f"{config.run_name}-{dag_run.run_id}")
    with pytest.raises(aws["s3"].exceptions.NoSuchKey):
        s3_bytes(aws, lake.join(run_folder.run_dir(config, run), run_folder.error_path("window")))
    # the report's timeline: the cluster's start-up, then every step EMR ran, the failed try included
    pages = [  # the record's and the run folder's (on S3 too)
        aws["s3"].get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read().decode()
        for item in aws["s3"].list_objects_v2(Bucket=BUCKET)["Contents"]
        if item["Key"].endswith(f"{run}/{run_folder.REPORT_HTML}")
    ]
    assert len(pages) == 2
    for page in pages:
        bars = re.findall(r'<rect class="bar (\w+)"', page)
        assert bars == ["startup", "completed", "completed", "failed", *["completed"] * (len(STAGE_NAMES) - 1)]


def test_a_step_that_fails_in_every_try_fails_the_run_and_the_cluster_is_still_terminated(airflow_db, aws):
    dag_run, states, finished = run_dag(aws, failures={"window": 2})

    assert dag_run.state == "failed"
    assert states["tokenize"] == "success" and states["window"] == "failed"
    assert states["positional_embed"] == states["collect"] == states["promote"] == "upstream_failed"
    assert states["terminate_cluster"] == "success"
    assert finished == [CLUSTER_CHECK.name, "tokenize", "window", "window (try 2)"]
    assert only_cluster(aws)["Status"]["State"] == "TERMINATED"
    assert step_states(aws)[1:] == [("tokenize", "COMPLETED"), ("window", "FAILED"), ("window (try 2)", "FAILED")]


def test_a_stage_stopped_by_bad_input_fails_at_once_with_its_error(airflow_db, aws, capfd):
    dag_run, states, finished = run_dag(aws, failures={"tokenize": 2}, bad_input=True)

    assert dag_run.state == "failed" and states["tokenize"] == "failed"
    assert "AirflowFailException: tokenize: the corpus is not UTF-8" in "".join(capfd.readouterr())
    assert step_states(aws) == [(CLUSTER_CHECK.name, "COMPLETED"), ("tokenize", "FAILED")]
    assert only_cluster(aws)["Status"]["State"] == "TERMINATED"


def test_a_cluster_check_that_fails_stops_the_run_before_tokenize_and_the_cluster_is_terminated(airflow_db, aws, capfd):
    """The smoke step's failures are its findings (two workers on one node, a package that does not
    import): recorded as bad input, which a retry would find again."""
    dag_run, states, finished = run_dag(aws, failures={CLUSTER_CHECK.name: 2}, bad_input=True)

    assert dag_run.state == "failed" and states[CLUSTER_CHECK.name] == "failed", states
    assert dag_run.get_task_instance(CLUSTER_CHECK.name).try_number == 1
    assert f"AirflowFailException: {CLUSTER_CHECK.name}: the corpus is not UTF-8" in "".join(capfd.readouterr())
    assert states["tokenize"] == states["collect"] == "upstream_failed"
    assert step_states(aws) == [(CLUSTER_CHECK.name, "FAILED")] and finished == [CLUSTER_CHECK.name]
    assert states["terminate_cluster"] == "success" and only_cluster(aws)["Status"]["State"] == "TERMINATED"


def test_a_cluster_that_ended_fails_the_stage_at_once_with_the_clusters_reason(airflow_db, aws, capfd):
    reason = "On the master instance (i-0abc), bootstrap action 1 returned a non-zero return code"
    dag_run, states, finished = run_dag(aws, ends_with=reason)
    first = EMR_STEP_NAMES[0]

    assert dag_run.state == "failed" and states[first] == "failed", states
    assert dag_run.get_task_instance(first).try_number == 1  # no retry: there is no cluster to run it on
    logged = "".join(capfd.readouterr())
    cluster_id = only_cluster(aws)["Id"]
    assert f"AirflowFailException: {first}: cluster {cluster_id} ended (TERMINATED_WITH_ERRORS): {reason}" in logged
    assert f"bootstrap logs: s3://{BUCKET}/emr-logs/{cluster_id}/node/" in logged
    assert step_states(aws) == [(first, "CANCELLED")]
    assert states["terminate_cluster"] == "success"


def test_a_cluster_that_ended_between_steps_fails_the_next_stage_at_once_before_adding_its_step(airflow_db, aws, capfd):
    reason = "Cluster was terminated after being idle for 1 minute"
    dag_run, states, finished = run_dag(aws, ends_with=reason, ends_after="tokenize")

    assert states["tokenize"] == "success" and states["window"] == "failed" and dag_run.state == "failed", states
    assert dag_run.get_task_instance("window").try_number == 1
    assert f"AirflowFailException: window: cluster {only_cluster(aws)['Id']} ended (TERMINATED): {reason}" in "".join(
        capfd.readouterr()
    )
    # EMR would refuse the step; none was sent
    assert step_states(aws) == [(CLUSTER_CHECK.name, "COMPLETED"), ("tokenize", "COMPLETED")]


def test_a_cluster_that_could_not_be_terminated_fails_the_run_and_alerts_with_the_cluster_and_its_cost(
    airflow_db, aws, emr_defaults, moto_endpoint, monkeypatch
):
    def refused(self):
        raise ValidationException("User is not authorized to perform elasticmapreduce:TerminateJobFlows")

    topic = AlertTopic(moto_endpoint)
    amend_deployment(emr_defaults, {"alerts": {"sns_topic_arn": topic.arn}})
    monkeypatch.setattr(ElasticMapReduceResponse, "terminate_job_flows", refused)
    dag_run, states, finished = run_dag(aws)

    assert finished == list(EMR_STEP_NAMES) and states["promote"] == "success"
    assert states["terminate_cluster"] == "failed" and dag_run.state == "failed"  # someone must see the cluster is up
    cluster_id = only_cluster(aws)["Id"]
    assert only_cluster(aws)["Status"]["State"] != "TERMINATED"
    # and is told: the teardown's alert, with the report collect wrote and the cluster's cost so far
    (alert,) = topic.received()
    assert alert["Subject"] == "gpt_pipeline: teardown terminate_cluster failed"
    message = alert["Message"]
    assert f"\nrun:    {dag_run.run_id}\n" in message and "\ntask:   terminate_cluster\n" in message
    assert re.search(
        r"\nerror:  ClientError: .*User is not authorized to perform elasticmapreduce:TerminateJobFlows\n", message
    )
    config = load_config(emr_defaults)
    record = f"s3://{BUCKET}/{config.s3.prefix}/{run_folder.safe_run_id(f'{config.run_name}-{dag_run.run_id}')}/"
    assert f"\nreport: {record}{run_folder.REPORT_HTML}\n" in message
    basis = re.escape(emr_cost.price_basis(config))
    assert re.search(
        rf"\nEMR cluster: {cluster_id}, about \$\d+\.\d\d so far \(\d+\.\d\d hours at {basis}\)\n", message
    )
    assert f"aws emr terminate-clusters --cluster-ids {cluster_id}`" in message


def test_a_step_out_of_time_fails_its_task_without_a_retry(airflow_db, aws, capfd):
    dag_run, states, finished = run_dag(aws, hanging={"window"}, time_limit_s=3)
    assert "AirflowSensorTimeout" in "".join(capfd.readouterr())

    assert dag_run.state == "failed" and states["window"] == "failed"
    assert (dag_run.get_task_instance("window").try_number, states["terminate_cluster"]) == (1, "success")
    # moto leaves the running step so on terminate
    assert step_states(aws) == [(CLUSTER_CHECK.name, "COMPLETED"), ("tokenize", "COMPLETED"), ("window", "RUNNING")]


def test_a_step_its_own_time_limit_ended_fails_its_task_without_a_retry(airflow_db, aws, capfd):
    """Each step runs under `timeout`, so the cluster's cost stays bounded without Airflow."""
    dag_run, states, finished = run_dag(aws, timed_out={"window"})
    limit = emr_steps.step_limit_seconds("window", load_config(overrides=OVERRIDES))
    assert "window: step s-" in (logged := "".join(capfd.readouterr()))
    assert f"ran out of its time limit ({limit:,} s)" in logged

    assert dag_run.state == "failed" and states["window"] == "failed"
    assert (dag_run.get_task_instance("window").try_number, states["terminate_cluster"]) == (1, "success")
    assert finished == [CLUSTER_CHECK.name, "tokenize", "window"]


def test_a_cluster_not_started_within_its_allowance_fails_naming_the_setting_and_is_terminated(
    airflow_db, aws, starting_clusters, capfd
):
    dag_run, states, finished = run_dag(aws, start_s=None, startup_timeout_s=3)

    (cluster_id,) = emr_backend().clusters
    logged = "".join(capfd.readouterr())
    assert (
        f"AirflowSensorTimeout: cluster {cluster_id} did not start and bootstrap (WAITING) within "
        "emr.startup_timeout_minutes (0.05 min); terminate_cluster ends it" in logged
    )
    assert dag_run.state == "failed" and states["wait_for_cluster"] == "failed", states
    assert dag_run.get_task_instance("wait_for_cluster").try_number == 1
    assert states[EMR_STEP_NAMES[0]] == "upstream_failed" and starting_clusters == [] and finished == []
    assert states["terminate_cluster"] == "success"
    assert emr_backend().clusters[cluster_id].state == "TERMINATED"


def test_a_failed_bootstrap_fails_the_wait_at_once_with_emrs_reason_and_the_cluster_is_terminated(
    airflow_db, aws, starting_clusters, capfd
):
    reason = "On the master instance (i-0abc), bootstrap action 1 returned a non-zero return code"
    dag_run, states, finished = run_dag(aws, start_s=1, bootstrap_error=reason)

    cluster_id = only_cluster(aws)["Id"]
    logged = "".join(capfd.readouterr())
    assert f"AirflowFailException: cluster {cluster_id} ended (TERMINATED_WITH_ERRORS): {reason}" in logged
    assert f"(bootstrap logs: s3://{BUCKET}/emr-logs/{cluster_id}/node/*/bootstrap-actions/)" in logged
    assert dag_run.state == "failed" and states["wait_for_cluster"] == "failed", states
    assert dag_run.get_task_instance("wait_for_cluster").try_number == 1  # no retry: the cluster is gone
    assert starting_clusters == [] and states["terminate_cluster"] == "success"


def test_a_create_that_fails_after_emr_made_the_cluster_terminates_it(airflow_db, aws, monkeypatch, capfd):
    """The provider's create operator describes the new cluster for its console links: a refused
    DescribeCluster fails the task with the cluster up, and a failed setup gets no teardown."""

    def refused(self):
        raise JsonRESTError(
            "AccessDeniedException", "User is not authorized to perform: elasticmapreduce:DescribeCluster"
        )

    monkeypatch.setattr(ElasticMapReduceResponse, "describe_cluster", refused)
    dag_run, states, finished = run_dag(aws)

    ((cluster_id, cluster),) = emr_backend().clusters.items()
    assert cluster.state == "TERMINATED"
    logged = "".join(capfd.readouterr())
    assert f"AirflowFailException: cluster {cluster_id} was created, then ClientError: " in logged
    assert "elasticmapreduce:DescribeCluster; it was terminated" in logged
    assert dag_run.state == "failed" and states["create_cluster"] == "failed", states
    assert states["wait_for_cluster"] == "upstream_failed" and finished == []


def test_a_create_killed_after_run_job_flow_leaves_no_cluster_running(airflow_db, aws, monkeypatch):
    """A worker killed outright between RunJobFlow and the XCom runs none of create_cluster's own
    clean-up, and Airflow runs no teardown of a failed setup: end_orphaned_clusters ends the
    cluster by the run's tag."""

    def killed_after_run_job_flow(self, context):
        self.hook.create_job_flow(self.job_flow_overrides)
        raise RuntimeError("the worker died")  # no on_kill, no XCom: as after SIGKILL

    monkeypatch.setattr(emr_tasks.EmrCreateClusterOperator, "execute", killed_after_run_job_flow)
    dag_run, states, finished = run_dag(aws)

    ((cluster_id, cluster),) = emr_backend().clusters.items()
    assert cluster.state == "TERMINATED", cluster_id
    assert dag_run.state == "failed" and states["create_cluster"] == "failed", states
    assert states["end_orphaned_clusters"] == "success" and states["terminate_cluster"] != "success", states
    assert finished == []


def create_operator(aws, **kwargs) -> emr_tasks.EmrCreateClusterOperator:
    request = emr_cluster.job_flow_overrides(load_config(overrides=OVERRIDES), "run-1")
    return emr_tasks.EmrCreateClusterOperator(
        task_id="create_cluster", job_flow_overrides=request, emr_conn_id=None, region_name=REGION, **kwargs
    )


def test_a_create_whose_waiter_fails_terminates_its_cluster(aws, starting_clusters):
    operator = create_operator(aws, wait_for_completion=True, waiter_delay=1, waiter_max_attempts=2)
    with pytest.raises(AirflowFailException, match=r"cluster j-\w+ was created, then WaiterError: .*it was terminated"):
        operator.execute({"ti": MagicMock()})  # only the console links use the task instance

    ((cluster_id, cluster),) = emr_backend().clusters.items()
    assert cluster_id == operator._job_flow_id and cluster.state == "TERMINATED"


def test_a_killed_create_terminates_its_cluster(aws):
    operator = create_operator(aws)
    cluster_id = operator.execute({"ti": MagicMock()})
    assert emr_backend().clusters[cluster_id].state == "WAITING"
    operator.on_kill()
    assert emr_backend().clusters[cluster_id].state == "TERMINATED"
    create_operator(aws).on_kill()  # killed before RunJobFlow returned: nothing to terminate


def test_a_create_finding_the_runs_cluster_active_uses_it_instead_of_starting_a_second(aws):
    """An earlier try's cluster (the task cleared, or failed after RunJobFlow succeeded) is the
    run's; a cluster of another run, or one that ended, is not."""
    request = create_operator(aws).job_flow_overrides
    other_run = aws["emr"].run_job_flow(**request | {"Tags": [{"Key": "run_id", "Value": "run-2"}]})["JobFlowId"]
    ended = aws["emr"].run_job_flow(**request)["JobFlowId"]
    aws["emr"].terminate_job_flows(JobFlowIds=[ended])
    earlier = aws["emr"].run_job_flow(**request)["JobFlowId"]

    assert create_operator(aws).execute({"ti": MagicMock()}) == earlier
    active = aws["emr"].list_clusters(ClusterStates=list(emr_cluster.ACTIVE_STATES))["Clusters"]
    assert sorted(cluster["Id"] for cluster in active) == sorted([earlier, other_run])


def test_a_corpus_too_small_for_a_window_fails_before_any_cluster_exists(airflow_db, aws, capfd):
    aws["s3"].put_object(Bucket=BUCKET, Key="corpus/sonnets.txt", Body=SONNET_LINE)
    dag_run, states, finished = run_dag(aws)

    logged = "".join(capfd.readouterr())
    assert (
        "PipelineError: the corpus holds 40 bytes, so at most 40 tokens, and a window needs data.block_size + 1 = 65"
        in logged
    )
    assert dag_run.state == "failed" and states["validate_config"] == "failed"
    assert states["create_cluster"] == "upstream_failed" and finished == []
    assert aws["emr"].list_clusters()["Clusters"] == []
    # validate_config stopped before uploading anything of the run (the wheelhouse is the fixture's).
    keys = [item["Key"] for item in aws["s3"].list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert [key for key in keys if not key.startswith("code/wheelhouse/")] == ["corpus/sonnets.txt"]


def refusal(aws, form: dict | None = None) -> str:
    """What the DAG's validate_config raises, as its task's log shows it ("ConfigError: …"), run as
    the task would run it in a DAG run (with target emr, the DAG file parsed now, the trigger form
    `form`): its function called with Airflow's context stood in for. No cluster exists after it."""
    dag_globals = runpy.run_path(str(DAG_FILE))
    function = dag_globals["validate_config_for_emr"].function
    context = {"params": dag_globals["dag"].params.dump() | (form or {}), "run_id": "manual__test"}
    with pytest.raises(PipelineError) as raised, pytest.MonkeyPatch.context() as patch:
        patch.setitem(function.__globals__, "get_current_context", lambda: context)
        function()
    assert aws["emr"].list_clusters()["Clusters"] == []
    return f"{type(raised.value).__name__}: {raised.value}"


def test_training_shards_too_big_for_the_core_node_volume_fail_before_any_cluster_exists(aws, emr_defaults):
    amend_deployment(emr_defaults, {"data": {"block_size": 128, "stride": 1}, "emr": {"core_ebs_gb": 1}})
    aws["s3"].put_object(Bucket=BUCKET, Key="corpus/sonnets.txt", Body=SONNET_LINE * 1_000_000)  # 40 MB

    assert (
        "PipelineError: each of the 2 training workers copies at least 1.3 GB of TFRecord shards to its core "
        "node, more than its emr.core_ebs_gb = 1 GB volume" in refusal(aws)
    )


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"s3": {"bucket": "no-such-bucket"}}, "s3.bucket: bucket 'no-such-bucket' does not exist"),
        ({"emr": {"log_uri": "s3://no-such-logs/emr/"}}, "emr.log_uri: bucket 'no-such-logs' does not exist"),
        ({"lake": "s3://no-such-lake/lake"}, "lake: bucket 'no-such-lake' does not exist"),
        ({"corpus": "s3://no-such-corpus/a.txt"}, "corpus: bucket 'no-such-corpus' does not exist"),
        (
            {"s3": {"bucket": "gpt-pipeline"}},
            "s3.bucket: 'gpt-pipeline' is the example bucket pipeline.yaml ships with",
        ),
        (
            {"lake": "s3://gpt-pipeline/lake", "emr": {"code_prefix": "s3://gpt-pipeline/code/"}},
            "lake and emr.code_prefix: 'gpt-pipeline' is the example bucket pipeline.yaml ships with",
        ),
        (
            {"emr": {"service_role": "EMR_DefaultRole_V2"}},
            "emr.subnet_id: needed with emr.service_role 'EMR_DefaultRole_V2'",
        ),
    ],
    ids=["record", "logs", "lake", "corpus", "shipped-record", "shipped-lake-and-code", "service-role-v2"],
)
def test_an_account_setting_that_cannot_work_fails_before_any_cluster_exists(aws, emr_defaults, setting, message):
    amend_deployment(emr_defaults, setting)
    assert f"Error: {message}" in refusal(aws)


@pytest.mark.parametrize(
    "deployment, form, message",
    [
        ({"emr": {"max_cost_usd": None}}, None, "ConfigError: emr.max_cost_usd: target emr needs a budget"),
        (
            {},
            {"overrides": ["emr.max_core_instances=200"]},
            "ConfigError: emr.max_core_instances: a deployment setting, which a run cannot change: this DAG's "
            "emr.max_core_instances is 10",
        ),
        (
            {},
            {"overrides": ["emr.idle_timeout_minutes=10080"]},
            "ConfigError: emr.idle_timeout_minutes: a deployment setting, which a run cannot change",
        ),
        (
            {},
            {"max_steps": 100_000},
            "ConfigError: stage train needs a step time limit of",
        ),
    ],
    ids=["no-budget", "raised-cap", "7-day-idle-timeout", "longer-training"],
)
def test_a_run_over_a_bound_of_its_bill_fails_before_any_cluster_exists(
    aws, emr_defaults, run_job_flow_requests, deployment, form, message
):
    amend_deployment(emr_defaults, deployment)
    assert message in refusal(aws, form)
    assert run_job_flow_requests == []


@pytest.mark.parametrize(
    "body, problem",
    [
        ("Café".encode("cp1252") * 10, "is not UTF-8 text (byte 0xe9 at offset 3)"),
        ("Café\n".encode("utf-16"), "is UTF-16 text, not UTF-8"),
        (b"\x00\x01binary" * 10, "looks binary (NUL byte at offset 0)"),
    ],
    ids=["cp1252", "utf-16", "binary"],
)
def test_a_corpus_object_that_is_not_text_fails_before_any_cluster_exists(aws, run_job_flow_requests, body, problem):
    aws["s3"].put_object(Bucket=BUCKET, Key="corpus/windows.txt", Body=body)
    refused = refusal(aws)

    assert f"PipelineError: corpus file s3://{BUCKET}/corpus/windows.txt {problem}" in refused
    assert "set data.bad_files=skip to leave such files out" in refused
    assert run_job_flow_requests == []


def test_a_run_cannot_move_the_cluster_to_another_region_or_connection(aws):
    """The cluster's tasks were built with the DAG's region and connection when Airflow parsed it."""
    assert (
        "ConfigError: emr.region: a deployment setting, which a run cannot change: this DAG's emr.region is None"
        in (refusal(aws, {"overrides": ["emr.region=us-west-2"]}))
    )


@pytest.mark.parametrize("name", deployment_settings())
def test_a_run_changing_any_deployment_setting_is_refused_before_any_cluster_exists(aws, run_job_flow_requests, name):
    refused = refusal(aws, {"overrides": [f"{name}=changed-by-a-run"]})
    assert refused.startswith(
        f"ConfigError: {name}: a deployment setting, which a run cannot change: this DAG's {name}"
    )
    assert run_job_flow_requests == []


@pytest.mark.parametrize(
    "corpus", ["~/.aws/credentials", f"s3://{BUCKET}/lake/*", f"s3://{BUCKET}/corpus-private/a.txt", "s3://other/a.txt"]
)
def test_a_run_reading_a_corpus_outside_the_deployments_roots_is_refused_before_any_cluster_exists(
    aws, run_job_flow_requests, corpus
):
    refused = refusal(aws, {"corpus": corpus})
    assert refused.startswith("ConfigError: corpus: ") and "is outside the folders and prefixes" in refused
    assert f"corpus_roots: s3://{BUCKET}/corpus/" in refused
    assert run_job_flow_requests == []


def test_stage_tasks_wait_as_long_as_their_stage_and_terminate_is_a_teardown(emr_defaults):
    dag = runpy.run_path(str(DAG_FILE))["dag"]
    config = load_config(overrides=OVERRIDES)
    for stage_name in EMR_STEP_NAMES:
        sensor, limits = dag.get_task(stage_name), emr_steps.sensor_limits(stage_name, config)
        assert (float(sensor.timeout), sensor.poke_interval) == (limits["timeout"], limits["poke_interval"])
        assert sensor.region_name == config.emr.region and sensor.aws_conn_id == config.emr.aws_conn_id
        assert sensor.deferrable is False  # its checks of a failed step run in poke
        assert sensor.retries == emr_steps.STEP_RETRIES == 1
    assert dag.get_task("train").timeout > dag.get_task("window").timeout > dag.get_task(CLUSTER_CHECK.name).timeout
    assert dag.get_task("create_cluster").retries == 0
    wait = dag.get_task("wait_for_cluster")
    startup = emr_cluster.startup_limits(config)
    assert (float(wait.timeout), wait.poke_interval, wait.mode) == (startup["timeout"], 1, "reschedule")
    # wait_for_cluster >> smoke >> tokenize: the cluster check runs first, on the cluster once it is ready
    assert "create_cluster" in wait.upstream_task_ids
    assert dag.get_task(CLUSTER_CHECK.name).upstream_task_ids == {
        "validate_config",
        "create_cluster",
        "wait_for_cluster",
    }
    assert dag.get_task("tokenize").upstream_task_ids == {"validate_config", "create_cluster", CLUSTER_CHECK.name}
    terminate = dag.get_task("terminate_cluster")
    assert terminate.is_teardown and terminate.upstream_task_ids == {"validate_config", "create_cluster", "collect"}


def test_with_an_alert_topic_every_task_alerts_on_failure_the_teardowns_too(emr_defaults):
    amend_deployment(emr_defaults, {"alerts": {"sns_topic_arn": "arn:aws:sns:us-east-1:123456789012:alerts"}})
    dag = runpy.run_path(str(DAG_FILE))["dag"]

    assert {"terminate_cluster", "end_orphaned_clusters"} <= set(dag.task_ids)
    for task in dag.tasks:
        (callback,) = task.on_failure_callback
        assert isinstance(callback, FailureAlert), task.task_id
