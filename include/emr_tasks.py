"""The EMR target's Airflow pieces, built from include/emr_cluster.py, emr_steps.py, emr_cost.py
and emr_code.py, which dags/gpt_pipeline.py composes:

    validate_config (prepare) -> create_cluster -> wait_for_cluster -> smoke -> tokenize -> ... -> generate
                                                                               -> collect -> terminate_cluster

`prepare` checks and uploads the run (building the nodes' wheelhouse first when it is missing) and
returns the cluster request and every stage's step. create_cluster (EmrCreateClusterOperator)
uses the run's cluster when one is already active (found by its run_id tag) instead of starting a
second, and terminates the cluster it made if it fails after EMR made it: a failed setup task's
teardown does not run. wait_for_cluster (EmrClusterReadySensor) waits for the cluster to start and bootstrap,
within its own allowance, so that no step's time limit counts it. Each stage, and the cluster check
(smoke) before them, is one EmrStageSensor task: it adds the stage's EMR step and waits for it, so
that a retry runs the stage again.
terminate_cluster (EmrTerminateRunClustersOperator) is a teardown task: it runs whatever happened
to the steps, and since Airflow leaves teardown tasks out of the run's state, a failed step still
fails the run. It terminates create_cluster's cluster and any other active one tagged with the run,
so also when create_cluster left no cluster id (marked success by hand after its worker was lost,
then terminate_cluster cleared).
"""

from __future__ import annotations

import logging

from airflow.providers.amazon.aws.hooks.emr import EmrHook
from airflow.providers.amazon.aws.hooks.s3 import S3Hook
from airflow.providers.amazon.aws.operators.emr import EmrCreateJobFlowOperator, EmrTerminateJobFlowOperator
from airflow.providers.amazon.aws.sensors.emr import EmrJobFlowSensor, EmrStepSensor
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSensorTimeout, TaskDeferred

from include import emr_cluster, emr_code, emr_cost, emr_steps, wheelhouse
from include.record import StoredRun, check_bucket
from pipeline import run_folder, stages
from pipeline.config import PipelineConfig
from pipeline.stages import EMR_STEP_NAMES
from spark_jobs.training import memory

log = logging.getLogger(__name__)
ENDED_STATES = ("TERMINATING", "TERMINATED", "TERMINATED_WITH_ERRORS")
READY_STATES = ("WAITING", "RUNNING")


def prepare(config: PipelineConfig, run_id: str, dag_config: PipelineConfig) -> dict:
    """Check the run fits the DAG's sensor limits, upload it, and return what the EMR tasks send:
    `run_dir`, `job_flow_overrides` and `{stage}_step`, the cluster check's too (run it as a task with
    multiple_outputs=True).
    `run_id` is the run folder's name, made safe once by the DAG (run_folder.safe_run_id); the code's
    folder and the cluster's name and tags take it as it is."""
    emr_steps.check_sensor_limits(config, dag_config)
    worker_mb = emr_steps.train_executor_memory_mb(config)[1]
    where = f"on an {config.emr.core_instance_type} core node (emr.core_instance_type: its train executor's overhead)"
    need = memory.check_training_fits(config, worker_mb, where)
    log.info("training: %s, of the %s MB a worker has", memory.describe(need), f"{worker_mb:,}")
    request = emr_cluster.job_flow_overrides(config, run_id)
    steps = {f"{stage}_step": emr_steps.stage_step(stage, config, run_id) for stage in EMR_STEP_NAMES}
    hourly, hours = emr_cost.check_budget(config, dag_config)
    log.info(
        "cluster: about $%.2f per hour at %s; at most %.1f hours (about $%.0f) with these limits",
        hourly,
        emr_cost.price_basis(config),
        hours,
        hourly * hours,
    )
    s3 = S3Hook(aws_conn_id=config.emr.aws_conn_id)
    # Without it EMR would start the cluster and lose its logs.
    check_bucket(s3, emr_code.split_s3_uri(config.emr.log_uri)[0], "emr.log_uri")
    # The nodes install from it without PyPI; pip on this worker builds it when it is missing.
    wheelhouse.ensure(config, s3.get_conn())
    emr_code.upload_run(config, run_id, s3.get_conn())
    return {"run_dir": run_folder.run_dir(config, run_id), "job_flow_overrides": request, **steps}


