"""`make run` (`python -m local_platform.airflow_runner run`): the whole DAG once with `airflow
dags test`, S3 on a moto server that lives as long as the command, its output on the quiet
console (the full log in Airflow's home), then the run's summary, or why a failed run stopped."""

from __future__ import annotations

import sys

from include.airflow_names import DAG_ID
from local_platform import airflow_home, console, deployment_file, mlflow_local
from local_platform.airflow_command import Stopped
from local_platform.dag_test import dags_test, latest_pointer, read_report, run_folders
from local_platform.moto_s3 import LocalS3
from local_platform.run_summary import print_report
from pipeline.config import PipelineConfig
from pipeline.config_files import defaults_path, read_yaml

# In Airflow's home: the defaults file with the deployer's settings, which the DAG reads as its deployment's.
DEPLOYMENT_FILE = "pipeline-deployment.yaml"


def run(
    config: PipelineConfig, corpus: str | None, deployers: list[str], runs: list[str], verbose: bool = False
) -> int:
    """Run the DAG once: `corpus` and the `deployers` overrides in its deployment's file, the
    `runs` overrides in the run's form; `config` is all of them applied."""
    home = airflow_home.AIRFLOW_HOME
    log = console.log_path(home, "run")
    with (
        airflow_home.exclusive_home(home, "make run"),
        LocalS3(buckets=(config.s3.bucket,)) as s3,
        console.teed(log, airflow_home.task_state(home), verbose) as output,
    ):
        deployment = deployment_file.write(home / DEPLOYMENT_FILE, read_yaml(defaults_path()), corpus, deployers)
        tracking_uri = mlflow_local.tracking_uri()
        env = airflow_home.prepare(home, s3, output) | {"GPT_PIPELINE_CONFIG": str(deployment)}
        env |= mlflow_local.tracking_env(config, tracking_uri)
        before = run_folders(config)
        try:
            succeeded = dags_test(env, {"overrides": runs}, output)
        except Stopped:
            print(f"\ninterrupted: the {DAG_ID} run stops here", file=sys.stderr)
            airflow_home.fail_unfinished_runs(home, env)
            console.print_log_path(log)
            return 130
        if not succeeded:
            console.print_failure(log, output, "run")
            return 1
        removed = before - run_folders(config)
        print_report(read_report(s3, config), *latest_pointer(s3, config), removed, mlflow_local.describe(tracking_uri))
    return 0
