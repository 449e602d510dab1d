"""
### gpt_pipeline: train a GPT-style language model from raw text

validate_config → tokenize → window → positional_embed → export → train → generate → collect → promote, prune_runs

With `target: emr` in pipeline.yaml each stage is an EMR step on a cluster made for the run:
validate_config → create_cluster → tokenize → … → generate → collect → promote, prune_runs, terminate_cluster

Each stage is a Spark application run with spark-submit (include/spark_submit.py builds the
command for every target); stages talk only through the run folder `{lake}/runs/{run}/`.
`collect` copies the resolved config, stats, model and samples to
`s3://{s3.bucket}/{s3.prefix}/{run}/` through the `aws_default` connection, with a report
(report.md: losses, data, model, training, every validation pass; on EMR the cluster's steps and
cost) that the run folder keeps too.
`promote` points `s3://{s3.bucket}/{s3.prefix}/latest/{run_name}.json` at the new model (with
`s3.promote: if_better`, only when its validation loss per character is no higher) and then updates
the `gpt_pipeline_model` asset, which DAGs that use the model can be scheduled on. With
`keep_runs` set, `prune_runs` removes the run name's older collected run folders from the lake.

Defaults come from include/config/pipeline.yaml; the trigger form changes them for one run and
the first task validates the result with the config model, checks the corpus, and checks that the
model fits a training worker's memory (spark_jobs/lib/memory.py). `target`, `schedule`,
`s3.bucket` and `s3.prefix` (with `target: emr` also `emr.region`, `emr.aws_conn_id` and
`emr.poke_interval_seconds`) are the DAG's own and a run cannot change them; a run may lower
`emr.max_cost_usd` for itself, not raise it. On EMR a failed step is retried once on the same cluster,
unless it stopped on bad input or the cluster ended. Runs start by hand, on the `schedule:` of
pipeline.yaml (none by default), and whenever the corpus asset is updated.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from airflow.sdk import (
    DAG,
    Asset,
    AssetAny,
    AssetOrTimeSchedule,
    chain,
    get_current_context,
    task,
)
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from include import emr, emr_tasks, local_spark, locks, trigger_form
from include.airflow_names import DAG_ID, MODEL_ASSET_NAME
from include.promote import latest_folder, promote_record
from include.prune import remove_old_runs
from include.record import AWS_CONN_ID, RunFolder, check_bucket, collect_record
from include.schedule import cron_timetable
from include.spark_submit import packaged_code
from spark_jobs.lib import corpus, corpus_files, lake, memory, run_folder, storage
from spark_jobs.lib import stages as stage_graph
from spark_jobs.lib.config import (
    DAG_SETTINGS,
    ConfigError,
    PipelineConfig,
    defaults_path,
    load_config,
    read_yaml,
    setting,
)
from spark_jobs.lib.errors import name_some
from spark_jobs.lib.stage import load_run_config
from spark_jobs.lib.stages import STAGE_NAMES

log = logging.getLogger(__name__)

CONFIG_PATH = defaults_path()  # include/config/pipeline.yaml unless GPT_PIPELINE_CONFIG names another
CONFIG = load_config(CONFIG_PATH)  # the defaults: target, schedule and the form's values
# With target emr the cluster's tasks are built with these when Airflow parses the DAG, too.
EMR_DAG_SETTINGS = ("emr.aws_conn_id", "emr.region", "emr.poke_interval_seconds")
# Updated when a run's model becomes latest; the event's extra names the run, its model and the pointer.
MODEL_ASSET = Asset(name=MODEL_ASSET_NAME, uri=latest_folder(CONFIG))


def corpus_asset(uri: str) -> Asset:
    """The asset of a corpus URI, named by it. Its URI keeps a '#' or '?' in the path (a glob's
    '?' too) percent-encoded: Airflow would cut the URI there, as at a fragment or a query."""
    return Asset(name=uri, uri=uri.replace("#", "%23").replace("?", "%3F"))


def retraining_schedule(config: PipelineConfig):
    """Retrain when the corpus asset is updated, and on the configured cron or preset if there is one."""
    corpus_assets = AssetAny(*(corpus_asset(uri) for uri in config.corpus))
    if config.schedule is None:
        return corpus_assets
    return AssetOrTimeSchedule(timetable=cron_timetable(config.schedule), assets=corpus_assets)


def form_config() -> tuple[PipelineConfig, str]:
    """This run's config (pipeline.yaml + the trigger form, validated) and its run folder name."""
    context = get_current_context()
    config = load_config(CONFIG_PATH, trigger_form.overrides(dict(context["params"])))
    dag_settings, run_settings = CONFIG.model_dump(), config.model_dump()
    for name in DAG_SETTINGS + (EMR_DAG_SETTINGS if CONFIG.target == "emr" else ()):
        dag_value, run_value = setting(dag_settings, name), setting(run_settings, name)
        if run_value != dag_value:
            raise ConfigError(
                f"{name}: this DAG's {name} is {dag_value!r}, read from {CONFIG_PATH.name} when Airflow "
                f"parses the DAG; a run cannot change it (got {run_value!r}): edit {CONFIG_PATH.name}"
            )
    changed = stage_graph.changed_settings(dag_settings, run_settings)
    log.info(
        "settings from the form: %s", "; ".join(f"{path} = {new!r}" for path, (_, new) in changed.items()) or "none"
    )
    return config, f"{config.run_name}-{context['run_id']}"


