"""The command line of `make run` and `make airflow`: what a run could not do is named before
Airflow starts, and make's CORPUS and SET reach the command as typed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from local_platform import airflow_home, airflow_runner, deployment_file, run_command, standalone
from pipeline import deployment
from pipeline.config import REPO_ROOT
from pipeline.config_files import DEFAULT_CONFIG_PATH, load_config, read_yaml
from tests.deployments import deploy


@pytest.mark.parametrize("command", ["run", "ui"])
def test_target_emr_is_refused_before_airflow_starts(tmp_path, monkeypatch, capsys, command):
    deploy(monkeypatch, tmp_path / "emr.yaml", {"target": "emr", "lake": "s3://gpt-pipeline/lake"})
    monkeypatch.setattr(airflow_home, "AIRFLOW_HOME", tmp_path / "home")
    assert airflow_runner.main([command]) == 2
    error = capsys.readouterr().err
    assert f"ERROR target: 'emr' (from {tmp_path / 'emr.yaml'}): `make run` and `make airflow` run the DAG" in error
    assert not (tmp_path / "home").exists(), "Airflow's home was touched"


def test_target_emr_or_a_bad_setting_from_set_is_refused_before_airflow_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(airflow_home, "AIRFLOW_HOME", tmp_path / "home")
    # The lake is still file://, which the config model would refuse for emr first.
    assert airflow_runner.main(["run", "--set", "target=emr"]) == 2
    assert "ERROR target: 'emr' (from SET): `make run` and `make airflow` run the DAG" in capsys.readouterr().err
    assert airflow_runner.main(["run", "--set", "target=emrr"]) == 2
    assert "target: Input should be 'local' or 'emr' (got 'emrr')" in capsys.readouterr().err
    assert airflow_runner.main(["run", "--set", "data.stride=0"]) == 2
    assert "ERROR invalid configuration: data.stride: Input should be greater than or equal to 1" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "home").exists(), "Airflow's home was touched"


def test_make_runs_corpus_and_deployment_settings_become_the_dags_own(tmp_path, monkeypatch, shakespeare_slice):
    """The one running `make run` is the deployer: its CORPUS and the deployment settings of its SET go
    into the deployment's file the DAG reads, where validate_config takes them as the deployment's; the
    run settings stay the run's, which the form and the report show as changed."""
    started = []
    monkeypatch.setattr(run_command, "run", lambda *args: started.append(args) or 0)
    settings = ["schedule=@daily", "s3.bucket=other-bucket", f"lake={tmp_path / 'lake'}", "train.max_steps=5"]
    assert (
        airflow_runner.main(["run", "--corpus", str(shakespeare_slice), *(f"--set={item}" for item in settings)]) == 0
    )
    ((config, corpus, deployers, runs, _),) = started
    assert (corpus, deployers, runs) == (str(shakespeare_slice), settings[:3], ["train.max_steps=5"])

    written = deployment_file.write(tmp_path / "deployment.yaml", read_yaml(DEFAULT_CONFIG_PATH), corpus, deployers)
    deployed = load_config(written)
    assert (deployed.schedule, deployed.s3.bucket, deployed.lake) == ("@daily", "other-bucket", config.lake)
    assert deployed.corpus == [shakespeare_slice.as_uri()]  # outside corpus_roots: the deployer's own corpus
    run = load_config(written, runs)
    deployment.check_overrides(runs, read_yaml(written), written.name)
    deployment.check_run_settings(deployed, run, written.name)
    assert json.loads(run.to_json()) == json.loads(config.to_json())


@pytest.mark.parametrize("command", ["run", "ui"])
def test_a_schedule_the_dag_could_not_parse_is_named_before_airflow_starts(tmp_path, monkeypatch, capsys, command):
    deploy(monkeypatch, tmp_path / "pipeline.yaml", {"schedule": "every monday"})
    monkeypatch.setattr(airflow_home, "AIRFLOW_HOME", tmp_path / "home")
    assert airflow_runner.main([command]) == 2
    error = capsys.readouterr().err
    assert "ERROR invalid configuration: schedule: " in error
    assert "it takes a cron expression such as '0 3 * * 1' (UTC), a preset such as @daily or @weekly" in error
    assert not (tmp_path / "home").exists(), "Airflow's home was touched"


def test_a_missing_or_too_small_corpus_is_named_before_airflow_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(airflow_home, "AIRFLOW_HOME", tmp_path / "home")
    assert airflow_runner.main(["run", "--corpus", str(tmp_path / "books" / "*.txt")]) == 2
    assert f"ERROR corpus {(tmp_path / 'books').as_uri()}/*.txt matches no file" in capsys.readouterr().err
    (tmp_path / "note.txt").write_text("Too short for a window.\n")
    assert airflow_runner.main(["run", "--corpus", str(tmp_path / "note.txt")]) == 2
    assert "ERROR the corpus holds 24 bytes, so at most 24 tokens" in capsys.readouterr().err
    assert not (tmp_path / "home").exists(), "Airflow's home was touched"


def test_set_corpus_wins_over_corpus_as_in_the_dag(tmp_path, monkeypatch, capsys):
    """The DAG applies the form's corpus, then its overrides: make run checks the corpus the DAG will read."""
    monkeypatch.setattr(airflow_home, "AIRFLOW_HOME", tmp_path / "home")
    assert (
        airflow_runner.main(["run", "--corpus", str(tmp_path / "a.txt"), "--set", f"corpus={tmp_path / 'b.txt'}"]) == 2
    )
    assert f"ERROR corpus {(tmp_path / 'b.txt').as_uri()} matches no file" in capsys.readouterr().err


def test_make_airflow_starts_with_a_missing_default_corpus_and_says_so(tmp_path, monkeypatch, capsys):
    """Each run may name its corpus in the trigger form; validate_config checks the one it gets."""
    deploy(monkeypatch, tmp_path / "pipeline.yaml", {"corpus": str(tmp_path / "not-here.txt")})
    monkeypatch.setattr(airflow_home, "AIRFLOW_HOME", tmp_path / "home")
    started = []
    monkeypatch.setattr(standalone, "ui", lambda config: started.append(config.corpus) or 0)
    assert airflow_runner.main(["ui"]) == 0
    assert started == [[(tmp_path / "not-here.txt").as_uri()]]
    assert f"WARNING corpus {(tmp_path / 'not-here.txt').as_uri()} matches no file: a run needs another corpus" in (
        capsys.readouterr().err
    )
    assert airflow_runner.main(["run"]) == 2, "make run still stops on it"
    assert not (tmp_path / "home").exists(), "Airflow's home was touched"


@pytest.mark.parametrize("command", ["run", "ui"])
def test_a_corpus_on_s3_is_refused_since_the_local_s3_starts_empty(tmp_path, monkeypatch, capsys, command):
    monkeypatch.setattr(airflow_home, "AIRFLOW_HOME", tmp_path / "home")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")  # were S3 asked, it would fail otherwise
    assert airflow_runner.main([command, "--corpus", "s3://books/*.txt"]) == 2
    error = capsys.readouterr().err
    assert "ERROR corpus s3://books/*.txt: the S3 of `make run` and `make airflow` is a moto server" in error
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