def emr_client(config: PipelineConfig):
    """boto3's EMR client through the deployment's connection and region (emr.aws_conn_id, emr.region)."""
    return EmrHook(aws_conn_id=config.emr.aws_conn_id, region_name=config.emr.region).conn


def ended_cluster(cluster: dict) -> str:
    """'cluster j-… ended (STATE): EMR's reason (bootstrap logs: …)' of a described cluster."""
    status = cluster["Status"]
    reason = status.get("StateChangeReason", {}).get("Message") or "no reason given"
    logs = f"{cluster.get('LogUri', '')}{cluster['Id']}/node/*/bootstrap-actions/"
    return f"cluster {cluster['Id']} ended ({status['State']}): {reason} (bootstrap logs: {logs})"


class EmrCreateClusterOperator(EmrCreateJobFlowOperator):
    """The provider's create operator, which terminates the cluster it made when anything fails
    after EMR made it (the console links' DescribeCluster refused, a waiter's error, the task out of
    time or killed), instead of only after a waiter's error: Airflow runs no teardown of a setup
    task that failed, so the cluster would run until its idle timeout, unseen."""

    def __init__(self, **kwargs):
        kwargs.setdefault("terminate_job_flow_on_failure", False)  # this class's, on any failure
        super().__init__(**kwargs)
        self._job_flow_id = None  # on_kill reads it, also before RunJobFlow has returned

    def execute(self, context) -> str:
        existing = self.run_cluster()
        if existing:
            return existing
        try:
            return super().execute(context)
        except TaskDeferred:  # waiting in a trigger: not a failure
            raise
        except BaseException as error:
            if not self._job_flow_id:
                raise
            outcome = self.terminate_created()
            if not isinstance(error, Exception):  # out of time, killed: fails as it would
                raise
            raise AirflowFailException(
                f"cluster {self._job_flow_id} was created, then {type(error).__name__}: {error}; {outcome}"
            ) from error

    def run_cluster(self) -> str | None:
        """The run's active cluster, if an earlier try made one (its task cleared, or failed after
        RunJobFlow succeeded without knowing it): used instead of starting a second one."""
        existing = emr_cluster.request_run_clusters(self.hook.conn, self.job_flow_overrides)
        if existing:
            self.log.warning(
                "cluster %s of this run (tag %s=%s) is active: using it instead of creating another",
                existing[0],
                emr_cluster.RUN_TAG,
                emr_cluster.run_tag(self.job_flow_overrides),
            )
        return existing[0] if existing else None

    def on_kill(self) -> None:
        if self._job_flow_id:
            self.terminate_created()

    def terminate_created(self) -> str:
        cluster_id = self._job_flow_id
        self.log.warning("create_cluster failed after EMR created cluster %s: terminating it", cluster_id)
        try:
            self.hook.conn.terminate_job_flows(JobFlowIds=[cluster_id])
        except Exception as error:
            outcome = (
                f"it could NOT be terminated ({error}): terminate it by hand "
                f"(aws emr terminate-clusters --cluster-ids {cluster_id})"
            )
            self.log.error("cluster %s: %s", cluster_id, outcome)
            return outcome
        return "it was terminated"