def check_corpus(config: PipelineConfig, sizes: dict[str, int]) -> None:
    """Log the corpus and stop one too small for a window before any Spark or cluster starts."""
    log.info(
        "corpus: %d file(s), %s bytes: %s", len(sizes), f"{sum(sizes.values()):,}", name_some(list(sizes), shown=5)
    )
    corpus.check_fits(config, sizes)


@task(retries=0)
def validate_config() -> str:
    """Build this run's config from pipeline.yaml and the trigger form, check it, create the run folder."""
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    config, run_id = form_config()
    check_bucket(S3Hook(aws_conn_id=AWS_CONN_ID), config.s3.bucket, "s3.bucket")  # collect's, before any Spark runs
    sizes = corpus_files.corpus_files(config)
    check_corpus(config, sizes)
    storage.check_lake_room(config, sizes)
    log.info("training: %s", memory.describe(memory.check_local_training(config)))
    run_dir = run_folder.create_run(config, run_id)
    log.info("run folder: %s", run_dir)
    return run_dir


@task(task_id="validate_config", multiple_outputs=True, retries=0)
def validate_config_for_emr() -> dict:
    """Check the config and the corpus on S3 before any cluster exists, then upload the run's code
    and config; returns the run folder, the cluster request and every stage's step."""
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    config, run_id = form_config()
    check_bucket(S3Hook(aws_conn_id=AWS_CONN_ID), config.s3.bucket, "s3.bucket")  # collect's, before a cluster
    sizes = emr.corpus_objects(config, S3Hook(aws_conn_id=config.emr.aws_conn_id))
    check_corpus(config, sizes)
    storage.check_core_node_room(config, sizes)
    return emr_tasks.prepare(config, run_id, CONFIG)


def require_run_folder(run_dir: str, hook) -> None:
    """A run folder that is gone fails the task without its retry, which would fail the same way
    and hold the one active run meanwhile: keep_runs removes older collected runs, whose tasks may
    still be cleared in the UI."""
    if not RunFolder(run_dir, hook).has(run_folder.CONFIG_FILE):
        raise AirflowFailException(
            f"run folder {run_dir} is gone (keep_runs removes older collected runs) or was never made: "
            "trigger a new run instead"
        )


@task
def run_local_stage(stage: str, run_dir: str) -> dict:
    """spark-submit one stage on local Spark; returns the headline figures of the stage's stats."""
    require_run_folder(run_dir, hook=None)
    config = load_run_config(run_dir)
    with packaged_code() as code_dir:
        try:
            with locks.run_folder_held(run_dir, f"the DAG's task {stage}"):
                local_spark.submit_stage(stage, config, run_dir, code_dir)
        except local_spark.StageFailed as error:
            if error.bad_input:  # fail without the retry, which would stop on the same input
                raise AirflowFailException(str(error)) from error
            raise
    return local_spark.headline(lake.read_json(run_folder.stats_uri(run_dir, stage)))


@task
def collect(run_dir: str, cluster_id: str | None = None) -> dict:
    """Copy config, stats, model and samples to S3 and write the run report (on EMR with the
    cluster's steps and cost so far)."""
    from airflow.providers.amazon.aws.hooks.emr import EmrHook
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    s3 = S3Hook(aws_conn_id=AWS_CONN_ID)
    require_run_folder(run_dir, s3)
    extra = {}
    if cluster_id:
        config = RunFolder(run_dir, s3).config()
        client = EmrHook(aws_conn_id=config.emr.aws_conn_id, region_name=config.emr.region).conn
        extra["emr"] = emr.cluster_record(client, cluster_id, config)
    report = collect_record(run_dir, s3, STAGE_NAMES, extra)
    log.info(
        "record: %s  final val loss: %s  val nats/char: %s",
        report["s3_uri"],
        report["final_val_loss"],
        report["val_nats_per_char"],
    )
    return report


@task(outlets=[MODEL_ASSET])
def promote(report: dict) -> dict:
    """Point latest/{run_name}.json at this run's model and update the model asset; skipped, with
    no asset event, when s3.promote is if_better and the model latest points at is better."""
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    decision = promote_record(report["s3_uri"], S3Hook(aws_conn_id=AWS_CONN_ID))
    if not decision["promoted"]:
        kept = decision["pointer"]["run"]
        raise AirflowSkipException(f"{decision['latest']} still points at {kept}: {decision['reason']}")
    log.info("%s now points at %s: %s", decision["latest"], decision["pointer"]["model"], decision["reason"])
    get_current_context()["outlet_events"][MODEL_ASSET].extra = decision
    return decision


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
    },
    tags=["gpt-pipeline", "spark", "tensorflow", f"target-{CONFIG.target}"],
) as dag:
    if CONFIG.target == "local":
        run_dir = validate_config()
        stages = [run_local_stage.override(task_id=stage)(stage, run_dir) for stage in STAGE_NAMES]
        report = collect(run_dir)
        chain(run_dir, *stages, report)
        promote(report)
        report >> prune_runs(run_dir)
    else:
        # create_cluster -> one step per stage -> collect -> terminate_cluster (a teardown: it
        # runs whatever happened, and a failed step still fails the run).
        prepared = validate_config_for_emr()
        create, last_stage, terminate = emr_tasks.cluster_tasks(CONFIG, prepared)
        report = collect(prepared["run_dir"], create.output)
        last_stage >> report >> terminate
        promote(report)
        report >> prune_runs(prepared["run_dir"])
