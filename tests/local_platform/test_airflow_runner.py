"""`make run` and `make airflow` share Airflow's home (a SQLite database): one command at a time,
and no run an interrupted command left behind stays unfinished there."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

import pytest
import yaml

from local_platform import airflow_runner
from local_platform.moto_s3 import LocalS3
from pipeline import run_folder
from pipeline.config import REPO_ROOT
from pipeline.config_files import DEFAULT_CONFIG_PATH, read_yaml
from pipeline.overrides import apply_overrides
from pipeline.stages import STAGE_NAMES
from tests.listening import listening_sockets

HOLD = """
import sys, time
from pathlib import Path
from local_platform.airflow_runner import exclusive_home
with exclusive_home(Path(sys.argv[1]), "make airflow"):
    print("holding", flush=True)
    time.sleep(300)
"""


def test_a_second_command_is_refused_while_another_holds_the_home(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(airflow_runner, "AIRFLOW_HOME", tmp_path)
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
    with airflow_runner.exclusive_home(tmp_path, "make run"):
        assert (tmp_path / "in-use.lock").read_text().startswith("`make run` (pid ")


@pytest.mark.parametrize("command", ["run", "ui"])
def test_target_emr_is_refused_before_airflow_starts(tmp_path, monkeypatch, capsys, command):
    emr = apply_overrides(read_yaml(DEFAULT_CONFIG_PATH), {"target": "emr", "lake": "s3://gpt-pipeline/lake"})
    (tmp_path / "emr.yaml").write_text(yaml.safe_dump(emr))
    monkeypatch.setenv("GPT_PIPELINE_CONFIG", str(tmp_path / "emr.yaml"))
    monkeypatch.setattr(airflow_runner, "AIRFLOW_HOME", tmp_path / "home")
    assert airflow_runner.main([command]) == 2
    error = capsys.readouterr().err
    assert f"ERROR target: 'emr' (from {tmp_path / 'emr.yaml'}): `make run` and `make airflow` run the DAG" in error
    assert not (tmp_path / "home").exists(), "Airflow's home was touched"


def test_settings_of_the_dag_itself_from_set_are_refused_before_airflow_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(airflow_runner, "AIRFLOW_HOME", tmp_path / "home")
    # The lake is still file://, which the config model would refuse for emr first.
    assert airflow_runner.main(["run", "--set", "target=emr"]) == 2
    assert "ERROR target: 'emr' (from SET): `make run` and `make airflow` run the DAG" in capsys.readouterr().err
    assert airflow_runner.main(["run", "--set", "target=emrr"]) == 2
    assert "target: Input should be 'local' or 'emr' (got 'emrr')" in capsys.readouterr().err
    assert airflow_runner.main(["run", "--set", "schedule=@daily"]) == 2
    assert (
        "ERROR schedule: '@daily' (from SET): the DAG's schedule is read from pipeline.yaml" in capsys.readouterr().err
    )
    assert airflow_runner.main(["run", "--set", "s3.bucket=other-bucket"]) == 2  # the model asset's URI
    assert (
        "ERROR s3.bucket: 'other-bucket' (from SET): the DAG's s3.bucket is read from pipeline.yaml"
        in capsys.readouterr().err
    )
    assert not (tmp_path / "home").exists(), "Airflow's home was touched"


@pytest.mark.parametrize("command", ["run", "ui"])
def test_a_schedule_the_dag_could_not_parse_is_named_before_airflow_starts(tmp_path, monkeypatch, capsys, command):
    bad = apply_overrides(read_yaml(DEFAULT_CONFIG_PATH), {"schedule": "every monday"})
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(bad))
    monkeypatch.setenv("GPT_PIPELINE_CONFIG", str(tmp_path / "pipeline.yaml"))
    monkeypatch.setattr(airflow_runner, "AIRFLOW_HOME", tmp_path / "home")
    assert airflow_runner.main([command]) == 2
    error = capsys.readouterr().err
    assert "ERROR invalid configuration: schedule: " in error
    assert "it takes a cron expression such as '0 3 * * 1' (UTC), a preset such as @daily or @weekly" in error
    assert not (tmp_path / "home").exists(), "Airflow's home was touched"


def test_a_missing_or_too_small_corpus_is_named_before_airflow_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(airflow_runner, "AIRFLOW_HOME", tmp_path / "home")
    assert airflow_runner.main(["run", "--corpus", str(tmp_path / "books" / "*.txt")]) == 2
    assert f"ERROR corpus {(tmp_path / 'books').as_uri()}/*.txt matches no file" in capsys.readouterr().err
    (tmp_path / "note.txt").write_text("Too short for a window.\n")
    assert airflow_runner.main(["run", "--corpus", str(tmp_path / "note.txt")]) == 2
    assert "ERROR the corpus holds 24 bytes, so at most 24 tokens" in capsys.readouterr().err
    assert not (tmp_path / "home").exists(), "Airflow's home was touched"


def test_set_corpus_wins_over_corpus_as_in_the_dag(tmp_path, monkeypatch, capsys):
    """The DAG applies the form's corpus, then its overrides: make run checks the corpus the DAG will read."""
    monkeypatch.setattr(airflow_runner, "AIRFLOW_HOME", tmp_path / "home")
    assert (
        airflow_runner.main(["run", "--corpus", str(tmp_path / "a.txt"), "--set", f"corpus={tmp_path / 'b.txt'}"]) == 2
    )
    assert f"ERROR corpus {(tmp_path / 'b.txt').as_uri()} matches no file" in capsys.readouterr().err


