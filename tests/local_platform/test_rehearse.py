"""`make rehearse`'s config: pipeline.yaml with target emr and everything on the moto server's
bucket, which the emr target's own checks accept (no Airflow, no Spark here)."""

from __future__ import annotations

import shutil
import sys

import pytest

from include import emr_checks, emr_cost, emr_steps, loopback_only
from local_platform.rehearsal import rehearse
from local_platform.rehearsal.rehearse import Rehearsal, main
from pipeline import deployment, disk_room
from pipeline.config_files import read_yaml
from pipeline.errors import PipelineError
from spark_jobs.training import memory


@pytest.fixture
def rehearsal(shakespeare_slice, tmp_path):
    made = Rehearsal([str(shakespeare_slice)], ["train.max_steps=100"], home=tmp_path / "airflow")
    yield made
    shutil.rmtree(made.folder, ignore_errors=True)


def test_the_rehearsal_runs_the_emr_target_with_its_corpus_lake_code_and_logs_on_the_moto_bucket(rehearsal):
    config, bucket = rehearsal.config, rehearsal.config.s3.bucket
    assert config.target == "emr" and bucket == rehearse.BUCKET
    assert config.corpus == [f"s3://{bucket}/corpus/slice.txt"]
    assert config.lake == f"s3://{bucket}/lake"
    assert config.emr.log_uri.startswith(f"s3://{bucket}/") and config.emr.code_prefix.startswith(f"s3://{bucket}/")
    assert config.train.max_steps == 100 and rehearsal.dag_config.train.max_steps != 100  # SET is the run's


def test_the_deployment_settings_of_set_are_the_rehearsed_dags_own_and_the_rest_the_runs(shakespeare_slice, tmp_path):
    settings = ["emr.core_instance_count=3", "local.allow_exposed_workers=true", "train.max_steps=100"]
    made = Rehearsal([str(shakespeare_slice)], settings, home=tmp_path / "airflow")
    try:
        assert made.dag_config.emr.core_instance_count == 3 and made.dag_config.local.allow_exposed_workers
        assert made.run_overrides == ["train.max_steps=100"]
        deployment.check_overrides(made.run_overrides, read_yaml(made.defaults_path), made.defaults_path.name)
        deployment.check_run_settings(made.dag_config, made.config, made.defaults_path.name)
    finally:
        shutil.rmtree(made.folder, ignore_errors=True)


def test_the_emr_targets_checks_accept_the_rehearsals_config(rehearsal):
    config = rehearsal.config
    emr_steps.check_sensor_limits(config, rehearsal.dag_config)
    emr_cost.check_budget(config, rehearsal.dag_config)
    memory.check_training_fits(config, emr_steps.train_executor_memory_mb(config)[1], "a core node")
    disk_room.check_core_node_room(config, {config.corpus[0]: 60_000})
    emr_checks.check_own_buckets(emr_checks.bucket_settings(config))
    emr_checks.check_subnet(config)


def test_a_corpus_on_s3_is_refused_with_a_clear_message(capsys):
    assert main(["--corpus", "s3://somewhere/books/"]) == 2
    assert "the rehearsal uploads a local corpus" in capsys.readouterr().err


def test_the_rehearsal_starts_again_in_a_private_network_namespace(monkeypatch):
    monkeypatch.setattr(loopback_only, "unavailable_reason", lambda: None)
    started = []
    monkeypatch.setattr(rehearse.os, "execv", lambda path, argv: started.append(argv))
    rehearse.contain_or_accept_exposure([], ["--corpus", "a.txt"])
    assert started == [
        loopback_only.contained([sys.executable, "-m", "local_platform.rehearsal.rehearse", "--corpus", "a.txt"])
    ]


def test_without_namespaces_the_rehearsal_stops_unless_the_run_accepts_the_exposure(monkeypatch, capsys):
    monkeypatch.setattr(loopback_only, "unavailable_reason", lambda: "no user namespaces here")
    with pytest.raises(PipelineError, match=r"\(no user namespaces here\).*local.allow_exposed_workers=true"):
        rehearse.contain_or_accept_exposure(["train.max_steps=5"], [])
    rehearse.contain_or_accept_exposure(["local.allow_exposed_workers=true"], [])
    assert "TensorFlow workers listen on every interface" in capsys.readouterr().err


def test_a_bad_setting_or_corpus_is_named_before_airflow_starts(tmp_path, shakespeare_slice, monkeypatch, capsys):
    monkeypatch.setattr(loopback_only, "interfaces", lambda: [loopback_only.LOOPBACK_INTERFACE])  # no namespace
    monkeypatch.setattr(rehearse.airflow_home, "AIRFLOW_HOME", tmp_path / "home")
    assert main(["--corpus", str(shakespeare_slice), "--set", "data.stride=0"]) == 2
    assert "ERROR invalid configuration: data.stride: Input should be greater than or equal to 1" in (
        capsys.readouterr().err
    )
    assert main(["--corpus", str(tmp_path / "missing" / "*.txt")]) == 2
    assert f"ERROR corpus {(tmp_path / 'missing').as_uri()}/*.txt matches no file" in capsys.readouterr().err
    assert not (tmp_path / "home").exists(), "Airflow's home was touched"
