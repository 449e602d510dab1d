"""`make run`'s and `make airflow`'s commands as a terminal starts and stops them, and what they
leave in Airflow's home: for the tests of the local commands."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from include.airflow_names import DAG_ID
from local_platform.airflow_home import AIRFLOW
from pipeline.config import REPO_ROOT
from tests.listening import listening_sockets


def start_make_run(home: Path, corpus: Path, log: Path) -> subprocess.Popen:
    """`make run`'s command in a process group of its own, as a terminal starts it (SIGINT not ignored)."""
    command = [
        sys.executable,
        "-m",
        "local_platform.airflow_runner",
        "run",
        "--corpus",
        str(corpus),
        "--set",
        f"lake={home / 'lake'}",
        "--set",
        "train.max_steps=20",
    ]
    return subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env={**os.environ, "GPT_PIPELINE_AIRFLOW_HOME": str(home)},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def full_log(home: Path) -> str:
    """The full log of the home's one command so far (its console shows little of it)."""
    return "".join(path.read_text(errors="replace") for path in (home / "logs").glob("run-*.log"))


def wait_for_a_running_stage(process: subprocess.Popen, log: Path, home: Path | None = None) -> None:
    """Until Spark runs a stage: in the full log under `home` (`make run`'s console shows little),
    or in the command's own output (`make airflow`'s)."""
    deadline = time.monotonic() + 600
    while "Running Spark version" not in (full_log(home) if home else log.read_text(errors="replace")):
        assert process.poll() is None, f"the command ended early:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "no stage started in 180 s"
        time.sleep(0.5)


def processes_in_session(session_id: int) -> list[str]:
    listing = subprocess.run(["ps", "-eo", "sid=,pid=,args="], capture_output=True, text=True).stdout
    return [line for line in listing.splitlines() if line.split(None, 1)[0] == str(session_id)]


def run_states(home: Path) -> list[str]:
    with sqlite3.connect(home / "airflow.db") as db:
        return [state for (state,) in db.execute("SELECT state FROM dag_run ORDER BY id")]


def stop_command(process: subprocess.Popen, how: str) -> None:
    if how == "ctrl-c":
        os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C: every process of the command
    else:
        os.kill(process.pid, signal.SIGTERM)  # `kill`, a CI time-out: the command alone


def exposed_sockets(session_id: int) -> list:
    """The sockets the session's processes listen on beyond loopback, on this machine's network
    (the train stage's, in a private network namespace that holds only loopback, are not)."""
    ours = os.readlink("/proc/self/ns/net")
    pids = [int(line.split()[1]) for line in processes_in_session(session_id)]
    return [found for pid in pids for found in listening_sockets(pid) if not found.loopback and found.netns == ours]


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
