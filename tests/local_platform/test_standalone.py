"""`make airflow`: a taken port is named before Airflow starts, and Ctrl-C or SIGTERM stop it
with a task running and leave no process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

import pytest

from include.airflow_names import DAG_ID
from local_platform import airflow_home, airflow_runner, standalone
from local_platform.airflow_home import AIRFLOW
from pipeline.config import REPO_ROOT
from tests.listening import listening_sockets
from tests.local_platform.airflow_commands import processes_in_session, stop_command, wait_for_a_running_stage


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


def exposed_sockets(session_id: int) -> list:
    """The sockets the session's processes listen on beyond loopback, on this machine's network
    (the train stage's, in a private network namespace that holds only loopback, are not)."""
    ours = os.readlink("/proc/self/ns/net")
    pids = [int(line.split()[1]) for line in processes_in_session(session_id)]
    return [found for pid in pids for found in listening_sockets(pid) if not found.loopback and found.netns == ours]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def trigger(home: Path, conf: dict) -> None:
    """`airflow dags trigger` on the home's database, once the DAG processor has stored the DAG."""
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
        "PYTHONPATH": str(REPO_ROOT),
    }
    deadline = time.monotonic() + 600
    while True:
        command = [str(AIRFLOW), "dags", "trigger", DAG_ID, "--conf", json.dumps(conf)]
        done = subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True)
        if done.returncode == 0:
            return
        assert time.monotonic() < deadline, f"the DAG could not be triggered:\n{done.stderr[-2000:]}"
        time.sleep(5)


@pytest.mark.timeout(1500)  # up to 600 s to trigger, 600 s for a stage to start, then the shutdown's grace
@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_make_airflow_stops_with_a_task_running_and_leaves_no_process(tmp_path, shakespeare_slice, how):
    """Airflow's scheduler waits forever in its LocalExecutor's shutdown when stopped during a task
    (its workers outlive it after a second Ctrl-C): the command must still end, and end them."""
    home, log = tmp_path / "home", tmp_path / "make-airflow.log"
    env = {**os.environ, "GPT_PIPELINE_AIRFLOW_HOME": str(home), "AIRFLOW__API__PORT": str(free_port())}
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
        trigger(home, {"corpus": str(shakespeare_slice), "overrides": [f"lake={home / 'lake'}", "train.max_steps=20"]})
        wait_for_a_running_stage(process, log)
        assert exposed_sockets(process.pid) == [], "a socket of `make airflow` listens beyond loopback"
        stop_command(process, how)
        assert process.wait(timeout=standalone.STANDALONE_GRACE_S + 60) == 0
        deadline = time.monotonic() + 30
        while processes_in_session(process.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert processes_in_session(process.pid) == [], "Airflow or Spark processes outlived `make airflow`"
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
