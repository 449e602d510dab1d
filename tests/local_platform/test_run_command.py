"""`make run`: the DAG once, with the quiet console and the summary; a failed run ends with the
failed task's reason to act on, an interrupted one stops with its processes and is marked failed."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from local_platform import airflow_home, airflow_runner
from local_platform.console import shortened
from pipeline import run_folder
from pipeline.stages import STAGE_NAMES
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


@pytest.mark.timeout(1200)  # a whole DAG run, as tests/e2e/test_dag_local.py's, with no limit of its own
@pytest.mark.slow
def test_make_run_runs_the_dag_and_prints_where_the_outputs_are(tmp_path, shakespeare_slice, monkeypatch, capfd):
    """The README's first command (its Python part), on a slice and small settings."""
    from tests.e2e.test_dag_local import SMALL_RUN

    monkeypatch.setattr(airflow_home, "AIRFLOW_HOME", tmp_path / "home")
    older = tmp_path / "lake" / run_folder.RUNS_FOLDER / "slice-older"  # a run of the same name that collect finished
    older.mkdir(parents=True)
    (older / run_folder.REPORT_JSON).write_text(
        json.dumps({"run": "slice-older", "collected_at": "2026-01-01T00:00:00Z"})
    )
    (older / run_folder.CONFIG_FILE).write_text(
        json.dumps({"run_name": "slice", "corpus": [f"file://{shakespeare_slice}"]})
    )
    settings = [f"lake={tmp_path / 'lake'}", "keep_runs=1", *SMALL_RUN]
    assert (
        airflow_runner.main(["run", "--corpus", str(shakespeare_slice), *(f"--set={item}" for item in settings)]) == 0
    )
    out = capfd.readouterr().out
    (run_path,) = (tmp_path / "lake" / run_folder.RUNS_FOLDER).iterdir()
    assert f"run folder:       {run_path.as_uri()}\n" in out and (run_path / run_folder.REPORT_TEXT).is_file()
    report = json.loads((run_path / run_folder.REPORT_JSON).read_text())
    assert f"val nats/char:    {report['val_nats_per_char']:.4f}\n" in out
    assert f"latest model:     s3://gpt-pipeline/runs/latest/slice.json -> {report['s3_uri']}model/\n" in out
    assert "keep_runs:        removed 1 older run folder(s)" in out and "slice-older" in out
    assert f"generated sample:\n{report['sample']}" in out
    assert list((tmp_path / "home" / "tmp").iterdir()) == [], "the command's temporary files went with it"
    check_the_quiet_console(out, tmp_path / "home")


def check_the_quiet_console(out: str, home: Path) -> None:
    """One line as each task starts and one as it ends, the training progress, the summary; all
    of Airflow's, Spark's and TensorFlow's output in the full log, whose path comes first."""
    (path,) = (home / "logs").glob("run-*.log")
    assert out.startswith(f"full log:         {path}\n"), out[:2000]
    tasks = ["validate_config", *STAGE_NAMES, "collect", "promote", "prune_runs"]
    for task in tasks:
        assert len(re.findall(rf"^task {task} +started$", out, re.MULTILINE)) == 1, out
        assert len(re.findall(rf"^task {task} +success +[\d,]+ s$", out, re.MULTILINE)) == 1, out
    assert len(re.findall(r"^task ", out, re.MULTILINE)) == 2 * len(tasks)
    progress = re.findall(r"^\[train\] step \d+/\d+ loss .*$", out, re.MULTILINE)
    assert progress, out
    # The run's lines; the summary after them names paths, as long as the machine's paths are.
    assert max(len(line) for line in out.split("\nrun folder:")[0].splitlines()) <= 200, out
    assert "Running Spark version" not in out and "Running Spark version" in path.read_text()
    assert all(line in path.read_text() for line in progress)
    assert len(path.read_text().splitlines()) > 3 * len(out.splitlines())


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
