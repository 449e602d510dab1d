"""The gpt_pipeline DAG as Airflow parses it: integrity, task order, schedule and the trigger form."""

from __future__ import annotations

import importlib
import os
import runpy
from datetime import datetime, timezone
from itertools import pairwise
from pathlib import Path

import pytest
import yaml
from airflow.dag_processing.dagbag import DagBag
from airflow.sdk import AssetOrTimeSchedule
from airflow.sdk.definitions.param import ParamsDict

from include import trigger_form
from include.airflow_names import DAG_ID, model_asset_name
from pipeline.config import REPO_ROOT, SHARED_CORPUS, ConfigError
from pipeline.config_files import DEFAULT_CONFIG_PATH, load_config, read_yaml
from pipeline.deployment import deployment_settings, is_deployment_setting
from pipeline.overrides import apply_overrides
from pipeline.stages import STAGE_NAMES
from tests.deployments import deploy

PIPELINE = ["validate_config", *STAGE_NAMES, "collect", "promote"]
DAG_FILE = REPO_ROOT / "dags" / "gpt_pipeline.py"


@pytest.fixture(scope="module")
def dagbag() -> DagBag:
    return DagBag(dag_folder=str(REPO_ROOT / "dags"))


@pytest.fixture(scope="module")
def dag(dagbag):
    return dagbag.dags[DAG_ID]


@pytest.fixture(scope="module")
def dag_module():
    return importlib.import_module("dags.gpt_pipeline")


def test_dags_folder_imports_cleanly(dagbag):
    assert dagbag.import_errors == {}
    assert DAG_ID in dagbag.dag_ids


def test_tasks_run_in_pipeline_order(dag):
    dag.check_cycle()
    assert sorted(dag.task_ids) == sorted([*PIPELINE, "prune_runs"])
    for upstream, downstream in pairwise(PIPELINE):
        assert downstream in dag.get_task(upstream).downstream_task_ids, f"{upstream} >> {downstream}"
    # Nothing but validate_config (which hands the run folder to every task) skips ahead.
    for position, task_id in enumerate(PIPELINE[1:-1], start=1):
        assert dag.get_task(task_id).upstream_task_ids == {PIPELINE[position - 1], "validate_config"}
    assert dag.get_task("promote").upstream_task_ids == {"collect"}
    assert dag.get_task("prune_runs").upstream_task_ids == {"collect", "validate_config"}


def test_promote_updates_the_model_asset_at_the_latest_pointers(dag):
    s3 = load_config().s3
    (asset,) = dag.get_task("promote").outlets
    latest = f"s3://{s3.bucket}/{s3.prefix}/latest"
    assert (asset.name, asset.uri) == (model_asset_name(latest), latest)
    assert not any(task.outlets for task in dag.tasks if task.task_id != "promote")


def test_owner_retries_and_tags(dag):
    assert {task.owner for task in dag.tasks} == {"ml-platform"}
    assert dag.get_task("validate_config").retries == 0  # a bad config does not get better
    assert all(dag.get_task(task_id).retries >= 1 for task_id in PIPELINE[1:])
    assert {"gpt-pipeline", "spark", "tensorflow", "target-local"} <= set(dag.tags)


def test_one_run_at_a_time_no_catchup_and_retraining_on_corpus_updates(dag):
    assert dag.max_active_runs == 1
    assert dag.catchup is False
    corpus = load_config().corpus
    assert {asset.uri for asset in dag.timetable.asset_condition.objects} == set(corpus)


def test_a_corpus_asset_keeps_hashes_and_question_marks_of_its_path(dag_module):
    corpus = ["file:///data/my books #2/*.txt", "file:///data/vol?/*.txt", "s3://bucket/books/*.txt"]
    assets = dag_module.retraining_schedule(load_config(overrides=[{"corpus": corpus}])).objects
    assert [(asset.name, asset.uri) for asset in assets] == [
        ("file:///data/my books #2/*.txt", "file:///data/my books %232/*.txt"),
        ("file:///data/vol?/*.txt", "file:///data/vol%3F/*.txt"),
        ("s3://bucket/books/*.txt", "s3://bucket/books/*.txt"),
    ]


