"""MLflow tracking and the registry (include/tracking.py): collected records on a moto server,
logged to a real MLflow store (SQLite) and registered there, as collect and promote do."""

from __future__ import annotations

import json
import logging
import socket

import pytest
from mlflow import MlflowClient

from include import tracking
from include.promote import promote_record
from include.record import StoredRun, collect_record
from pipeline import run_folder
from pipeline.config_files import load_config
from pipeline.stages import STAGE_NAMES
from tests.include.records import LAKE_BUCKET, collected_run, finished_run, run_files

AIRFLOW_RUN = {"dag_id": "gpt_pipeline", "run_id": "manual__2026-11-27T12:00:00+00:00"}


@pytest.fixture
def store(tmp_path, monkeypatch) -> str:
    """A SQLite tracking store the DAG's Airflow variable names, as `make run` gives it."""
    uri = f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"  # its folder made by the first run it tracks
    monkeypatch.setenv("AIRFLOW_VAR_MLFLOW_TRACKING_URI", uri)
    return uri


def test_collect_logs_the_runs_settings_figures_report_and_model(s3, hook, tmp_path, store):
    report = collected_run(s3, hook, tmp_path, "tracked-1", 0.9, "train.max_steps=40")
    tracked = tracking.track_collected_run(load_config(), report, hook, AIRFLOW_RUN)

    mlflow = MlflowClient(store)
    run = mlflow.get_run(tracked["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked-1"
    assert mlflow.get_experiment(run.info.experiment_id).name == "gpt-pipeline"
    # The run's settings, the deployment's left out.
    params = run.data.params
    assert params["train.max_steps"] == "40" and params["run_name"] == "books" and params["model.n_layer"] == "4"
    assert not [name for name in params if name.split(".")[0] in ("s3", "lake", "emr", "alerts", "tracking")]
    assert run.data.tags["airflow.run_id"] == AIRFLOW_RUN["run_id"]
    assert run.data.tags[tracking.RECORD_TAG] == report["s3_uri"]
    assert run.data.tags["gpt_pipeline.report"] == report["s3_uri"] + run_folder.REPORT_HTML
    # Step-indexed figures: each validation pass's, and the final ones at the last step.
    assert [(point.step, point.value) for point in mlflow.get_metric_history(run.info.run_id, "val_loss")] == [
        (20, 2.7),
        (40, 2.5),
    ]
    metrics = run.data.metrics
    assert metrics["final_val_nats_per_char"] == 0.9 and metrics["train_tokens_per_s"] == 5123.4
    assert metrics["stage_seconds.train"] == 9.0
    # The report, config and samples as the record has them; the model: its Hugging Face folder.
    record = StoredRun(report["s3_uri"], hook)
    artifacts = tmp_path / "downloaded"
    mlflow.download_artifacts(run.info.run_id, "", str(artifacts))
    for name in (run_folder.REPORT_HTML, run_folder.REPORT_JSON, run_folder.CONFIG_FILE, run_folder.SAMPLES_PATH):
        assert (artifacts / name).read_bytes() == record.read(name)
    assert sorted(path.name for path in (artifacts / "model").iterdir()) == ["config.json", "model.safetensors"]
    # Beside the store, not in the task's working directory.
    assert run.info.artifact_uri.startswith((tmp_path / "mlflow" / "artifacts").as_uri())


def test_a_run_folder_on_s3_with_folder_markers_is_collected_and_its_model_logged(s3, hook, tmp_path, store):
    """pyarrow's S3 file system leaves an empty object named after a folder it makes (`model/hf/`),
    as an EMR run's stages write the lake: a marker is no file, to copy or to download."""
    config = load_config(overrides=[{"lake": f"s3://{LAKE_BUCKET}/lake", "target": "emr"}, "run_name=books"])
    run_dir = run_folder.run_dir(config, "marked-1")
    markers = {f"{run_folder.MODEL_FOLDER}/": b"", f"{run_folder.MODEL_HF_PATH}/": b""}
    finished_run(s3, run_dir, run_files(config.to_json()) | markers)
    assert not [path for path in StoredRun(run_dir, hook).files() if path.endswith("/")]
    report = collect_record(run_dir, hook, STAGE_NAMES)
    tracked = tracking.track_collected_run(config, report, hook, AIRFLOW_RUN)
    assert tracked is not None
    artifacts = tmp_path / "downloaded"
    MlflowClient(store).download_artifacts(tracked["run_id"], "model", str(artifacts))
    assert sorted(path.name for path in (artifacts / "model").iterdir()) == ["config.json", "model.safetensors"]


def test_a_collect_retried_after_logging_logs_the_record_once(s3, hook, tmp_path, store):
    report = collected_run(s3, hook, tmp_path, "tracked-twice", 0.9)
    first = tracking.track_collected_run(load_config(), report, hook, AIRFLOW_RUN)
    again = tracking.track_collected_run(load_config(), report, hook, AIRFLOW_RUN)
    assert again["run_id"] == first["run_id"]
    assert json.loads(json.dumps(again)) == first  # collect's XCom
    assert len(MlflowClient(store).search_runs([first["experiment_id"]])) == 1


def test_promote_makes_each_promoted_model_the_champion_of_its_run_name(s3, hook, tmp_path, store):
    config, mlflow = load_config(), MlflowClient(store)
    versions = []
    for run_id in ("registered-1", "registered-2"):
        report = collected_run(s3, hook, tmp_path, run_id, 0.9)
        report["mlflow"] = tracking.track_collected_run(config, report, hook, AIRFLOW_RUN)
        decision = promote_record(report["s3_uri"], hook)
        registered = tracking.register_promoted_model(config, report, decision)
        champion = mlflow.get_model_version_by_alias("books", tracking.CHAMPION)
        assert registered == {"registered_model": "books", "version": str(champion.version), "alias": "champion"}
        assert champion.run_id == report["mlflow"]["run_id"]
        assert champion.tags["latest_pointer"] == decision["latest"]
        assert champion.tags[tracking.RECORD_TAG] == report["s3_uri"]
        versions.append(str(champion.version))
        # A retried promote leaves the champion where it is.
        assert tracking.register_promoted_model(config, report, decision)["version"] == str(champion.version)
    assert versions == ["1", "2"]
    assert sorted(str(version.version) for version in mlflow.search_model_versions("name = 'books'")) == ["1", "2"]


def test_no_tracking_uri_tracks_nothing_and_registers_nothing(s3, hook, tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("AIRFLOW_VAR_MLFLOW_TRACKING_URI", raising=False)
    report = collected_run(s3, hook, tmp_path, "untracked", 0.9)
    with caplog.at_level(logging.INFO, logger=tracking.__name__):
        assert tracking.track_collected_run(load_config(), report, hook, AIRFLOW_RUN) is None
    assert "not tracked (the Airflow variable mlflow_tracking_uri is unset)" in caplog.text
    decision = promote_record(report["s3_uri"], hook)
    assert tracking.register_promoted_model(load_config(), report | {"mlflow": None}, decision) is None


def test_a_tracking_server_out_of_reach_is_a_warning_naming_it_without_its_password(
    s3, hook, tmp_path, monkeypatch, caplog
):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    monkeypatch.setenv("AIRFLOW_VAR_MLFLOW_TRACKING_URI", f"http://team:s3cret@127.0.0.1:{port}")
    report = collected_run(s3, hook, tmp_path, "unreachable", 0.9)
    with caplog.at_level(logging.WARNING, logger=tracking.__name__):
        assert tracking.track_collected_run(load_config(), report, hook, AIRFLOW_RUN) is None
    assert f"MLflow: the run was not tracked at http://team:***@127.0.0.1:{port}:" in caplog.text
    assert "s3cret" not in caplog.text


def test_registration_off_logs_the_run_and_registers_no_model(s3, hook, tmp_path, store):
    config = load_config(overrides=["tracking.register_models=false"])
    report = collected_run(s3, hook, tmp_path, "not-registered", 0.9)
    report["mlflow"] = tracking.track_collected_run(config, report, hook, AIRFLOW_RUN)
    assert report["mlflow"] is not None
    assert tracking.register_promoted_model(config, report, promote_record(report["s3_uri"], hook)) is None
    assert MlflowClient(store).search_registered_models() == []


def test_the_training_curve_comes_from_the_log_interval_points_when_the_run_has_them():
    report = {
        "steps": [{"step": 50.0, "train_loss": 3.0, "learning_rate": 0.004, "tokens_per_s": 8000.0}],
        "evaluations": [{"step": 100.0, "train_loss": 2.0, "val_loss": 2.2, "val_nats_per_char": 1.7}],
        "final_val_loss": 2.1,
        "val_nats_per_char": 1.68,
        "train": {},
        "stage_seconds": {"train": 200.5},
    }
    assert tracking.run_metrics(report) == [
        ("train_loss", 3.0, 50),
        ("learning_rate", 0.004, 50),
        ("tokens_per_s", 8000.0, 50),
        ("val_loss", 2.2, 100),
        ("val_nats_per_char", 1.7, 100),
        ("final_val_loss", 2.1, 100),
        ("final_val_nats_per_char", 1.68, 100),
        ("stage_seconds.train", 200.5, 100),
    ]


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("http://team:s3cret@mlflow.example:5000", "http://team:***@mlflow.example:5000"),
        ("https://mlflow.example", "https://mlflow.example"),
        ("sqlite:////srv/mlflow.db", "sqlite:////srv/mlflow.db"),
    ],
)
def test_logs_show_a_tracking_uri_without_its_password(uri, shown):
    assert tracking.shown_uri(uri) == shown