class EmrTerminateRunClustersOperator(EmrTerminateJobFlowOperator):
    """The provider's terminate operator, which also terminates every other active cluster tagged
    with the run (`job_flow_overrides`, the run's request, names its tag), and those alone when
    create_cluster's XCom holds no cluster id (job_flow_id None): create_cluster died between
    RunJobFlow and pushing it (and was then marked success so that this teardown runs), or its XCom
    was cleared. Whatever Airflow recorded, no cluster of the run is left running."""

    template_fields = (*EmrTerminateJobFlowOperator.template_fields, "job_flow_overrides")

    def __init__(self, *, job_flow_overrides: dict | str, job_flow_id: str | None = None, **kwargs):
        super().__init__(job_flow_id=job_flow_id, **kwargs)
        self.job_flow_overrides = job_flow_overrides

    def execute(self, context) -> None:
        if self.job_flow_id:
            super().execute(context)  # first: the cluster create_cluster made, even if listing is refused
        else:
            self.log.warning("create_cluster left no cluster id: looking for the run's clusters by their tag")
        others = [
            cluster
            for cluster in emr_cluster.request_run_clusters(self.hook.conn, self.job_flow_overrides)
            if cluster != self.job_flow_id
        ]
        if others:
            self.log.warning("terminating the run's other active cluster(s) (tag %s): %s", emr_cluster.RUN_TAG, others)
            self.hook.conn.terminate_job_flows(JobFlowIds=others)
        elif not self.job_flow_id:
            self.log.info("no active cluster is tagged with this run: nothing to terminate")


class EmrClusterReadySensor(EmrJobFlowSensor):
    """Waits for the cluster to start and bootstrap (WAITING) before the first step is added, so
    that the first step's time limit counts only its own work. It waits emr.startup_timeout_minutes
    at most, rescheduled between pokes: the provider's deferrable wait needs aiobotocore, which
    the pinned botocore excludes. A cluster that ends instead (a failed bootstrap) fails the task
    at once with EMR's reason; either way the terminate_cluster teardown runs, as create_cluster
    succeeded."""

    def __init__(self, **kwargs):
        kwargs.setdefault("mode", "reschedule")
        super().__init__(target_states=READY_STATES, failed_states=ENDED_STATES, deferrable=False, **kwargs)

    def execute(self, context) -> None:
        try:
            super().execute(context)
        except AirflowSensorTimeout as error:
            raise AirflowSensorTimeout(
                f"cluster {self.job_flow_id} did not start and bootstrap (WAITING) within emr.startup_timeout_minutes "
                f"({self.timeout / 60:g} min); terminate_cluster ends it"
            ) from error

    def poke(self, context) -> bool:
        response = self.get_emr_response(context)
        cluster = response["Cluster"]
        state = cluster["Status"]["State"]
        if state in self.failed_states:
            raise AirflowFailException(ended_cluster(cluster))
        self.log.info("cluster %s is %s", self.job_flow_id, state)
        return state in self.target_states


def step_name(stage: str, try_number: int) -> str:
    return stage if try_number == 1 else f"{stage} (try {try_number})"


