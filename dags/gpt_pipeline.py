"""
### gpt_pipeline: train a GPT-style language model from raw text

```
target: local   validate_config → tokenize → window → positional_embed → export → train → generate
                  → collect → promote, prune_runs

target: emr     validate_config → create_cluster → wait_for_cluster → smoke → tokenize → window
                  → positional_embed → export → train → generate → collect → promote, prune_runs
                                                                   → terminate_cluster (teardown of create_cluster)
                 create_cluster or wait_for_cluster failed → end_orphaned_clusters (the run's clusters, by tag)
```

Each stage is one Spark application run with spark-submit: on this machine's Spark, or as a step of
an EMR cluster made for the run. Stages talk only through the run folder `{lake}/runs/{run}/`.
`collect` copies the run's record and report to S3, `promote` points the run name's `latest`
pointer at the new model (updating the `gpt_pipeline_model` asset), `prune_runs` removes older run
folders when `keep_runs` is set. On EMR, `wait_for_cluster` waits for the cluster to start and
bootstrap (within `emr.startup_timeout_minutes`), `smoke` checks the nodes (their Python packages,
the training workers' addresses, YARN's largest container, S3) before the first stage, `terminate_cluster` runs
whatever happened after `create_cluster`, and a failed step still fails the run; should
`create_cluster` itself fail, `end_orphaned_clusters` ends whatever cluster carries the run's tag.
With `alerts.sns_topic_arn` set, a task that fails, a teardown included, sends a message to that SNS topic.
With an MLflow tracking URI in the Airflow variable `tracking.uri_variable` names, `collect` logs the run
to MLflow and `promote` registers the promoted model, alias `champion`.
With `corpus_queue` set, an upload to the corpus on S3 starts a run, through the corpus asset's watcher.

Defaults come from include/config/pipeline.yaml (`target` chooses the branch); the trigger form
changes them for one run. The tasks, the trigger form and the settings a run cannot change:
`docs/dag.md`; the cluster, its steps and its cost: `docs/emr.md`; MLflow and the alerts: `docs/tracking.md`.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from airflow.sdk import (
    DAG,
    Asset,
    AssetAny,
    AssetOrTimeSchedule,
    AssetWatcher,
    TriggerRule,
    XComArg,
    chain,
    get_current_context,
    task,
)
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from include import (
    alerts,
    emr_checks,
    emr_cluster,
    emr_cost,
    emr_steps,
    emr_tasks,
    local_spark,
    locks,
    preflight,
    tracking,
    trigger_form,
    upload_trigger,
)
from include.airflow_names import DAG_ID, model_asset_name
from include.emr_tasks import (
    EmrClusterReadySensor,
    EmrCreateClusterOperator,
    EmrStageSensor,
    EmrTerminateRunClustersOperator,
)
from include.promote import latest_folder, promote_record
from include.prune import remove_old_runs
from include.record import AWS_CONN_ID, StoredRun, check_bucket, collect_record
from include.report_link import REPORT_URL_KEY, CollectOperator, report_url
from include.schedule import cron_timetable
from include.spark_submit import packaged_code
from pipeline import corpus_files, deployment, lake, run_folder
from pipeline import stages as stage_graph
from pipeline.config import PipelineConfig
from pipeline.config_files import defaults_path, load_config, read_yaml
from pipeline.errors import name_some
from pipeline.stages import EMR_STEP_NAMES, STAGE_NAMES
from spark_jobs.training import memory

log = logging.getLogger(__name__)

CONFIG_PATH = defaults_path()  # include/config/pipeline.yaml unless GPT_PIPELINE_CONFIG names another
CONFIG = load_config(CONFIG_PATH)  # the deployment's settings, the run's defaults and the form's values
# Updated when a run's model becomes latest; the event's extra names the run, its model and the pointer.
MODEL_ASSET = Asset(name=model_asset_name(latest_folder(CONFIG)), uri=latest_folder(CONFIG))


def corpus_asset(uri: str, watchers: list[AssetWatcher] | None = None) -> Asset:
    """The asset of a corpus URI, named by it. Its URI keeps a '#' or '?' in the path (a glob's
    '?' too) percent-encoded: Airflow would cut the URI there, as at a fragment or a query."""
    return Asset(name=uri, uri=uri.replace("#", "%23").replace("?", "%3F"), watchers=watchers or [])


def retraining_schedule(config: PipelineConfig):
    """Retrain when the corpus asset is updated (with corpus_queue set, also on an upload to the
    corpus on S3), and on the configured cron or preset if there is one."""
    watchers = upload_trigger.corpus_watchers(config, AWS_CONN_ID)
    corpus_assets = AssetAny(*(corpus_asset(uri, watchers) for uri in config.corpus))
    if config.schedule is None:
        return corpus_assets
    return AssetOrTimeSchedule(timetable=cron_timetable(config.schedule), assets=corpus_assets)


def form_config() -> tuple[PipelineConfig, str]:
    """This run's config (pipeline.yaml + the trigger form, validated) and its run id: the run
    folder's name, made of the run name and Airflow's run id, which it makes safe for a folder, an
    S3 key and a cluster's name (run_folder.safe_run_id)."""
    context = get_current_context()
    overrides = trigger_form.overrides(dict(context["params"]))
    deployment.check_overrides(overrides, read_yaml(CONFIG_PATH), CONFIG_PATH.name)
    config = load_config(CONFIG_PATH, overrides)
    deployment.check_run_settings(CONFIG, config, CONFIG_PATH.name)
    changed = stage_graph.changed_settings(CONFIG.model_dump(), config.model_dump())
    log.info(
        "settings from the form: %s", "; ".join(f"{path} = {new!r}" for path, (_, new) in changed.items()) or "none"
    )
    return config, run_folder.safe_run_id(f"{config.run_name}-{context['run_id']}")