def test_make_airflow_starts_with_a_missing_default_corpus_and_says_so(tmp_path, monkeypatch, capsys):
    """Each run may name its corpus in the trigger form; validate_config checks the one it gets."""
    missing = apply_overrides(read_yaml(DEFAULT_CONFIG_PATH), {"corpus": str(tmp_path / "not-here.txt")})
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(missing))
    monkeypatch.setenv("GPT_PIPELINE_CONFIG", str(tmp_path / "pipeline.yaml"))
    monkeypatch.setattr(airflow_runner, "AIRFLOW_HOME", tmp_path / "home")
    started = []
    monkeypatch.setattr(airflow_runner, "ui", lambda config: started.append(config.corpus) or 0)
    assert airflow_runner.main(["ui"]) == 0
    assert started == [[(tmp_path / "not-here.txt").as_uri()]]
    assert f"WARNING corpus {(tmp_path / 'not-here.txt').as_uri()} matches no file: a run needs another corpus" in (
        capsys.readouterr().err
    )
    assert airflow_runner.main(["run"]) == 2, "make run still stops on it"
    assert not (tmp_path / "home").exists(), "Airflow's home was touched"


@pytest.mark.parametrize("command", ["run", "ui"])
def test_a_corpus_on_s3_is_refused_since_the_local_s3_starts_empty(tmp_path, monkeypatch, capsys, command):
    monkeypatch.setattr(airflow_runner, "AIRFLOW_HOME", tmp_path / "home")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")  # were S3 asked, it would fail otherwise
    assert airflow_runner.main([command, "--corpus", "s3://books/*.txt"]) == 2
    error = capsys.readouterr().err
    assert "ERROR corpus s3://books/*.txt: the S3 of `make run` and `make airflow` is a moto server" in error
    assert not (tmp_path / "home").exists(), "Airflow's home was touched"


def test_set_from_the_environment_is_split_as_a_shell_would_into_settings(monkeypatch, capsys, tmp_path):
    """make run's SET: one word per setting, as --set options give them, before the command line's --set."""
    monkeypatch.setattr(airflow_runner, "AIRFLOW_HOME", tmp_path / "home")
    monkeypatch.setenv("MY_SET", "generate.prompt='To be or not' train.max_steps=3")
    assert airflow_runner.main(["run", "--set-from-env", "MY_SET", "--set", "train.max_steps=0"]) == 2
    assert "ERROR invalid configuration: train.max_steps: Input should be greater than or equal to 1" in (
        capsys.readouterr().err
    )
    assert airflow_runner.split_overrides("generate.prompt='To be' lake='/a #2' x=$5") == [
        "generate.prompt=To be",
        "lake=/a #2",
        "x=$5",
    ]
    with pytest.raises(SystemExit):
        airflow_runner.parse_args(["--help"])
    assert "--set-from-env" not in capsys.readouterr().out, "make's own way in is not the command's interface"
    assert not (tmp_path / "home").exists(), "Airflow's home was touched"


