"""`make run` and `make airflow` share Airflow's home (a SQLite database): one command at a time,
and no run an interrupted command left behind stays unfinished there; Airflow there reaches the
local S3 whatever this machine's AWS settings."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing

import pytest

from local_platform import airflow_home, airflow_runner
from local_platform.moto_s3 import LocalS3
from pipeline.config import REPO_ROOT
from tests.local_platform.airflow_commands import run_states, start_make_run, wait_for_a_running_stage

HOLD = """
import sys, time
from pathlib import Path
from local_platform.airflow_home import exclusive_home
with exclusive_home(Path(sys.argv[1]), "make airflow"):
    print("holding", flush=True)
    time.sleep(300)
"""


def test_a_second_command_is_refused_while_another_holds_the_home(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(airflow_home, "AIRFLOW_HOME", tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "holding\n"
        assert airflow_runner.main(["run"]) == 2
        error = capsys.readouterr().err
        assert f"ERROR {tmp_path} is in use by `make airflow` (pid {holder.pid})" in error
        assert "trigger runs from its UI" in error
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # A killed holder leaves no stale lock behind (a held lock would raise here).
    with airflow_home.exclusive_home(tmp_path, "make run"):
        assert (tmp_path / "in-use.lock").read_text().startswith("`make run` (pid ")


@pytest.mark.timeout(900)  # waits up to 600 s for a stage to start, then migrates Airflow's database
@pytest.mark.slow
def test_runs_a_killed_command_left_unfinished_are_failed_by_the_next_command(tmp_path, shakespeare_slice):
    home, log = tmp_path / "home", tmp_path / "make-run.log"
    process = start_make_run(home, shakespeare_slice, log)
    wait_for_a_running_stage(process, log, home)
    os.killpg(process.pid, signal.SIGKILL)  # no chance to clean up
    process.wait()
    assert run_states(home) == ["running"]
    left = [path.name for path in (home / "tmp").iterdir()]  # in the home, not in /tmp
    assert any(name.startswith("gpt-pipeline-code-") for name in left), left  # the stage's code, with Spark's folders
    # The same database where the DAG file was removed since: the run's state is set alone.
    dag_gone = tmp_path / "dag-gone"
    dag_gone.mkdir()
    with closing(sqlite3.connect(dag_gone / "airflow.db")) as db:
        with closing(sqlite3.connect(home / "airflow.db")) as source:
            source.backup(db)
        db.execute("DELETE FROM serialized_dag")
        db.commit()

    with LocalS3() as s3:
        for next_home in (home, dag_gone):
            airflow_home.prepare(next_home, s3)  # how `make run` and `make airflow` start
            assert run_states(next_home) == ["failed"], next_home
            assert airflow_home.unfinished_runs(next_home) == []
    assert list((home / "tmp").iterdir()) == [], "the next command starts with an empty scratch folder"


def test_airflow_reaches_the_local_s3_whatever_aws_profile_or_proxy_this_machine_has(tmp_path, monkeypatch):
    """A profile the local commands' /dev/null AWS config cannot hold stopped every run
    (ProfileNotFound); a proxy would carry the loopback traffic away."""
    (tmp_path / "config").write_text("[profile work]\nregion = eu-west-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_PROFILE", "work")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "a-real-session")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("NO_PROXY", "intranet.example")
    monkeypatch.setattr("boto3.DEFAULT_SESSION", None)  # this process's clients read the profile afresh
    with LocalS3(buckets=("gpt-pipeline",)) as s3:
        env = airflow_home.airflow_env(tmp_path / "home", s3)
        assert "AWS_PROFILE" not in env and "AWS_SESSION_TOKEN" not in env
        assert env["NO_PROXY"] == "intranet.example,127.0.0.1,localhost"
        assert s3.client().list_buckets()["Buckets"][0]["Name"] == "gpt-pipeline"
        # A client in Airflow's environment, as the DAG's S3Hook makes one.
        listed = subprocess.run(
            [sys.executable, "-c", "import boto3; print(boto3.client('s3').list_buckets()['Buckets'][0]['Name'])"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert listed.stdout.strip() == "gpt-pipeline", listed.stderr[-2000:]