def test_the_corpus_asset_has_no_watcher_without_a_corpus_queue(dag):
    assert load_config().corpus_queue is None
    assert [asset.watchers for asset in dag.timetable.asset_condition.objects] == [[]]


def test_a_corpus_queue_gives_every_corpus_asset_the_watcher_of_its_uploads_as_airflow_stores_it(tmp_path, monkeypatch):
    from airflow.serialization.serialized_objects import DagSerialization

    queue = "https://sqs.eu-west-1.amazonaws.com/123456789012/gpt-pipeline-corpus-uploads"
    corpus = ["s3://corpus-bucket/books/*.txt", "s3://corpus-bucket/poems/"]
    deploy(monkeypatch, tmp_path / "pipeline.yaml", {"corpus": corpus, "corpus_queue": queue})
    dag = DagSerialization.from_dict(DagSerialization.to_dict(runpy.run_path(str(DAG_FILE))["dag"]))
    assets = dag.timetable.asset_condition.objects
    assert [asset.name for asset in assets] == corpus
    triggers = [watcher.trigger for asset in assets for watcher in asset.watchers]
    # One trigger, the same on both assets (Airflow runs it once): a second reader of the queue would take its messages.
    assert len(triggers) == 2 and triggers[0] == triggers[1]
    assert triggers[0]["classpath"] == "include.upload_trigger.CorpusUploadTrigger"
    assert (triggers[0]["kwargs"]["queue_url"], triggers[0]["kwargs"]["corpus"]) == (queue, corpus)


def test_a_corpus_queue_for_a_local_corpus_fails_the_dags_parse_naming_the_setting(tmp_path, monkeypatch):
    queue = "https://sqs.eu-west-1.amazonaws.com/123456789012/gpt-pipeline-corpus-uploads"
    deploy(monkeypatch, tmp_path / "pipeline.yaml", {"corpus_queue": queue})
    with pytest.raises(ConfigError, match=r"^corpus_queue: .*/tinyshakespeare\.txt is not on S3"):
        runpy.run_path(str(DAG_FILE))


def test_schedule_from_config_adds_a_cron_or_preset_to_the_corpus_asset(dag_module):
    schedule = dag_module.retraining_schedule(load_config(overrides=["schedule=@weekly"]))
    assert isinstance(schedule, AssetOrTimeSchedule)
    assert schedule.timetable.expression == "0 0 * * 0"
    with pytest.raises(ConfigError, match=r"schedule: .*\(got 'every monday'\)"):
        dag_module.retraining_schedule(load_config(overrides=["schedule=every monday"]))


@pytest.mark.parametrize(
    "schedule, now, first",
    [
        ("@weekly", "2026-11-22T00:30:00", "2026-11-29T00:00:00"),  # 30 min past Sunday's tick
        ("@daily", "2026-11-23T02:00:00", "2026-11-24T00:00:00"),
        ("*/5 * * * *", "2026-11-23T07:56:02", "2026-11-23T08:00:00"),
    ],
)
def test_a_new_schedule_waits_for_its_next_time_instead_of_starting_a_run_at_once(
    tmp_path, monkeypatch, schedule, now, first
):
    """Turning a schedule on (or deploying the DAG with one) must not start a run, and on EMR a cluster, at
    once, however shortly after a scheduled time it happens."""
    from airflow.serialization.serialized_objects import DagSerialization
    from airflow.timetables import trigger

    deploy(monkeypatch, tmp_path / "pipeline.yaml", {"schedule": schedule})
    monkeypatch.setattr(trigger, "utcnow", lambda: datetime.fromisoformat(now).replace(tzinfo=timezone.utc))
    dag = DagSerialization.from_dict(
        DagSerialization.to_dict(runpy.run_path(str(REPO_ROOT / "dags" / "gpt_pipeline.py"))["dag"])
    )
    assert dag.next_dagrun_info(last_automated_run_info=None).run_after == datetime.fromisoformat(first).replace(
        tzinfo=timezone.utc
    )


