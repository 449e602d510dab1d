"""The summary a local run of the DAG ends with (`make run`, `make rehearse`): where the run
folder, the report and the S3 record are, the model the latest pointer names, the losses, the run
folders keep_runs removed, where MLflow tracked it, and the generated sample."""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from local_platform import console
from pipeline import lake, run_folder
from pipeline.errors import name_some


def print_report(
    report: dict, pointer_uri: str, pointer: dict, removed: Iterable[str] = (), tracking: str | None = None
) -> None:
    """`tracking`: the line on where MLflow tracked the run (local_platform/mlflow_local.py)."""
    print(f"\nrun folder:       {report['run_folder']}")
    print(f"report:           {report['run_folder']}/{run_folder.REPORT_TEXT}")
    print(f"report page:      {report['run_folder']}/{run_folder.REPORT_HTML}")
    print(f"S3 record:        {report['s3_uri']} (served by the moto server, gone when this command ends)")
    print(f"latest model:     {pointer_uri} -> {pointer['model']}")
    if tracking:
        print(tracking)
    print(f"final val loss:   {report['final_val_loss']:.4f} nats/token")
    print(f"val nats/char:    {report['val_nats_per_char']:.4f}")
    for message in report["warnings"]:
        print(f"warning:          {message}")
    if removed:
        print(
            f"keep_runs:        removed {len(removed)} older run folder(s), their only copy (the S3 records of "
            f"earlier make runs ended with them): {name_some(sorted(removed))}"
        )
    print(f"generated sample:\n{console.printable(report['sample'])}")
    if report["run_folder"].startswith("s3://"):  # no model on this machine to sample from
        return
    model = shlex.quote(lake.local_path(lake.join(report["run_folder"], run_folder.MODEL_FOLDER)))
    prompt = shlex.quote(run_folder.read_config(report["run_folder"]).generate.prompt)
    print(f"\nmore samples:     .venv/bin/python -m spark_jobs.generate --model-dir {model} --prompt {prompt}")
