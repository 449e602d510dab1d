"""MLflow tracking: the collect task logs each run as an MLflow run, and the promote task makes a
promoted model a new version of the registered model named after the run name, with the alias
`champion` moved to it. Both run on the Airflow side, for either target: the EMR nodes need nothing.

The tracking server is the deployment's: the Airflow variable tracking.uri_variable names
(`mlflow_tracking_uri` by default) holds its URI; unset or empty, nothing is tracked. A server out
of reach, or any error of MLflow's, is a warning in the task's log: a run never fails for it. The
latest pointer on S3 stays the pipeline's own source of truth; the registry follows it.

An MLflow run holds: the run's settings (run settings only) as params; the training curve, each
validation pass's figures and the final ones as step-indexed metrics, with tokens/s and each
stage's seconds; the report, config, samples and model (the Hugging Face folder where the run has
one) as artifacts; tags naming the Airflow DAG run and the S3 record.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from include.record import StoredRun
from pipeline import run_folder
from pipeline.deployment import is_deployment_setting
from pipeline.errors import cut
from pipeline.stages import flatten

log = logging.getLogger(__name__)

CHAMPION = "champion"
RECORD_TAG = "gpt_pipeline.record"
PARAM_CHARS = 6_000  # MLflow's limit on a param's value
BATCH = 100  # params or metrics per log_batch request, within MLflow's limits
HEALTH_TIMEOUT_S = 5
# A server that stops answering mid-run fails the logging within minutes, not MLflow's default hour.
CLIENT_ENVIRONMENT = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "60"}
REPORT_FILES = (run_folder.REPORT_HTML, run_folder.REPORT_TEXT, run_folder.REPORT_JSON)
RECORD_ARTIFACTS = (run_folder.CONFIG_FILE, run_folder.SAMPLES_PATH)


def tracking_uri(config) -> str | None:
    """The tracking URI the deployment's Airflow variable holds, None when it is unset or empty."""
    from airflow.sdk import Variable

    return Variable.get(config.tracking.uri_variable, default=None) or None


def shown_uri(uri: str) -> str:
    """`uri` as logs show it: without the password a URI may carry."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{parts.hostname}:{parts.port or ''}".rstrip(":")))


def check_reachable(uri: str) -> None:
    """Raise when a tracking server over HTTP does not answer its health check within seconds."""
    if urlsplit(uri).scheme in ("http", "https"):
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=HEALTH_TIMEOUT_S) as response:
            response.read()


def client(uri: str):
    from mlflow import MlflowClient

    for name, value in CLIENT_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    database = sqlite_file(uri)
    if database is not None:
        database.parent.mkdir(parents=True, exist_ok=True)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def sqlite_file(uri: str) -> Path | None:
    """The database file of a SQLite store's URI (sqlite:////abs/path.db), None for any other store."""
    parts = urlsplit(uri)
    return Path(parts.path[1:]) if parts.scheme == "sqlite" and parts.path.startswith("//") else None


def artifact_location(uri: str) -> str | None:
    """Where a new experiment keeps its artifacts: beside a SQLite store's database file (MLflow
    would use ./mlruns of the task's working directory); a server's own choice otherwise."""
    database = sqlite_file(uri)
    return None if database is None else database.parent.joinpath("artifacts").as_uri()


def experiment_id(mlflow, name: str, uri: str) -> str:
    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return mlflow.create_experiment(name, artifact_location=artifact_location(uri))
    except Exception:  # made meanwhile by another run's collect
        found = mlflow.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def run_params(config: dict) -> dict[str, str]:
    """The run's settings as MLflow params: every run setting by its dotted name, deployment ones left out."""
    return {
        name: cut(str(value), PARAM_CHARS) for name, value in flatten(config).items() if not is_deployment_setting(name)
    }


def run_metrics(report: dict) -> list[tuple[str, float, int]]:
    """(name, value, step) of the report's figures: the training curve (its log-interval points, else
    the validation passes' training loss), each validation pass's, the final ones at the last step,
    then tokens/s and each stage's seconds."""
    evaluations, points = report.get("evaluations", []), report.get("steps", [])
    metrics = [
        (name, row[name], int(row["step"]))
        for row in points or evaluations
        for name in ("train_loss", "learning_rate", "tokens_per_s")
        if name in row
    ]
    metrics += [
        (name, row[name], int(row["step"]))
        for row in evaluations
        for name in ("val_loss", "val_nats_per_char")
        if name in row
    ]
    last_step = int(max((row["step"] for row in [*points, *evaluations]), default=0))
    train, generation = report.get("train", {}), report.get("generation", {})
    finals = {
        "final_val_loss": report.get("final_val_loss"),
        "final_val_nats_per_char": report.get("val_nats_per_char"),
        "train_tokens_per_s": train.get("tokens_per_s"),
        "generate_tokens_per_s": generation.get("tokens_per_s"),
        **{f"stage_seconds.{stage}": seconds for stage, seconds in report.get("stage_seconds", {}).items()},
    }
    return metrics + [(name, value, last_step) for name, value in finals.items() if value is not None]


def run_tags(report: dict, config: dict, airflow_run: dict) -> dict[str, str]:
    return {
        "mlflow.source.name": airflow_run["dag_id"],
        "airflow.dag_id": airflow_run["dag_id"],
        "airflow.run_id": airflow_run["run_id"],
        RECORD_TAG: report["s3_uri"],
        "gpt_pipeline.report": f"{report['s3_uri']}{run_folder.REPORT_HTML}",
        "gpt_pipeline.run_folder": report["run_folder"],
        "gpt_pipeline.run_name": report["run_name"],
        "gpt_pipeline.target": config["target"],
    }