def test_form_shows_the_yaml_defaults(dag):
    defaults = read_yaml(REPO_ROOT / "include" / "config" / "pipeline.yaml")
    assert dag.params["max_steps"] == defaults["train"]["max_steps"]
    assert dag.params["stride"] == defaults["data"]["stride"]
    assert dag.params["corpus"] == defaults["corpus"]
    assert dag.params["overrides"] == []


def test_form_types_come_from_the_config_fields_not_from_how_the_yaml_spells_a_default():
    defaults = apply_overrides(read_yaml(DEFAULT_CONFIG_PATH), {"run_name": "sonnets"})
    defaults["train"]["learning_rate"] = yaml.safe_load("3e-4")  # YAML 1.1 reads it as text
    assert defaults["train"]["learning_rate"] == "3e-4"
    form = ParamsDict(trigger_form.params(defaults))
    assert form["learning_rate"] == 0.0003
    form.validate()
    # An API trigger's number, and an emptied run name (sent as null), are what the config takes.
    form.update({"learning_rate": 0.0005, "run_name": None})
    form.validate()
    config = load_config(overrides=trigger_form.overrides({"learning_rate": 0.0005, "run_name": None}))
    assert (config.train.learning_rate, config.run_name) == (0.0005, "tinyshakespeare")


def test_form_values_become_config_fields():
    values = {"max_steps": 40, "stride": 8, "num_workers": 1, "corpus": "/data/*.txt", "overrides": ["data.shards=3"]}
    config = load_config(overrides=trigger_form.overrides(values))
    assert (config.train.max_steps, config.data.stride, config.train.num_workers) == (40, 8, 1)
    assert config.data.shards == 3
    # A setting both in a field and in the overrides takes the overrides' value, as the README says.
    both = trigger_form.overrides({"stride": 8, "overrides": ["data.stride=4"]})
    assert load_config(overrides=both).data.stride == 4
    assert config.corpus == ["file:///data/*.txt"]  # the glob is taken as it is, not parsed as YAML
    # The form sends an emptied field as null: an empty prompt (a new document).
    assert load_config(overrides=trigger_form.overrides({"prompt": None})).generate.prompt == ""


@pytest.mark.parametrize(
    "values, message",
    [
        ({"stride": 0}, r"data\.stride: Input should be greater than or equal to 1 \(got 0\)"),
        ({"num_workers": 3}, r"data\.shards \(4\) must be a multiple of train\.num_workers \(3\)"),
        (
            {"run_name": "my run"},
            r"run_name: must be letters, digits, '-', '_' and '\.', starting with a letter or digit",
        ),
        ({"overrides": ["data.window_size=64"]}, r"data\.window_size: unknown key"),
        ({"max_step": 10}, r"unknown trigger parameter\(s\) max_step"),
        ({"x" * 100_000: 1}, r"unknown trigger parameter\(s\) x{199}…; use overrides"),
        ({"overrides": ["corpus=[&a a.txt, *a]"]}, r"^invalid configuration: corpus: anchors and aliases"),
    ],
)
def test_bad_form_values_name_the_field(values, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=trigger_form.overrides(values))


def test_airflows_run_id_is_made_a_folder_name_once_as_the_run_starts(dag_module, monkeypatch):
    """Its ':' and '+' go here; the run folder, the EMR code's folder and the cluster take the result as it is."""
    context = {"params": {}, "run_id": "manual__2026-11-22T19:54:54.5+00:00"}
    monkeypatch.setattr(dag_module, "get_current_context", lambda: context)
    config, run_id = dag_module.form_config()
    assert run_id.startswith(f"{config.run_name}-manual__2026-11-22T19_54_54.5_00_00-")  # + the start of its hash


