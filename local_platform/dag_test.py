"""The DAG run once with `airflow dags test` (by `make run`, `make rehearse` and the benchmarks),
and what the run left: its report and the latest pointer on the moto S3, the lake's run folders."""

from __future__ import annotations

import json
from pathlib import Path

from include.airflow_names import DAG_ID
from include.promote import latest_key
from local_platform.airflow_command import run_stoppable
from local_platform.airflow_home import Output
from local_platform.moto_s3 import LocalS3
from pipeline import lake, run_folder
from pipeline.config import PipelineConfig
from pipeline.errors import PipelineError


def dags_test(env: dict[str, str], conf: dict, output: Output | None = None) -> bool:
    """Run the DAG once; True when the run succeeded. On Ctrl-C its stage dies at once, but `dags
    test` itself would only mark the task for a retry and wait for it: it is killed 2 s later."""
    return run_stoppable(env, "dags", "test", DAG_ID, "--conf", json.dumps(conf), grace_s=2, output=output) == 0


def read_report(s3: LocalS3, config: PipelineConfig) -> dict:
    """The report of the run collected to this server (each `run` starts with an empty server)."""
    client = s3.client()
    prefix = config.s3.prefix.strip("/")
    listing = client.list_objects_v2(Bucket=config.s3.bucket, Prefix=f"{prefix}/" if prefix else "")
    reports = [
        item["Key"] for item in listing.get("Contents", []) if item["Key"].endswith("/" + run_folder.REPORT_JSON)
    ]
    if len(reports) != 1:
        location = f"s3://{config.s3.bucket}/{config.s3.prefix}/"
        raise PipelineError(f"expected one {run_folder.REPORT_JSON} in {location}, found {reports}")
    return json.loads(client.get_object(Bucket=config.s3.bucket, Key=reports[0])["Body"].read())


def latest_pointer(s3: LocalS3, config: PipelineConfig) -> tuple[str, dict]:
    """The URI and content of the run name's latest pointer, which promote wrote."""
    key = latest_key(config)
    body = s3.client().get_object(Bucket=config.s3.bucket, Key=key)["Body"].read()
    return f"s3://{config.s3.bucket}/{key}", json.loads(body)


def run_folders(config: PipelineConfig) -> set[str]:
    """The names of the local lake's run folders, to tell which ones prune_runs removed."""
    runs = Path(lake.local_path(run_folder.runs_folder(config.lake)))
    return {path.name for path in runs.iterdir()} if runs.is_dir() else set()