def model_folder(report: dict) -> str:
    """The record's model folder to log: the Hugging Face one where the run has it, else the Keras one."""
    formats = report.get("model_formats", {})
    return run_folder.MODEL_HF_PATH if "huggingface" in formats else run_folder.MODEL_FOLDER


def download(record: StoredRun, folder: str, into: Path) -> Path:
    """Copy the record's files below `folder` (or the file `folder`) into `into`."""
    for path in record.files():
        if path == folder or path.startswith(f"{folder}/"):
            target = into / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(record.read(path))
    return into / folder


def log_artifacts(mlflow, run_id: str, record: StoredRun, report: dict) -> None:
    with tempfile.TemporaryDirectory(prefix="mlflow-artifacts-") as scratch:
        for name in (*REPORT_FILES, *RECORD_ARTIFACTS):
            mlflow.log_artifact(run_id, str(download(record, name, Path(scratch))))
        model = download(record, model_folder(report), Path(scratch))
        if model.is_dir():  # a record without a model has none to log
            mlflow.log_artifacts(run_id, str(model), "model")


def finished_run(mlflow, experiment: str, record_uri: str):
    """The finished MLflow run of this record, if a collect before this one logged it whole."""
    found = mlflow.search_runs(
        [experiment], filter_string=f"tags.`{RECORD_TAG}` = '{record_uri}' and attributes.status = 'FINISHED'"
    )
    return found[0] if found else None


def log_run(mlflow, uri: str, experiment_name: str, report: dict, record: StoredRun, airflow_run: dict) -> dict:
    """Log the collected run as a finished MLflow run (once per record); returns where it is."""
    from mlflow.entities import Metric, Param

    experiment = experiment_id(mlflow, experiment_name, uri)
    run = finished_run(mlflow, experiment, report["s3_uri"])
    if run is None:
        config = record.read_json(run_folder.CONFIG_FILE)
        run = mlflow.create_run(experiment, run_name=report["run"], tags=run_tags(report, config, airflow_run))
        run_id = run.info.run_id
        try:
            params = [Param(name, value) for name, value in run_params(config).items()]
            now = int(time.time() * 1000)
            metrics = [Metric(name, float(value), now, step) for name, value, step in run_metrics(report)]
            for start in range(0, max(len(params), len(metrics)), BATCH):
                mlflow.log_batch(run_id, metrics=metrics[start : start + BATCH], params=params[start : start + BATCH])
            log_artifacts(mlflow, run_id, record, report)
        except BaseException:
            mlflow.set_terminated(run_id, "FAILED")
            raise
        mlflow.set_terminated(run_id, "FINISHED")
    return {
        "tracking_uri": shown_uri(uri),
        "experiment_id": experiment,
        "run_id": run.info.run_id,
        "artifact_uri": run.info.artifact_uri,
    }


def track_collected_run(config, report: dict, hook, airflow_run: dict) -> dict | None:
    """collect's MLflow run (see log_run), or None: tracking is off, or failed (a warning)."""
    uri = tracking_uri(config)
    if uri is None:
        log.info("MLflow: not tracked (the Airflow variable %s is unset)", config.tracking.uri_variable)
        return None
    try:
        check_reachable(uri)
        record = StoredRun(report["s3_uri"], hook)
        tracked = log_run(client(uri), uri, config.tracking.experiment, report, record, airflow_run)
    except Exception as error:
        log.warning("MLflow: the run was not tracked at %s: %s", shown_uri(uri), cut(str(error)))
        return None
    log.info("MLflow: run %s in experiment %s at %s", tracked["run_id"], tracked["experiment_id"], shown_uri(uri))
    return tracked


def register_version(mlflow, name: str, tracked: dict, decision: dict) -> dict:
    """A new version of registered model `name` from the tracked run's model, alias champion moved
    to it; a retried promote finds champion on this run's version already."""
    from mlflow.exceptions import MlflowException

    try:
        mlflow.create_registered_model(name, description=f"Promoted models of the run name {name} (gpt_pipeline)")
    except MlflowException as error:
        if error.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    champion = current_champion(mlflow, name)
    if champion is None or champion.run_id != tracked["run_id"]:
        pointer = decision["pointer"]
        champion = mlflow.create_model_version(
            name,
            source=f"runs:/{tracked['run_id']}/model",
            run_id=tracked["run_id"],
            tags={"latest_pointer": decision["latest"], RECORD_TAG: pointer["record"]},
            description=decision["reason"],
        )
        mlflow.set_registered_model_alias(name, CHAMPION, champion.version)
    return {"registered_model": name, "version": str(champion.version), "alias": CHAMPION}


def current_champion(mlflow, name: str):
    from mlflow.exceptions import MlflowException

    try:
        return mlflow.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:  # no version carries the alias yet
        return None


def register_promoted_model(config, report: dict, decision: dict) -> dict | None:
    """promote's registry entry (see register_version) for a run collect tracked (its report's
    "mlflow"), named after the run name; None: not tracked, registration off, or failed (a warning)."""
    tracked, name = report.get("mlflow"), report["run_name"]
    if tracked is None or not config.tracking.register_models:
        return None
    uri = tracking_uri(config)
    if uri is None:
        return None
    try:
        check_reachable(uri)
        registered = register_version(client(uri), name, tracked, decision)
    except Exception as error:
        log.warning("MLflow: the promoted model was not registered at %s: %s", shown_uri(uri), cut(str(error)))
        return None
    log.info("MLflow: registered model %s version %s is %s", name, registered["version"], CHAMPION)
    return registered