def form_config(dag_module, monkeypatch, values: dict):
    """validate_config's config and run id from the form `values`, Airflow's context stood in for."""
    monkeypatch.setattr(dag_module, "get_current_context", lambda: {"params": values, "run_id": "manual__1"})
    return dag_module.form_config()


@pytest.mark.parametrize("name", deployment_settings())
def test_a_run_cannot_change_a_deployment_setting(dag_module, monkeypatch, name):
    with pytest.raises(ConfigError) as raised:
        form_config(dag_module, monkeypatch, {"overrides": [f"{name}=changed-by-a-run"]})
    assert str(raised.value).startswith(
        f"{name}: a deployment setting, which a run cannot change: this DAG's {name} is"
    )
    assert str(raised.value).endswith(
        "read from pipeline.yaml (got 'changed-by-a-run'); edit pipeline.yaml to change it"
    )


# Out of the shared corpus folder, corpus_roots' default, by `..`: relative paths start at the checkout.
DOT_DOT_ESCAPE = "../shared/data/../../../etc/passwd"


@pytest.mark.parametrize(
    "values, message",
    [
        (
            {"overrides": ["schedule=@daily"]},
            "schedule: a deployment setting, which a run cannot change: this DAG's schedule is None, read from "
            "pipeline.yaml (got '@daily')",
        ),
        ({"overrides": ["s3.prefix=elsewhere"]}, "s3.prefix: a deployment setting"),
        ({"overrides": ["lake=s3://bucket/lake"]}, "lake: a deployment setting"),  # not the target's complaint
        ({"overrides": ["emr.core_instance_count=100"]}, "emr.core_instance_count: a deployment setting"),
        ({"corpus": "~/.aws/credentials"}, f"corpus: {Path.home().resolve().as_uri()}/.aws/credentials (resolved: "),
        (
            {"overrides": [f"corpus={DOT_DOT_ESCAPE}"]},
            f"corpus: {Path(os.path.normpath(REPO_ROOT / DOT_DOT_ESCAPE)).as_uri()} (resolved: ",
        ),
    ],
    ids=["schedule", "record prefix", "lake", "cluster size", "credentials", "dot-dot"],
)
def test_a_run_changing_what_is_the_deployments_is_refused(dag_module, monkeypatch, values, message):
    with pytest.raises(ConfigError) as raised:
        form_config(dag_module, monkeypatch, values)
    assert str(raised.value).startswith(message)


def test_a_run_may_read_a_corpus_within_the_roots_and_change_any_run_setting(dag_module, monkeypatch):
    corpus = f"{SHARED_CORPUS.parent}/*.txt"
    config, _ = form_config(dag_module, monkeypatch, {"corpus": corpus, "overrides": ["train.max_steps=5"]})
    assert (config.corpus, config.train.max_steps) == ([f"file://{SHARED_CORPUS.parent.resolve()}/*.txt"], 5)


def test_the_form_offers_run_settings_only(dag):
    fields = [field for field, _ in trigger_form.FIELDS.values()]
    assert fields and not [field for field in fields if is_deployment_setting(field)]
    assert set(dag.params) == {*trigger_form.FIELDS, trigger_form.OVERRIDES}


@pytest.mark.parametrize("task", ["run_local_stage", "collect", "prune_runs"])
def test_a_task_of_a_run_whose_folder_is_gone_fails_without_its_retry(dag_module, tmp_path, task):
    """keep_runs removed the folder; clearing the run's tasks in the UI must not retry them in vain."""
    from airflow.sdk.exceptions import AirflowFailException

    gone = f"file://{tmp_path}/lake/runs/books-old"
    arguments = ("generate", gone) if task == "run_local_stage" else (gone,)
    with pytest.raises(AirflowFailException, match=f"run folder {gone} is gone \\(keep_runs removes older"):
        callable_ = getattr(dag_module, task)
        getattr(callable_, "function", callable_)(*arguments)  # collect is a plain function (CollectOperator)