def make_run(tmp_path, **variables) -> subprocess.CompletedProcess:
    """`make run NAME=value …` as typed in a shell, the values exactly as given; in this test's
    environment, which make must not rebuild (-o venv) while the tests run in it."""
    env = {**os.environ, "GPT_PIPELINE_AIRFLOW_HOME": str(tmp_path / "home")}
    make = ["make", "--no-print-directory", "-o", "venv", f"VENV={sys.prefix}", "run"]
    return subprocess.run(
        [*make, *(f"{name}={value}" for name, value in variables.items())],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_make_run_takes_quotes_spaces_hashes_and_dollars_in_corpus_and_set(tmp_path):
    books = tmp_path / "O'Brien #1"
    # A quoted value with spaces is one override: the error is the next one's, not "'be' is not of the form".
    done = make_run(tmp_path, CORPUS=f"{books}/*.txt", SET="generate.prompt='To be or not' train.max_steps=0")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "ERROR invalid configuration: train.max_steps: Input should be greater than or equal to 1" in done.stderr
    done = make_run(tmp_path, CORPUS=f"{books}/*.txt", SET="generate.prompt=\"O'er the hill\" lake='/data/my lake #2'")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"ERROR corpus file://{books}/*.txt matches no file" in done.stderr
    # A `$` is text too: make neither expands it nor runs a $(shell …) in it.
    done = make_run(
        tmp_path, CORPUS=f"{tmp_path}/$books/*.txt", SET="generate.prompt='$(shell echo run) $5' train.max_steps=0"
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "train.max_steps: Input should be greater than or equal to 1" in done.stderr
    done = make_run(tmp_path, CORPUS=f"{tmp_path}/$books/*.txt")
    assert f"ERROR corpus file://{tmp_path}/$books/*.txt matches no file" in done.stderr
    done = make_run(tmp_path, SET="generate.prompt=O'er")
    assert done.returncode == 2, done.stdout + done.stderr
    assert 'ERROR SET "generate.prompt=O\'er": No closing quotation; put a value holding a quote in' in done.stderr
    assert not (tmp_path / "home").exists(), "Airflow's home was touched"


def test_a_taken_ui_port_is_named_before_airflow_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(airflow_runner, "AIRFLOW_HOME", tmp_path / "home")
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
    airflow_runner.check_port_free("127.0.0.1", str(port))


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


def exposed_sockets(session_id: int) -> list:
    """The sockets the session's processes listen on beyond loopback, on this machine's network
    (the train stage's, in a private network namespace that holds only loopback, are not)."""
    ours = os.readlink("/proc/self/ns/net")
    pids = [int(line.split()[1]) for line in processes_in_session(session_id)]
    return [found for pid in pids for found in listening_sockets(pid) if not found.loopback and found.netns == ours]


def run_states(home: Path) -> list[str]:
    with sqlite3.connect(home / "airflow.db") as db:
        return [state for (state,) in db.execute("SELECT state FROM dag_run ORDER BY id")]


def stop_command(process: subprocess.Popen, how: str) -> None:
    if how == "ctrl-c":
        os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C: every process of the command
    else:
        os.kill(process.pid, signal.SIGTERM)  # `kill`, a CI time-out: the command alone


@pytest.mark.slow
@pytest.mark.timeout(900)  # waits up to 600 s for a stage to start, then 150 s for the command to end
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
@pytest.mark.timeout(900)  # waits up to 600 s for a stage to start, then migrates Airflow's database
@pytest.mark.parametrize("dag_serialized", [True, False], ids=["dag", "dag-gone"])
def test_runs_a_killed_command_left_unfinished_are_failed_by_the_next_command(
    tmp_path, shakespeare_slice, dag_serialized
):
    home, log = tmp_path / "home", tmp_path / "make-run.log"
    process = start_make_run(home, shakespeare_slice, log)
    wait_for_a_running_stage(process, log, home)
    os.killpg(process.pid, signal.SIGKILL)  # no chance to clean up
    process.wait()
    assert run_states(home) == ["running"]
    left = [path.name for path in (home / "tmp").iterdir()]  # in the home, not in /tmp
    assert any(name.startswith("gpt-pipeline-code-") for name in left), left  # the stage's code, with Spark's folders
    if not dag_serialized:  # e.g. the DAG file was removed since: the run's state is set alone
        with sqlite3.connect(home / "airflow.db") as db:
            db.execute("DELETE FROM serialized_dag")

    with LocalS3() as s3:
        airflow_runner.prepare(home, s3)  # how `make run` and `make airflow` start
    assert run_states(home) == ["failed"]
    assert airflow_runner.unfinished_runs(home) == []
    assert list((home / "tmp").iterdir()) == [], "the next command starts with an empty scratch folder"


def test_every_local_s3_starts_empty():
    """moto keeps state per process: a second server must not show the first one's buckets."""
    with LocalS3(buckets=("gpt-pipeline",)) as s3:
        s3.client().put_object(Bucket="gpt-pipeline", Key="runs/a/report.json", Body=b"{}")
    with LocalS3() as s3:
        assert s3.client().list_buckets()["Buckets"] == []


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
        command = [str(airflow_runner.AIRFLOW), "dags", "trigger", airflow_runner.DAG_ID, "--conf", json.dumps(conf)]
        done = subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True)
        if done.returncode == 0:
            return
        assert time.monotonic() < deadline, f"the DAG could not be triggered:\n{done.stderr[-2000:]}"
        time.sleep(5)


@pytest.mark.slow
@pytest.mark.timeout(1500)  # up to 600 s to trigger, 600 s for a stage to start, then the shutdown's grace
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
        assert process.wait(timeout=airflow_runner.STANDALONE_GRACE_S + 60) == 0
        deadline = time.monotonic() + 30
        while processes_in_session(process.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert processes_in_session(process.pid) == [], "Airflow or Spark processes outlived `make airflow`"
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def test_the_run_summary_rounds_the_losses_and_offers_more_samples_of_the_runs_prompt(capsys, tmp_path):
    folder = tmp_path / "lake" / run_folder.RUNS_FOLDER / "r"
    folder.mkdir(parents=True)
    (folder / run_folder.CONFIG_FILE).write_text(json.dumps({"generate": {"prompt": "Ἀχιλῆος, he said"}}))
    report = {
        "run_folder": folder.as_uri(),
        "s3_uri": "s3://b/runs/r/",
        "final_val_loss": 4.378682374954224,
        "val_nats_per_char": 1.7099787123061774,
        "warnings": ["a file is short"],
        "sample": "ROMEO: hark",
    }
    airflow_runner.print_report(report, "s3://b/runs/latest/r.json", {"model": "s3://b/runs/r/model/"}, ["r-1", "r-0"])
    out = capsys.readouterr().out
    assert (
        "keep_runs:        removed 2 older run folder(s), their only copy (the S3 records of earlier make runs "
        "ended with them): r-0, r-1\n" in out
    )
    assert (
        f"run folder:       {folder.as_uri()}\nreport:           {folder.as_uri()}/report.md\n"
        f"report page:      {folder.as_uri()}/report.html\n" in out
    )
    assert "final val loss:   4.3787 nats/token\nval nats/char:    1.7100\nwarning:          a file is short\n" in out
    assert "generated sample:\nROMEO: hark\n" in out
    assert out.endswith(
        f"more samples:     .venv/bin/python -m spark_jobs.generate --model-dir {folder}/model "
        "--prompt 'Ἀχιλῆος, he said'\n"
    )


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
        env = airflow_runner.airflow_env(tmp_path / "home", s3)
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


@pytest.mark.slow
@pytest.mark.timeout(1200)  # a whole DAG run, as tests/e2e/test_dag_local.py's, with no limit of its own
def test_make_run_runs_the_dag_and_prints_where_the_outputs_are(tmp_path, shakespeare_slice, monkeypatch, capfd):
    """The README's first command (its Python part), on a slice and small settings."""
    from tests.e2e.test_dag_local import SMALL_RUN

    monkeypatch.setattr(airflow_runner, "AIRFLOW_HOME", tmp_path / "home")
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
    monkeypatch.setattr(airflow_runner, "AIRFLOW_HOME", tmp_path / "home")
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"To be, or not to be\n" * 500 + b"\x00")
    assert airflow_runner.main(["run", "--corpus", str(corpus), f"--set=lake={tmp_path / 'lake'}"]) == 1
    out, err = capfd.readouterr()
    (path,) = (tmp_path / "home" / "logs").glob("run-*.log")
    assert "looks binary" in path.read_text() and "Traceback" in path.read_text() and "Traceback" not in out
    assert re.search(r"^task tokenize +failed +[\d,]+ s$", out, re.MULTILINE), out
    *_, log_line, last = err.rstrip("\n").split("\n")
    assert log_line == f"full log:         {path}"
    assert last == (
        f"ERROR the gpt_pipeline run failed in stage tokenize: corpus file {corpus.as_uri()} looks binary (NUL byte at "
        "offset 10000); set data.bad_files=skip to leave such files out"
    )
