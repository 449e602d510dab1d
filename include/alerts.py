"""Alerts: a task of a run that fails publishes a message to the deployment's SNS topic
(alerts.sns_topic_arn) through the amazon provider's SnsNotifier; with no topic, nothing is sent.

The alert is every task's on_failure_callback (the DAG's default_args). Airflow runs it where the
task ran, once its last try has failed, with the exception in the context: a try that is retried,
a task Airflow never ran (upstream_failed) or one marked failed by hand sends none. A DAG-level
callback would miss what matters most here: it has no exception, and a teardown task's failure
does not fail the run unless the teardown says so. So the EMR teardowns (terminate_cluster,
end_orphaned_clusters) alert as every task does, and their message says the cluster may still be up.

The message (alert_message, from a Failure) names the DAG, the run and the task, the task's own
error line as `make run`'s console shows it (include/tracebacks.py), the report in the run's S3
record once collect has run, and on EMR the cluster with its cost so far. It holds no credentials:
the report is its s3:// URI, never a presigned link.

A publish that fails (the topic gone, no sns:Publish, SNS out of reach) is logged as a warning:
the task's failure stays as it was.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from airflow.providers.amazon.aws.notifications.sns import SnsNotifier

from include import emr_cost, emr_tasks
from include.tracebacks import exception_line
from pipeline import run_folder
from pipeline.config import PipelineConfig
from pipeline.errors import cut

log = logging.getLogger(__name__)

# The DAG's tasks whose XComs an alert reads: collect's report and create_cluster's cluster id.
COLLECT_TASK, CREATE_CLUSTER_TASK = "collect", "create_cluster"
ERROR_CHARS = 4_000  # of the error line: an email's worth, far below SNS's 256 KB
NO_EXCEPTION = "none recorded (the task was stopped, or its worker lost): see the task's log"


@dataclass(frozen=True)
class ClusterCost:
    """The run's EMR cluster: its id (None: create_cluster left none) and its cost so far (None: unknown)."""

    cluster_id: str | None
    cost_usd: float | None = None
    hours: float | None = None
    basis: str = ""


@dataclass(frozen=True)
class Failure:
    """What an alert tells of a failed task."""

    dag_id: str
    run_id: str
    task_id: str
    error: str  # the task's own error line
    report: str | None = None  # the run's report.html on S3, once collect has run
    cluster: ClusterCost | None = None  # target emr only
    ends_clusters: bool = False  # a teardown that terminates the run's clusters: they may still be running


def alert_subject(failure: Failure) -> str:
    """The subject: ASCII and under 100 characters, as SNS takes it (Airflow's ids are ASCII)."""
    kind = "teardown" if failure.ends_clusters else "task"
    return f"{failure.dag_id}: {kind} {failure.task_id} failed"


def alert_message(failure: Failure) -> str:
    lines = [
        f"{alert_subject(failure)} in run {failure.run_id}.",
        "",
        f"DAG:    {failure.dag_id}",
        f"run:    {failure.run_id}",
        f"task:   {failure.task_id}",
        f"error:  {cut(failure.error, ERROR_CHARS)}",
        f"report: {failure.report or 'none (the run was not collected)'}",
    ]
    if failure.cluster is not None:
        lines.append(f"EMR cluster: {cluster_line(failure.cluster)}")
    if failure.ends_clusters:
        lines += ["", teardown_advice(failure.cluster)]
    return "\n".join(lines) + "\n"


def cluster_line(cluster: ClusterCost) -> str:
    if cluster.cluster_id is None:
        return "none (create_cluster left no cluster id)"
    if cluster.cost_usd is None:
        return f"{cluster.cluster_id}, its cost so far unknown (see the task's log)"
    return (
        f"{cluster.cluster_id}, about ${cluster.cost_usd:,.2f} so far ({cluster.hours:,.2f} hours at {cluster.basis})"
    )


def teardown_advice(cluster: ClusterCost | None) -> str:
    cluster_ids = cluster.cluster_id if cluster and cluster.cluster_id else "<the clusters tagged with the run>"
    return (
        "The run's EMR cluster may still be running, and costing: find it in the EMR console by its run_id tag, "
        f"and terminate it there or with `aws emr terminate-clusters --cluster-ids {cluster_ids}`."
    )


def failure_of(context, config: PipelineConfig) -> Failure:
    """The Failure of a failed task's callback context. `config` is the DAG's: its emr section, the
    deployment's, is every run's."""
    ti = context["ti"]
    on_emr = config.target == "emr"
    return Failure(
        dag_id=ti.dag_id,
        run_id=ti.run_id,
        task_id=ti.task_id,
        error=error_line(context.get("exception")),
        report=report_uri(ti.xcom_pull(task_ids=COLLECT_TASK)),
        cluster=cluster_cost(ti.xcom_pull(task_ids=CREATE_CLUSTER_TASK), config) if on_emr else None,
        ends_clusters=isinstance(context.get("task"), emr_tasks.EmrTerminateRunClustersOperator),
    )


def error_line(exception: BaseException | str | None) -> str:
    if exception is None:  # a task whose worker was lost: the DAG processor runs its callback
        return NO_EXCEPTION
    return exception if isinstance(exception, str) else exception_line(exception)


def report_uri(report: dict | None) -> str | None:
    """report.html in the record of collect's report (its XCom)."""
    return f"{report['s3_uri']}{run_folder.REPORT_HTML}" if report else None


def cluster_cost(cluster_id: str | None, config: PipelineConfig) -> ClusterCost:
    if not cluster_id:
        return ClusterCost(None)
    try:
        record = emr_cost.cluster_record(emr_tasks.emr_client(config), cluster_id, config)
    except Exception as error:  # the alert goes out without the cost
        log.warning("alert: the cost of cluster %s is unknown: %s", cluster_id, error)
        return ClusterCost(cluster_id)
    return ClusterCost(cluster_id, record["cost_usd_so_far"], record["hours_so_far"], record["cost_basis"])


class FailureAlert:
    """A task's on_failure_callback: publishes the failure to alerts.sns_topic_arn."""

    def __init__(self, config: PipelineConfig):
        self.config = config

    def __call__(self, context) -> None:
        alerts = self.config.alerts
        try:
            failure = failure_of(context, self.config)
            notifier = SnsNotifier(
                aws_conn_id=alerts.aws_conn_id,
                region_name=alerts.topic_region(),
                target_arn=alerts.sns_topic_arn,
                subject=alert_subject(failure),
                message=alert_message(failure),
            )
            # notify, not the notifier's __call__, which renders the message as a Jinja template: an
            # error line repeating a value may hold "{{".
            notifier.notify(context)
        except Exception as error:  # the task has failed already; its alert must not change how
            log.warning("alert: the task's failure was not published to %s: %s", alerts.sns_topic_arn, error)
            return
        log.info("alert: published to %s: %s", alerts.sns_topic_arn, alert_subject(failure))


def failure_callbacks(config: PipelineConfig) -> list[FailureAlert]:
    """The tasks' on_failure_callback: the alert, or none when alerts.sns_topic_arn is null."""
    return [FailureAlert(config)] if config.alerts.sns_topic_arn else []
