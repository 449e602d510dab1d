"""The EMR target's tasks as a DAG of their own, for tests/test_emr_airflow.py:

prepare -> create_cluster -> {stage}_step -> {stage}_wait ... -> collect -> terminate_cluster (teardown)

The test gives the config overrides in EMR_TEST_OVERRIDES (JSON) and drives the steps on moto.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone

from airflow.sdk import DAG, get_current_context, task

from include import emr_tasks
from include.spark_submit import STAGES
from spark_jobs.lib import lake
from spark_jobs.lib.config import load_config

CONFIG = load_config(overrides=json.loads(os.environ.get("EMR_TEST_OVERRIDES", "{}")))


@task(multiple_outputs=True, retries=0)
def prepare() -> dict:
    run_id = f"{CONFIG.run_name}-{get_current_context()['run_id']}"
    return emr_tasks.prepare(CONFIG, run_id, CONFIG)


@task(retries=0)
def collect(run_dir: str) -> None:
    """Stands in for the pipeline's collect task: records which stages completed in the run folder."""
    completed = [stage for stage in STAGES if lake.exists(lake.stats_uri(run_dir, stage))]
    lake.write_json(lake.join(run_dir, "collected.json"), completed)


with DAG(
    dag_id="emr_pipeline_test",
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    default_args={"retries": 2},  # like the pipeline DAG: the EMR tasks set their own
) as dag:
    prepared = prepare()
    create, last_wait, terminate = emr_tasks.cluster_tasks(CONFIG, prepared, sensor_mode="poke")
    last_wait >> collect(prepared["run_dir"]) >> terminate
