"""MLflow on this machine (local_platform/mlflow_local.py): `make mlflow`'s server, on loopback
alone, with a run logged and registered through it as collect and promote do and shown by its UI
in a real browser; the tracking URI the local commands give the DAG."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from include import tracking
from include.promote import promote_record
from local_platform import mlflow_local
from local_platform.moto_s3 import LocalS3
from pipeline.config import REPO_ROOT
from pipeline.config_files import load_config
from tests.e2e.browser import chromium, full_page_screenshot
from tests.include.records import LAKE_BUCKET, RECORD_BUCKET, collected_run
from tests.listening import free_port, watch_listening

STARTUP_S = 180


def wait_for_health(uri: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        assert server.poll() is None, f"the MLflow server ended ({server.returncode}): {server.stdout.read()}"
        try:
            tracking.check_reachable(uri)
            return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"the MLflow server did not answer on {uri} within {STARTUP_S} s")


def running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def ui_page_text(uri: str, tracked: dict, profile) -> str:
    """The text of the run's page in MLflow's UI, in a real browser, once it shows the run's name."""
    with chromium(profile) as driver:
        driver.get(f"{uri}/#/experiments/{tracked['experiment_id']}/runs/{tracked['run_id']}")
        WebDriverWait(driver, 60).until(lambda page: "served-1" in page.find_element(By.TAG_NAME, "body").text)
        full_page_screenshot(driver, "mlflow-run.png")
        return driver.find_element(By.TAG_NAME, "body").text


def rest(uri: str, path: str) -> dict:
    with urllib.request.urlopen(f"{uri}/api/2.0/mlflow/{path}", timeout=30) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def mlflow_command() -> Path:
    """.venv-mlflow's mlflow: make mlflow-venv builds the environment when missing or out of date."""
    subprocess.run(["make", "mlflow-venv"], cwd=REPO_ROOT, check=True, timeout=1800)
    return REPO_ROOT / ".venv-mlflow" / "bin" / "mlflow"


@pytest.mark.slow
@pytest.mark.pip
def test_make_mlflow_serves_its_ui_on_loopback_and_a_run_is_logged_and_registered_through_it(
    tmp_path, monkeypatch, mlflow_command
):
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    monkeypatch.delenv(mlflow_local.URI_SETTING)  # the session's store, which conftest names
    port, store = free_port(), tmp_path / "mlflow"
    uri = mlflow_local.server_uri(port)
    command = [sys.executable, "-m", "local_platform.mlflow_local", "--port", str(port), "--store", str(store)]
    command += ["--mlflow", str(mlflow_command)]
    seen = {}

    def serve_and_use() -> None:
        server = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            wait_for_health(uri, server)
            assert mlflow_local.tracking_uri(port, store) == uri  # what `make run` picks while it answers
            with LocalS3(buckets=(RECORD_BUCKET, LAKE_BUCKET)) as s3:
                for name, value in s3.connection_env().items():
                    monkeypatch.setenv(name, value)
                monkeypatch.setenv("AIRFLOW_VAR_MLFLOW_TRACKING_URI", uri)
                hook = S3Hook(aws_conn_id="aws_default")
                report = collected_run(s3, hook, tmp_path, "served-1", 0.9)
                report["mlflow"] = tracking.track_collected_run(
                    load_config(), report, hook, {"dag_id": "d", "run_id": "r"}
                )
                seen["tracked"] = report["mlflow"]
                seen["registered"] = tracking.register_promoted_model(
                    load_config(), report, promote_record(report["s3_uri"], hook)
                )
            seen["run"] = rest(uri, f"runs/get?run_id={seen['tracked']['run_id']}")["run"]
            seen["champion"] = rest(uri, "registered-models/alias?name=books&alias=champion")["model_version"]
            seen["page"] = ui_page_text(uri, seen["tracked"], tmp_path / "chromium-profile")
        finally:
            seen["started"] = psutil.Process(server.pid).children(recursive=True)
            server.send_signal(signal.SIGTERM)  # to the command alone, unlike Ctrl-C in a terminal
            seen["exit"] = server.wait(timeout=60)
            seen["left"] = [process.pid for process in seen["started"] if running(process)]

    watched = watch_listening(serve_and_use)
    watched.assert_loopback_only()
    assert any(entry.port == port for entry in watched.seen.values()), watched.summary()
    # `mlflow server`, its web server and its job runner, all stopped.
    assert len(seen["started"]) >= 3 and seen["exit"] == 130 and seen["left"] == []

    run = seen["run"]
    assert run["info"]["status"] == "FINISHED" and run["info"]["run_name"] == "served-1"
    assert {"key": "val_nats_per_char", "value": 0.9} in [
        {"key": metric["key"], "value": metric["value"]} for metric in run["data"]["metrics"]
    ]
    assert "served-1" in seen["page"] and "gpt-pipeline" in seen["page"]  # the UI shows the run in its experiment
    assert seen["champion"]["run_id"] == seen["tracked"]["run_id"]
    assert seen["registered"]["version"] == seen["champion"]["version"] == "1"
    # The server keeps the artifacts it was sent under the store's folder, and its runs in the store's database.
    assert list((store / "artifacts").rglob("model.safetensors"))
    assert (store / "mlflow.db").is_file()


def test_the_local_commands_track_to_the_store_while_no_server_answers(tmp_path, monkeypatch):
    monkeypatch.delenv(mlflow_local.URI_SETTING, raising=False)
    assert mlflow_local.tracking_uri(free_port(), tmp_path) == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert mlflow_local.describe(mlflow_local.store_uri()).endswith(
        f"(`make mlflow` shows it on {mlflow_local.server_uri()})"
    )


def test_a_tracking_uri_set_for_the_local_commands_wins_and_empty_turns_tracking_off(monkeypatch):
    monkeypatch.setenv(mlflow_local.URI_SETTING, "http://mlflow.team.example")
    assert mlflow_local.tracking_uri() == "http://mlflow.team.example"
    monkeypatch.setenv(mlflow_local.URI_SETTING, "")
    assert mlflow_local.tracking_uri() == ""
    assert "off" in mlflow_local.describe("")
    env = mlflow_local.tracking_env(load_config(overrides=["tracking.uri_variable=team_mlflow"]), "sqlite:///x.db")
    assert env == {"AIRFLOW_VAR_TEAM_MLFLOW": "sqlite:///x.db"}