def check_run(config: PipelineConfig, sizes: dict[str, int]) -> preflight.RunCheck:
    """Log the corpus, then stop a run that cannot succeed (corpus too small for a window, no room
    for its windows and TFRecords, a model too big for a local worker) before any Spark or cluster starts."""
    log.info(
        "corpus: %d file(s), %s bytes: %s", len(sizes), f"{sum(sizes.values()):,}", name_some(list(sizes), shown=5)
    )
    if config.corpus != CONFIG.corpus:  # a link in a folder within corpus_roots may lead out of them
        deployment.check_corpus_files(sizes, CONFIG.corpus_roots)
    return preflight.check_run(config, sizes)


@task(retries=0)
def validate_config() -> str:
    """Build this run's config from pipeline.yaml and the trigger form, check it, create the run folder."""
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    config, run_id = form_config()
    check_bucket(S3Hook(aws_conn_id=AWS_CONN_ID), config.s3.bucket, "s3.bucket")  # collect's, before any Spark runs
    checked = check_run(config, corpus_files.corpus_files(config))
    log.info("training: %s", memory.describe(checked.training))
    if checked.exposure:
        log.warning(checked.exposure)
    run_dir = run_folder.create_run(config, run_id)
    log.info("run folder: %s", run_dir)
    return run_dir


@task(task_id="validate_config", multiple_outputs=True, retries=0)
def validate_config_for_emr() -> dict:
    """Check the config, the account's buckets and service role, and the corpus on S3 (docs/emr.md)
    before any cluster exists, then upload the run's code and config; returns the run folder, the
    cluster request and every stage's step."""
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    config, run_id = form_config()
    s3 = S3Hook(aws_conn_id=config.emr.aws_conn_id)
    emr_checks.check_settings(config, s3)
    check_bucket(S3Hook(aws_conn_id=AWS_CONN_ID), config.s3.bucket, "s3.bucket")  # collect's, before a cluster
    sizes = emr_checks.corpus_objects(config, s3)
    check_run(config, sizes)
    emr_checks.check_corpus_text(config, sizes, s3)
    return emr_tasks.prepare(config, run_id, CONFIG)


