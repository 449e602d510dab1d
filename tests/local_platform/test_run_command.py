"""`make run`: a failed run ends with the failed task's reason to act on, an interrupted one stops
with its processes and is marked failed. A successful one, its summary and its quiet console are
checked with the whole DAG run of tests/e2e/test_dag_local.py."""

from __future__ import annotations

import re
import sqlite3
import time

import pytest

from local_platform import airflow_home, airflow_runner
from local_platform.console import shortened
from tests.local_platform.airflow_commands import (
    processes_in_session,
    run_states,
    start_make_run,
    stop_command,
    wait_for_a_running_stage,
)


@pytest.mark.timeout(900)  # waits up to 600 s for a stage to start, then 150 s for the command to end
@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_ctrl_c_stops_the_run_with_its_spark_processes_and_marks_it_failed(tmp_path, shakespeare_slice, how):
    log = tmp_path / "make-run.log"
    process = start_make_run(tmp_path / "home", shakespeare_slice, log)
    wait_for_a_running_stage(process, log, tmp_path / "home")

    stop_command(process, how)
    assert process.wait(timeout=120) == 130
    output = log.read_text()
    assert "interrupted: the gpt_pipeline run stops here" in output
    (path,) = (tmp_path / "home" / "logs").glob("run-*.log")
    assert output.count(f"full log:         {path}\n") == 2, output  # at the start, and again at the end
    assert "marking as failed 1 run(s) an interrupted command left unfinished" in output
    deadline = time.monotonic() + 30
    while processes_in_session(process.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_in_session(process.pid) == [], "Spark or Airflow processes outlived the command"
    assert run_states(tmp_path / "home") == ["failed"]


@pytest.mark.slow
def test_a_failed_make_run_ends_with_the_stage_error_to_act_on(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(airflow_home, "AIRFLOW_HOME", tmp_path / "home")
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"To be, or not to be\n" * 500 + b"\x00")
    assert airflow_runner.main(["run", "--corpus", str(corpus), f"--set=lake={tmp_path / 'lake'}"]) == 1
    out, err = capfd.readouterr()
    (path,) = (tmp_path / "home" / "logs").glob("run-*.log")
    assert "looks binary" in path.read_text() and "Traceback" in path.read_text() and "Traceback" not in out
    assert re.search(r"^task tokenize +failed +[\d,]+ s$", out, re.MULTILINE), out
    reason = (
        f"stage tokenize failed with exit code 2: corpus file {corpus.as_uri()} looks binary (NUL byte at offset "
        "10000); set data.bad_files=skip to leave such files out"
    )
    assert shortened(f"ERROR tokenize failed: {reason}") in out.splitlines()  # the task's exception, as it fails
    *_, log_line, last = err.rstrip("\n").split("\n")
    assert log_line == f"full log:         {path}"
    assert last == f"ERROR the gpt_pipeline run failed in task tokenize: {reason}"
    with sqlite3.connect(tmp_path / "home" / "airflow.db") as db:
        ((state, tries),) = db.execute("SELECT state, try_number FROM task_instance WHERE task_id = 'tokenize'")
    assert (state, tries) == ("failed", 1), "bad input is not retried"