class EmrStageSensor(EmrStepSensor):
    """One stage on the cluster: adds the stage's EMR step, then waits for it as EmrStepSensor does.

    Adding and waiting are one task so that a retry runs the stage again: a retried sensor alone
    would only read the same failed step (stages rewrite their outputs, and train resumes from its
    checkpoints). Each try names its step after itself, so the pokes of a try wait on the step the
    try added instead of adding another, and a try that finds the stage's newest step still
    running or completed (its task failed, not the step) waits on that one. A failed step's error,
    which the stage leaves in the run folder, is logged at once; bad input fails the task without
    its retry, as on the local target, and so does the time limit."""

    template_fields = (*EmrStepSensor.template_fields, "step", "run_dir")

    def __init__(self, *, stage: str, step: dict, run_dir: str, **kwargs):
        # Rescheduled between pokes, never deferred: its checks of a failed step are in poke, which
        # a trigger would not run.
        kwargs.setdefault("mode", "reschedule")
        kwargs.setdefault("deferrable", False)
        super().__init__(step_id="", **kwargs)
        self.stage, self.step, self.run_dir = stage, step, run_dir

    def poke(self, context) -> bool:
        self.step_id = self.current_step(step_name(self.stage, context["ti"].try_number))
        try:
            done = super().poke(context)
        except AirflowException:
            self.check_cluster_running()
            self.check_time_limit()
            self.report_stage_error()
            raise
        if not done and stages.by_name(self.stage).reports_progress:
            self.report_progress()
        return done

    def current_step(self, name: str) -> str:
        newest = next(iter(self.stage_steps()), None)
        if newest is None or (newest["Status"]["State"] in self.failed_states and newest["Name"] != name):
            self.check_cluster_running()  # EMR refuses a step on a cluster that ended: say why, without the retry
            self.stored_run().remove(run_folder.error_path(self.stage))  # an earlier try's error is not this step's
            (step_id,) = self.hook.add_job_flow_steps(job_flow_id=self.job_flow_id, steps=[{**self.step, "Name": name}])
            self.log.info("added step %s (%s) to cluster %s", step_id, name, self.job_flow_id)
            return step_id
        return newest["Id"]

    def stage_steps(self) -> list[dict]:
        """The cluster's steps of this stage, newest first."""
        pages = self.hook.conn.get_paginator("list_steps").paginate(ClusterId=self.job_flow_id)
        steps = [step for page in pages for step in page["Steps"]]
        return [step for step in steps if step["Name"] == self.stage or step["Name"].startswith(f"{self.stage} (try ")]

    def stored_run(self) -> StoredRun:
        return StoredRun(self.run_dir, S3Hook(aws_conn_id=self.aws_conn_id, region_name=self.region_name))

    def report_progress(self) -> None:
        """Log how far the running stage is, from the progress file it keeps in the run folder (train
        does), so that the task's log follows a long step; the step's own log reaches S3 only after it."""
        try:
            run, path = self.stored_run(), run_folder.progress_path(self.stage)
            if run.has(path):
                self.log.info("%s: %s", self.stage, describe_progress(run.read_json(path)))
        except Exception as error:  # reading progress must never fail the wait
            self.log.warning("%s: progress not readable: %s", self.stage, error)

    def check_cluster_running(self) -> None:
        """A cluster that ended (a failed bootstrap, lost nodes, terminated by hand or after its idle
        timeout) cancels its steps and takes no more: say why, and fail without the retry, which has
        no cluster to run on."""
        try:
            cluster = self.hook.conn.describe_cluster(ClusterId=self.job_flow_id)["Cluster"]
        except Exception as error:  # the step's failure is still reported and raised
            self.log.warning("cluster %s not described: %s", self.job_flow_id, error)
            return
        if cluster["Status"]["State"] in ENDED_STATES:
            raise AirflowFailException(f"{self.stage}: {ended_cluster(cluster)}")

    def check_time_limit(self) -> None:
        """A step that ran out of its own time limit fails without the retry, as a task out of time does."""
        limit = emr_steps.step_time_limit(self.step)
        try:
            step = self.hook.conn.describe_step(ClusterId=self.job_flow_id, StepId=self.step_id)["Step"]
        except Exception as error:  # the step's failure is still reported and raised
            self.log.warning("step %s not described: %s", self.step_id, error)
            return
        timeline = step["Status"].get("Timeline", {})
        start, end = timeline.get("StartDateTime"), timeline.get("EndDateTime")
        if start and end and (end - start).total_seconds() >= limit:
            raise AirflowFailException(f"{self.stage}: step {self.step_id} ran out of its time limit ({limit:,} s)")

    def report_stage_error(self) -> None:
        path, run = run_folder.error_path(self.stage), self.stored_run()
        if not run.has(path):
            self.log.error(
                "%s left no %s in the run folder: its step log stdout.gz under emr.log_uri says why",
                self.stage,
                path,
            )
            return
        error = run.read_json(path)
        self.log.error("%s stopped: %s", self.stage, error["error"])
        if error["bad_input"]:  # the same input would stop the retry too
            raise AirflowFailException(f"{self.stage}: {error['error']}")


def describe_progress(progress: dict) -> str:
    """'step 1,200 of 3,000 (40%), loss 3.2100, 25,000 tokens/s, about 12 min left (at …)'."""
    step, last = progress["step"], progress["max_steps"]
    minutes = round(progress["seconds_left"] / 60)
    left = f"about {minutes:,} min left" if minutes else "under a minute left"
    return (
        f"step {step:,} of {last:,} ({step / last:.0%}), loss {progress['loss']:.4f}, "
        f"{progress['tokens_per_s']:,} tokens/s, {left} (at {progress['updated_at']})"
    )