def require_run_folder(run_dir: str, hook) -> None:
    """A run folder that is gone fails the task without its retry, which would fail the same way
    and hold the one active run meanwhile: keep_runs removes older collected runs, whose tasks may
    still be cleared in the UI."""
    if not StoredRun(run_dir, hook).has(run_folder.CONFIG_FILE):
        raise AirflowFailException(
            f"run folder {run_dir} is gone (keep_runs removes older collected runs) or was never made: "
            "trigger a new run instead"
        )


@task
def run_local_stage(stage: str, run_dir: str) -> dict:
    """spark-submit one stage on local Spark; returns the headline figures of the stage's stats."""
    require_run_folder(run_dir, hook=None)
    config = run_folder.read_config(run_dir)
    with packaged_code() as code_dir:
        try:
            with locks.run_folder_held(run_dir, f"the DAG's task {stage}"):
                local_spark.submit_stage(stage, config, run_dir, code_dir)
        except local_spark.StageFailed as error:
            if error.bad_input:  # fail without the retry, which would stop on the same input
                raise AirflowFailException(str(error)) from error
            raise
    return local_spark.headline(lake.read_json(run_folder.stats_uri(run_dir, stage)))


def collect(run_dir: str, cluster_id: str | None = None) -> dict:
    """Copy config, stats, model and samples to S3 and write the run report (on EMR with the
    cluster's steps and cost so far), then log the run to MLflow; the task's "Run report" link
    leads to its report.html."""
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    s3 = S3Hook(aws_conn_id=AWS_CONN_ID)
    require_run_folder(run_dir, s3)
    extra = {}
    if cluster_id:
        config = run_folder.read_config(run_dir, StoredRun(run_dir, s3).read)
        extra["emr"] = emr_cost.cluster_record(emr_tasks.emr_client(config), cluster_id, config)
    report = collect_record(run_dir, s3, STAGE_NAMES, extra)
    log.info(
        "record: %s  final val loss: %s  val nats/char: %s",
        report["s3_uri"],
        report["final_val_loss"],
        report["val_nats_per_char"],
    )
    log.info("report: %s%s (the task's link Run report opens it)", report["s3_uri"], run_folder.REPORT_HTML)
    context = get_current_context()
    context["ti"].xcom_push(key=REPORT_URL_KEY, value=report_url(report["s3_uri"], s3))
    airflow_run = {"dag_id": DAG_ID, "run_id": context["run_id"]}
    return report | {"mlflow": tracking.track_collected_run(CONFIG, report, s3, airflow_run)}


def collect_task(run_dir, cluster_id=None) -> XComArg:
    """The collect task, with its link to the report."""
    return CollectOperator(
        task_id="collect", python_callable=collect, op_kwargs={"run_dir": run_dir, "cluster_id": cluster_id}
    ).output


@task(outlets=[MODEL_ASSET])
def promote(report: dict) -> dict:
    """Point latest/{run_name}.json at this run's model and update the model asset, then make the
    model the champion of the run name's registered model in MLflow; skipped, with no asset event,
    when s3.promote is if_better and the model latest points at is better."""
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    decision = promote_record(report["s3_uri"], S3Hook(aws_conn_id=AWS_CONN_ID))
    if not decision["promoted"]:
        kept = decision["pointer"]["run"]
        raise AirflowSkipException(f"{decision['latest']} still points at {kept}: {decision['reason']}")
    log.info("%s now points at %s: %s", decision["latest"], decision["pointer"]["model"], decision["reason"])
    get_current_context()["outlet_events"][MODEL_ASSET].extra = decision
    return decision | {"mlflow": tracking.register_promoted_model(CONFIG, report, decision)}


@task
def prune_runs(run_dir: str) -> list[str]:
    """With keep_runs set, remove this run name's older collected run folders from the lake."""
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    s3 = S3Hook(aws_conn_id=AWS_CONN_ID)
    require_run_folder(run_dir, s3)
    removed = remove_old_runs(run_dir, s3)
    for uri in removed:
        log.info("removed %s (keep_runs; its record stays where collect copied it)", uri)
    return removed


