"""The alert of a failed task (include/alerts.py) as the DAG sends it: the DAG, target local, run by
Airflow's dag.test() with a setting validate_config refuses, and a moto server's SNS topic as the
deployment's alerts.sns_topic_arn, with an SQS queue subscribed to it that the test reads. (On EMR,
a failed teardown's alert with the cluster and its cost: tests/dags/test_dag_emr.py.)"""

from __future__ import annotations

import runpy

import pytest

from include.airflow_names import DAG_ID
from pipeline.config import REPO_ROOT, ConfigError
from pipeline.config_files import load_config
from tests.alert_topic import AlertTopic
from tests.deployments import deploy

pytestmark = pytest.mark.airflow  # dag.test()

DAG_FILE = REPO_ROOT / "dags" / "gpt_pipeline.py"
# Refused by validate_config, whose error repeats the value: Jinja's braces, which reach the message as they are.
BAD_SETTING = "data.val_split={{ ds }}"
NOT_PUBLISHED = "alert: the task's failure was not published to"


@pytest.fixture
def topic(moto) -> AlertTopic:
    return AlertTopic(moto.endpoint_url)


def run_refused(monkeypatch, tmp_path, alerts: dict):
    """The DAG, deployed with `alerts`, run with a setting validate_config refuses; returns it and its run."""
    deploy(monkeypatch, tmp_path / "pipeline.yaml", {"lake": str(tmp_path / "lake"), "alerts": alerts})
    dag = runpy.run_path(str(DAG_FILE))["dag"]
    dag_run = dag.test(run_conf={"overrides": [BAD_SETTING]})
    validate = dag_run.get_task_instance("validate_config")
    assert (dag_run.state, validate.state, validate.try_number) == ("failed", "failed", 1)
    return dag, dag_run


def refusal() -> str:
    """validate_config's error line, as `make run`'s console shows it."""
    with pytest.raises(ConfigError) as refused:
        load_config(overrides=[BAD_SETTING])
    return f"ConfigError: {refused.value}"


def test_a_failed_task_sends_the_dag_run_task_and_its_error_line_to_the_topic(
    airflow_db, moto, topic, monkeypatch, tmp_path, caplog
):
    dag, dag_run = run_refused(monkeypatch, tmp_path, {"sns_topic_arn": topic.arn})

    (alert,) = topic.received()  # one: the tasks after it never ran (upstream_failed) and send none
    assert alert["Subject"] == f"{DAG_ID}: task validate_config failed"
    message = alert["Message"]
    assert message.startswith(f"{DAG_ID}: task validate_config failed in run {dag_run.run_id}.\n")
    for line in (f"DAG:    {DAG_ID}", f"run:    {dag_run.run_id}", "task:   validate_config"):
        assert f"\n{line}\n" in message
    assert f"\nerror:  {refusal()}\n" in message and "{{ ds }}" in message
    assert "\nreport: none (the run was not collected)\n" in message
    assert "EMR cluster" not in message  # target local
    assert moto.access_key not in message and moto.secret_key not in message
    assert alert_logs(caplog) == [("INFO", f"alert: published to {topic.arn}: {alert['Subject']}")]


def alert_logs(caplog) -> list[tuple[str, str]]:
    """(level, message) of what include/alerts.py logged."""
    return [(record.levelname, record.getMessage()) for record in caplog.records if record.name == "include.alerts"]


def test_without_a_topic_no_task_has_an_alert_and_nothing_is_published(
    airflow_db, moto, topic, monkeypatch, tmp_path, caplog
):
    dag, dag_run = run_refused(monkeypatch, tmp_path, {"sns_topic_arn": None})

    assert all(task.on_failure_callback == [] for task in dag.tasks)
    assert topic.received() == [] and alert_logs(caplog) == []


def test_a_publish_that_fails_logs_a_warning_and_leaves_the_tasks_failure_as_it_was(
    airflow_db, moto, topic, monkeypatch, tmp_path, caplog
):
    """The run and the task failed as they would without the alert (run_refused): state, one try."""
    missing = topic.arn.rpartition(":")[0] + ":no-such-topic"
    run_refused(monkeypatch, tmp_path, {"sns_topic_arn": missing})

    ((level, message),) = alert_logs(caplog)
    assert level == "WARNING" and message.startswith(f"{NOT_PUBLISHED} {missing}: ") and "(NotFound)" in message
    assert topic.received() == []
