"""The EMR target as Airflow tasks, built from include/emr.py with the amazon provider's operators.

    prepared = prepare_task(...)  # a @task(multiple_outputs=True) returning emr_tasks.prepare(...)
    create, last_wait, terminate = emr_tasks.cluster_tasks(config, prepared)
    last_wait >> collect >> terminate

create_cluster -> {stage}_step -> {stage}_wait -> ... -> terminate_cluster. terminate_cluster is a
teardown task: it runs whatever happened to the steps, and since Airflow leaves teardown tasks out
of the run's state, a failed step still fails the run.
"""

from __future__ import annotations

import logging

from airflow.providers.amazon.aws.hooks.s3 import S3Hook
from airflow.providers.amazon.aws.operators.emr import (
    EmrAddStepsOperator,
    EmrCreateJobFlowOperator,
    EmrTerminateJobFlowOperator,
)
from airflow.providers.amazon.aws.sensors.emr import EmrStepSensor

from include import emr
from include.spark_submit import STAGES
from spark_jobs.lib.config import PipelineConfig

log = logging.getLogger(__name__)


def prepare(config: PipelineConfig, run_id: str, dag_config: PipelineConfig, stages=STAGES) -> dict:
    """Check the run fits the DAG's sensor limits, upload it, and return what the EMR tasks send:
    `run_dir`, `job_flow_overrides` and `{stage}_steps` (run it as a task with multiple_outputs=True)."""
    emr.check_sensor_limits(config, dag_config)
    request = emr.job_flow_overrides(config, run_id)
    steps = {f"{stage}_steps": [emr.stage_step(stage, config, run_id)] for stage in stages}
    hourly, hours = emr.hourly_cost_usd(config), emr.max_cluster_hours(config)
    log.info("cluster: about $%.2f per hour on demand; at most %.1f hours (about $%.0f) with these limits",
             hourly, hours, hourly * hours)
    uploaded = emr.upload_run(config, run_id, S3Hook(aws_conn_id=config.emr.aws_conn_id).get_conn())
    return {"run_dir": uploaded["run_dir"], "job_flow_overrides": request, **steps}


def cluster_tasks(config: PipelineConfig, prepared, stages=STAGES, sensor_mode: str = "reschedule"):
    """The cluster's tasks in order; returns (create, the last step's sensor, terminate)."""
    aws = {"aws_conn_id": config.emr.aws_conn_id, "region_name": config.emr.region}
    # No retries: a retried create would start a second cluster, a retried add a second step, and
    # a retried sensor would only read the same failed step again (boto3 retries API errors itself).
    create = EmrCreateJobFlowOperator(
        task_id="create_cluster", job_flow_overrides=prepared["job_flow_overrides"], emr_conn_id=None, retries=0, **aws
    )
    previous = create
    for stage in stages:
        add = EmrAddStepsOperator(
            task_id=f"{stage}_step", job_flow_id=create.output, steps=prepared[f"{stage}_steps"], retries=0, **aws
        )
        wait = EmrStepSensor(
            task_id=f"{stage}_wait",
            job_flow_id=create.output,
            step_id=f"{{{{ ti.xcom_pull(task_ids='{stage}_step')[0] }}}}",
            mode=sensor_mode,
            retries=0,
            **emr.sensor_limits(stage, config),
            **aws,
        )
        previous >> add >> wait
        previous = wait
    terminate = EmrTerminateJobFlowOperator(task_id="terminate_cluster", job_flow_id=create.output, **aws)
    previous >> terminate.as_teardown(setups=create)
    return create, previous, terminate