with DAG(
    dag_id=DAG_ID,
    description="Train a GPT-style model: Spark preprocessing, multi-worker TensorFlow, record to S3",
    doc_md=__doc__,
    schedule=retraining_schedule(CONFIG),
    catchup=False,
    max_active_runs=1,
    params=trigger_form.params(read_yaml(CONFIG_PATH)),
    default_args={
        "owner": "ml-platform",
        "retries": 1,
        "retry_delay": timedelta(minutes=1),
        "execution_timeout": timedelta(hours=4),
        # Every task's, the teardowns' too: a message to alerts.sns_topic_arn once its last try has failed.
        "on_failure_callback": alerts.failure_callbacks(CONFIG),
    },
    tags=["gpt-pipeline", "spark", "tensorflow", f"target-{CONFIG.target}"],
) as dag:
    if CONFIG.target == "local":
        run_dir = validate_config()
        stages = [run_local_stage.override(task_id=stage)(stage, run_dir) for stage in STAGE_NAMES]
        report = collect_task(run_dir)
        chain(run_dir, *stages, report)
        promote(report)
        report >> prune_runs(run_dir)
    else:
        aws = {"aws_conn_id": CONFIG.emr.aws_conn_id, "region_name": CONFIG.emr.region}
        prepared = validate_config_for_emr()
        run_dir = prepared["run_dir"]

        # Setup: the cluster. No retries (boto3 retries API errors itself); a create run again (its
        # task cleared) uses the run's active cluster. It terminates its cluster if it fails once EMR made it.
        create_cluster = EmrCreateClusterOperator(
            task_id="create_cluster",
            job_flow_overrides=prepared["job_flow_overrides"],
            emr_conn_id=None,
            retries=0,
            **aws,
        )
        cluster_id = create_cluster.output
        # Start-up and bootstrap, on their own allowance: the first step's time limit starts after them.
        wait_for_cluster = EmrClusterReadySensor(
            task_id="wait_for_cluster", job_flow_id=cluster_id, **emr_cluster.startup_limits(CONFIG), **aws
        )

        # Body: one task per stage adds its EMR step and waits for it (a retry adds the step again),
        # the cluster check (smoke) first; then collect, with the cluster's steps and cost.
        stages = [
            EmrStageSensor(
                task_id=stage,
                stage=stage,
                step=prepared[f"{stage}_step"],
                run_dir=run_dir,
                job_flow_id=cluster_id,
                retries=emr_steps.STEP_RETRIES,
                **emr_steps.sensor_limits(stage, CONFIG),
                **aws,
            )
            for stage in EMR_STEP_NAMES
        ]
        report = collect_task(run_dir, cluster_id)

        # Teardown: runs whatever happened to the steps; a failed step still fails the run, and so
        # does a failed terminate (the cluster may still be up), which a teardown would not otherwise.
        # With no cluster id from create_cluster it finds the run's clusters by the request's tag.
        terminate_cluster = EmrTerminateRunClustersOperator(
            task_id="terminate_cluster",
            job_flow_id=cluster_id,
            job_flow_overrides=prepared["job_flow_overrides"],
            **aws,
        )

        # A create_cluster that died between RunJobFlow and its XCom (a worker killed outright runs
        # no on_kill) fails, and Airflow runs no teardown of a failed setup: this task then ends the
        # run's clusters by their tag. It follows wait_for_cluster, as a setup's own downstream tasks
        # must be all_success; skipped unless one of the two failed.
        end_orphaned_clusters = EmrTerminateRunClustersOperator(
            task_id="end_orphaned_clusters",
            job_flow_overrides=prepared["job_flow_overrides"],
            trigger_rule=TriggerRule.ONE_FAILED,
            **aws,
        )

        chain(
            prepared,
            create_cluster,
            wait_for_cluster,
            *stages,
            report,
            terminate_cluster.as_teardown(setups=create_cluster, on_failure_fail_dagrun=True),
        )
        wait_for_cluster >> end_orphaned_clusters
        promote(report)
        report >> prune_runs(run_dir)
