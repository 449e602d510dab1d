"""The alert's message (include/alerts.py) from what a failed task's callback finds; the DAG sending
it to an SNS topic: tests/dags/test_dag_alerts.py and tests/dags/test_dag_emr.py."""

from __future__ import annotations

from airflow.sdk.exceptions import AirflowFailException

from include.alerts import (
    ERROR_CHARS,
    NO_EXCEPTION,
    ClusterCost,
    Failure,
    FailureAlert,
    alert_message,
    alert_subject,
    error_line,
    failure_callbacks,
    report_uri,
)
from include.local_spark import StageFailed
from pipeline.config_files import load_config

RUN_ID = "manual__2026-11-27T12:00:00+00:00"
REPORT = "s3://my-records/runs/books-manual__2026-11-27T12_00_00_00_00-1a2b3c4d/report.html"
BASIS = "on-demand prices of us-east-1 as of 2026-11-22"


def failure(**changes) -> Failure:
    fields = {"dag_id": "gpt_pipeline", "run_id": RUN_ID, "task_id": "train", "error": "ConfigError: data.stride: 0"}
    return Failure(**fields | changes)


def test_the_message_names_the_dag_the_run_the_task_its_error_and_the_report():
    assert alert_subject(failure(report=REPORT)) == "gpt_pipeline: task train failed"
    assert alert_message(failure(report=REPORT)) == (
        f"gpt_pipeline: task train failed in run {RUN_ID}.\n"
        "\n"
        "DAG:    gpt_pipeline\n"
        f"run:    {RUN_ID}\n"
        "task:   train\n"
        "error:  ConfigError: data.stride: 0\n"
        f"report: {REPORT}\n"
    )
    assert "\nreport: none (the run was not collected)\n" in alert_message(failure())


def test_on_emr_the_message_names_the_cluster_and_its_cost_so_far():
    costed = failure(cluster=ClusterCost("j-2AXXXXXXGAPLF", 1234.567, 12.3456, BASIS))
    assert alert_message(costed).endswith(
        f"\nEMR cluster: j-2AXXXXXXGAPLF, about $1,234.57 so far (12.35 hours at {BASIS})\n"
    )
    unknown = alert_message(failure(cluster=ClusterCost("j-2AXXXXXXGAPLF")))
    assert "\nEMR cluster: j-2AXXXXXXGAPLF, its cost so far unknown (see the task's log)\n" in unknown
    none = alert_message(failure(task_id="create_cluster", cluster=ClusterCost(None)))
    assert "\nEMR cluster: none (create_cluster left no cluster id)\n" in none


def test_a_failed_teardown_says_the_cluster_may_still_be_running_and_how_to_end_it():
    ended = failure(task_id="terminate_cluster", ends_clusters=True, cluster=ClusterCost("j-2AXXXXXXGAPLF", 3.0, 1.0))
    assert alert_subject(ended) == "gpt_pipeline: teardown terminate_cluster failed"
    assert alert_message(ended).endswith(
        "\n\nThe run's EMR cluster may still be running, and costing: find it in the EMR console by its run_id tag, "
        "and terminate it there or with `aws emr terminate-clusters --cluster-ids j-2AXXXXXXGAPLF`.\n"
    )
    orphaned = failure(task_id="end_orphaned_clusters", ends_clusters=True, cluster=ClusterCost(None))
    assert "--cluster-ids <the clusters tagged with the run>`." in alert_message(orphaned)


def test_the_subject_is_one_line_of_ascii_under_the_100_characters_sns_takes():
    subject = alert_subject(failure(task_id="end_orphaned_clusters", ends_clusters=True))
    assert subject.isascii() and "\n" not in subject and len(subject) < 100


def test_the_error_line_is_the_tasks_own_and_an_endless_one_is_cut():
    stage = StageFailed("tokenize", 2, ["spark-submit"], "corpus file x.txt is empty")
    try:
        raise AirflowFailException(str(stage)) from stage
    except AirflowFailException as error:  # as the task raised it, with its traceback
        assert error_line(error) == "stage tokenize failed with exit code 2: corpus file x.txt is empty"
    assert error_line(None) == NO_EXCEPTION
    assert error_line("Task received SIGTERM signal") == "Task received SIGTERM signal"
    endless = alert_message(failure(error="x" * (2 * ERROR_CHARS)))
    assert f"\nerror:  {'x' * (ERROR_CHARS - 1)}…\n" in endless


def test_the_report_is_report_html_in_the_record_collect_wrote():
    record = REPORT.removesuffix("report.html")
    assert report_uri({"s3_uri": record, "final_val_loss": 1.5}) == REPORT
    assert report_uri(None) is None  # collect has not run


def test_every_task_alerts_once_a_topic_is_set_and_none_does_without():
    assert failure_callbacks(load_config()) == []
    topic = {"alerts": {"sns_topic_arn": "arn:aws:sns:eu-west-1:123456789012:gpt-pipeline-alerts"}}
    (alert,) = failure_callbacks(load_config(overrides=[topic]))
    assert isinstance(alert, FailureAlert) and alert.config.alerts.topic_region() == "eu-west-1"
