"""`make airflow`: a taken port is named before Airflow starts, and SIGTERM stops it with a task
running and leaves no process (Ctrl-C: tests/e2e/test_ui_trigger.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from contextlib import suppress

import pytest

from local_platform import airflow_home, airflow_runner, standalone
from pipeline.config import REPO_ROOT
from tests.deployments import deployment_env
from tests.listening import free_port
from tests.local_platform.airflow_commands import (
    exposed_sockets,
    processes_in_session,
    stop_command,
    trigger,
    wait_for_a_running_stage,
)


def test_a_taken_ui_port_is_named_before_airflow_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(airflow_home, "AIRFLOW_HOME", tmp_path / "home")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        monkeypatch.setenv("AIRFLOW__API__PORT", str(port))
        assert airflow_runner.main(["ui"]) == 2
    error = capsys.readouterr().err
    assert (
        f"ERROR 127.0.0.1:{port} is taken (Address already in use): stop what listens there, or give Airflow" in error
    )
    assert not any((tmp_path / "home").glob("*.db")), "Airflow's database was made"
    # A port whose last connections are closing (TIME_WAIT) is free, as the API server binds it.
    with socket.create_server(("127.0.0.1", port)) as server, socket.create_connection(("127.0.0.1", port)):
        accepted, _ = server.accept()
        accepted.close()  # the server side closes first: its end waits in TIME_WAIT
    standalone.check_port_free("127.0.0.1", str(port))


@pytest.mark.timeout(1500)  # up to 600 s to trigger, 600 s for a stage to start, then the shutdown's grace
@pytest.mark.slow
def test_make_airflow_stopped_by_sigterm_with_a_task_running_leaves_no_process(tmp_path, shakespeare_slice):
    """Airflow's scheduler waits forever in its LocalExecutor's shutdown when stopped during a task
    (its workers outlive it after a second Ctrl-C): the command must still end, and end them. Ctrl-C
    is checked at the end of tests/e2e/test_ui_trigger.py, whose `make airflow` is already running."""
    home, log = tmp_path / "home", tmp_path / "make-airflow.log"
    deployment = {"lake": str(home / "lake"), "corpus_roots": [str(shakespeare_slice.parent)]}
    env = deployment_env(tmp_path / "pipeline.yaml", deployment)
    env |= {"GPT_PIPELINE_AIRFLOW_HOME": str(home), "AIRFLOW__API__PORT": str(free_port())}
    process = subprocess.Popen(
        [sys.executable, "-m", "local_platform.airflow_runner", "ui"],
        cwd=REPO_ROOT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        trigger(home, {"corpus": str(shakespeare_slice), "overrides": ["train.max_steps=20"]})
        wait_for_a_running_stage(process, log)
        assert exposed_sockets(process.pid) == [], "a socket of `make airflow` listens beyond loopback"
        stop_command(process, "sigterm")
        assert process.wait(timeout=standalone.STANDALONE_GRACE_S + 60) == 0
        deadline = time.monotonic() + 30
        while processes_in_session(process.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert processes_in_session(process.pid) == [], "Airflow or Spark processes outlived `make airflow`"
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def test_make_airflow_has_a_login_whose_password_only_its_owner_can_read(tmp_path):
    env: dict[str, str] = {}
    passwords = standalone.login_settings(env, tmp_path)
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] == "False"  # no token without a password
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "admin:admin"
    assert passwords == tmp_path / standalone.PASSWORDS_FILE
    assert stat.S_IMODE(passwords.stat().st_mode) == 0o600
    (password,) = json.loads(passwords.read_text()).values()
    assert len(password) >= 16
    standalone.login_settings({}, tmp_path)  # the next start keeps it
    assert json.loads(passwords.read_text()) == {"admin": password}
    inherited = {"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True"}
    standalone.login_settings(inherited, tmp_path)
    assert inherited["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] == "False"  # not opened again from outside
