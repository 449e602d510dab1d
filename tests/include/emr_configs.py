"""The configs of the EMR target's tests: the defaults with target emr and an S3 lake."""

from __future__ import annotations

from pipeline.config_files import load_config

EMR_TARGET = ["target=emr", "lake=s3://test-lake/pipeline"]
# As the DAG passes it: Airflow's run id made a folder name once, by form_config (run_folder.safe_run_id).
RUN_ID = "tinyshakespeare-manual__2026-11-22T08_00_00_00_00"


def emr_config(*overrides: str):
    return load_config(overrides=EMR_TARGET + list(overrides))
