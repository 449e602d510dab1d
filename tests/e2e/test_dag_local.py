"""The whole DAG with `airflow dags test` on this machine: real spark-submit stages, real
multi-worker TensorFlow, and the record collected through S3Hook to a moto S3 server."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import signal
import sqlite3
import subprocess
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from selenium.webdriver.common.by import By

from include.airflow_names import DAG_ID
from include.report_link import REPORT_URL_KEY, RunReportLink
from local_platform import airflow_home, airflow_runner, mlflow_local, run_command
from local_platform.airflow_home import AIRFLOW, prepare
from local_platform.moto_s3 import LocalS3
from pipeline import lake, run_folder
from pipeline.config import REPO_ROOT
from pipeline.config_files import load_config
from pipeline.log import printable
from pipeline.stages import STAGE_NAMES
from spark_jobs.training import tensorboard_log
from tests.conftest import SMALL_DATA, write_slice
from tests.deployments import deployment_env
from tests.e2e.browser import chromium, full_page_screenshot

BUCKET = load_config().s3.bucket
SMALL_RUN = [
    *SMALL_DATA,
    "model.n_layer=2",
    "train.batch_size=16",
    "train.max_steps=40",
    "train.warmup_steps=5",
    "train.eval_interval=20",
    "train.eval_batches=4",
    "train.checkpoint_interval=20",
    "generate.max_new_tokens=20",
]
# One `airflow dags test`: the whole run on the slice takes a few minutes on 2 cores, several times
# that on a loaded machine whose stages first record their JVM class archives (docs/benchmarks.md).
DAG_RUN_LIMIT_S = 900
# Each test may start Airflow's home (local_airflow: `airflow db migrate`) and one DAG run.
pytestmark = pytest.mark.timeout(DAG_RUN_LIMIT_S + 300)


@pytest.fixture(scope="module")
def local_airflow(tmp_path_factory):
    """An Airflow home with a migrated SQLite DB, and a moto S3 server holding the record bucket."""
    home = tmp_path_factory.mktemp("airflow-home")
    with LocalS3(buckets=(BUCKET,)) as s3:
        yield prepare(home, s3), s3, home


def dags_test(env: dict, conf: dict) -> tuple[int, str]:
    """Exit code and output of `airflow dags test`; after DAG_RUN_LIMIT_S the test fails with its
    output. Whatever ends the wait, its whole process group is killed (Spark and TensorFlow processes
    included), also when the test's own time-out interrupts it."""
    process = subprocess.Popen(
        [str(AIRFLOW), "dags", "test", DAG_ID, "--conf", json.dumps(conf)],
        env=env,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=DAG_RUN_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"airflow dags test did not finish in {DAG_RUN_LIMIT_S} s:\n{output[-5000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # what outlived Airflow, or all of it after an interruption
    return process.returncode, output


def last_run_states(home) -> tuple[str, str, dict[str, str]]:
    """(run id, run state, task states) of the newest run, read from Airflow's database."""
    with sqlite3.connect(home / "airflow.db") as db:
        run_id, state = db.execute(
            "SELECT run_id, state FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1", (DAG_ID,)
        ).fetchone()
        tasks = dict(db.execute("SELECT task_id, state FROM task_instance WHERE run_id = ?", (run_id,)).fetchall())
    return run_id, state, tasks


@pytest.mark.slow
def test_a_bad_form_value_fails_validate_config_naming_the_field(local_airflow, tmp_path):
    """Through Airflow once; the messages of each refusal are unit-tested (tests/dags/test_dag.py,
    tests/include/test_preflight.py, tests/spark_jobs/test_memory.py), and a bad corpus goes through
    `make run` (tests/local_platform/test_run_command.py). The value breaks a rule between fields,
    which the form itself cannot check (a value out of its field's range is refused at trigger,
    tests/include/test_trigger_form.py)."""
    env, _, home = local_airflow
    deployed = deployment_env(tmp_path / "pipeline.yaml", {"lake": str(tmp_path / "lake")}, env)
    code, output = dags_test(deployed, {"block_size": 32, "stride": 64})
    assert code != 0
    assert "invalid configuration: data.stride (64) must not exceed data.block_size (32)" in output
    _, state, tasks = last_run_states(home)
    assert state == "failed"
    assert tasks["validate_config"] == "failed"
    assert all(tasks.get(stage) in (None, "upstream_failed") for stage in STAGE_NAMES)
    assert not (tmp_path / "lake").exists()  # no run folder for a run that never started


@pytest.fixture(scope="module")
def collected_run(local_airflow, tmp_path_factory, shakespeare):
    """One whole DAG run by `make run` (its Python part, in this process) on a slice of
    tinyshakespeare, with an older collected run of the same name in the lake (keep_runs=1 leaves
    only the new one): what the tests below check. Its moto server is the module's, kept after the
    command so that the record can be read."""
    _, s3, home = local_airflow
    tmp_path = tmp_path_factory.mktemp("collected-run")
    corpus = write_slice(tmp_path, shakespeare)
    mlflow_store = f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"
    older = tmp_path / "lake" / run_folder.RUNS_FOLDER / "e2e-older"
    (older / run_folder.MODEL_FOLDER).mkdir(parents=True)
    (older / run_folder.REPORT_JSON).write_text(
        json.dumps({"run": "e2e-older", "collected_at": "2026-01-01T00:00:00Z"})
    )
    (older / run_folder.CONFIG_FILE).write_text(json.dumps({"run_name": "e2e", "corpus": [f"file://{corpus}"]}))
    settings = [f"lake={tmp_path / 'lake'}", "keep_runs=1", "run_name=e2e", *SMALL_RUN]
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        patch.setattr(airflow_home, "AIRFLOW_HOME", home)
        patch.setattr(run_command, "LocalS3", lambda buckets: contextlib.nullcontext(s3))
        patch.setenv(mlflow_local.URI_SETTING, mlflow_store)
        code = airflow_runner.main(["run", "--corpus", str(corpus), *(f"--set={item}" for item in settings)])
    (log,) = sorted((home / "logs").glob("run-*.log"))[-1:]
    run_id, state, tasks = last_run_states(home)
    client = s3.client()
    prefix = f"runs/{run_folder.safe_run_id(f'e2e-{run_id}')}/"
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return SimpleNamespace(
        code=code,
        out=out.getvalue(),
        err=err.getvalue(),
        log=log,
        output=log.read_text(),
        run_id=run_id,
        state=state,
        tasks=tasks,
        home=home,
        client=client,
        corpus=corpus,
        lake=tmp_path / "lake",
        prefix=prefix,
        keys={item["Key"][len(prefix) :] for item in listed},
        read=lambda name: client.get_object(Bucket=BUCKET, Key=prefix + name)["Body"].read(),
        tmp_path=tmp_path,
        run_dir=run_folder.run_dir(
            load_config(overrides=[{"lake": str(tmp_path / "lake")}]), run_folder.safe_run_id(f"e2e-{run_id}")
        ),
        s3_endpoint=s3.endpoint_url,
        mlflow_store=mlflow_store,
    )


@pytest.mark.slow
def test_the_dag_run_succeeds_with_every_task(collected_run):
    assert collected_run.code == 0, collected_run.err + collected_run.output[-5000:]
    assert collected_run.state == "success"
    expected = ["validate_config", *STAGE_NAMES, "collect", "promote", "prune_runs"]
    assert collected_run.tasks == {task_id: "success" for task_id in expected}


@pytest.mark.slow
def test_validate_config_logs_the_settings_the_form_changed(collected_run):
    pattern = r"settings from the form: .*run_name = 'e2e'; .*train\.max_steps = 40"
    assert re.search(pattern, collected_run.output), collected_run.output[-5000:]


@pytest.mark.slow
def test_the_record_on_s3_holds_config_stats_model_samples_tensorboard_and_report(collected_run):
    expected = {
        run_folder.CONFIG_FILE,
        run_folder.SAMPLES_PATH,
        *run_folder.REPORTS,
        run_folder.EPOCHS_CSV_PATH,
    }
    assert expected | {run_folder.stats_path(stage) for stage in STAGE_NAMES} <= collected_run.keys
    assert any(key.startswith(f"{run_folder.MODEL_FOLDER}/") for key in collected_run.keys)
    # TensorBoard's: the training's event file and generate's.
    events = [key for key in collected_run.keys if key.startswith(f"{run_folder.TENSORBOARD_FOLDER}/events.out.")]
    assert len(events) == 2 and len([key for key in events if key.endswith(tensorboard_log.SAMPLES_SUFFIX)]) == 1
    config = json.loads(collected_run.read(run_folder.CONFIG_FILE))
    assert config["train"]["max_steps"] == 40 and config["corpus"] == [f"file://{collected_run.corpus}"]


@pytest.mark.slow
def test_training_ran_every_step_with_finite_validation_losses(collected_run):
    rows = list(csv.DictReader(io.StringIO(collected_run.read(run_folder.EPOCHS_CSV_PATH).decode())))
    assert [int(row["step"]) for row in rows][-1] == 40
    assert all(np.isfinite(float(row["val_loss"])) for row in rows)


@pytest.mark.slow
def test_the_report_agrees_with_the_training_stats(collected_run):
    rows = list(csv.DictReader(io.StringIO(collected_run.read(run_folder.EPOCHS_CSV_PATH).decode())))
    report = json.loads(collected_run.read(run_folder.REPORT_JSON))
    train = json.loads(collected_run.read(run_folder.stats_path("train")))
    assert report["final_val_loss"] == train["final_val_loss"] == pytest.approx(float(rows[-1]["val_loss"]), rel=1e-4)
    # A BPE token covers more than one character, so the per-character loss is the smaller.
    assert 0 < report["val_nats_per_char"] < report["final_val_loss"]
    assert [row["step"] for row in report["evaluations"]] == [int(row["step"]) for row in rows]
    config = json.loads(collected_run.read(run_folder.CONFIG_FILE))
    assert report["splits"]["train"]["windows"] > 0 and report["model"]["n_layer"] == config["model"]["n_layer"]


@pytest.mark.slow
def test_every_stage_records_its_spark_metrics_and_its_event_log_goes_with_the_record(collected_run):
    for stage in STAGE_NAMES:
        spark = json.loads(collected_run.read(run_folder.stats_path(stage)))["spark"]
        # generate samples on the driver: its application runs no task
        assert (spark["tasks"] > 0) == (stage != "generate") and spark["executors"] == 1, (stage, spark)
        assert spark["event_log"] == run_folder.spark_event_log_path(stage) in collected_run.keys
    assert f"| {STAGE_NAMES[0]} | 1 | " in collected_run.read(run_folder.REPORT_TEXT).decode()


@pytest.mark.slow
def test_the_sample_continues_the_prompt_and_is_in_the_report(collected_run):
    prompt = json.loads(collected_run.read(run_folder.CONFIG_FILE))["generate"]["prompt"]
    sample = collected_run.read(run_folder.SAMPLES_PATH).decode()
    assert sample.startswith(prompt) and len(sample) > len(prompt)
    assert json.loads(collected_run.read(run_folder.REPORT_JSON))["sample"] == sample


@pytest.mark.slow
def test_the_run_folder_keeps_the_report_and_keep_runs_removed_the_older_run(collected_run):
    config = load_config(overrides=[{"lake": str(collected_run.lake)}])
    run = run_folder.run_dir(config, run_folder.safe_run_id(f"e2e-{collected_run.run_id}"))
    assert lake.read_text(lake.join(run, run_folder.REPORT_TEXT)) == collected_run.read(run_folder.REPORT_TEXT).decode()
    assert sorted(path.name for path in (collected_run.lake / run_folder.RUNS_FOLDER).iterdir()) == [
        run.rsplit("/", 1)[1]
    ]


@pytest.mark.slow
def test_promote_points_latest_at_the_model_and_updates_the_model_asset(collected_run):
    report = json.loads(collected_run.read(run_folder.REPORT_JSON))
    pointer = json.loads(collected_run.client.get_object(Bucket=BUCKET, Key="runs/latest/e2e.json")["Body"].read())
    assert pointer["model"] == f"s3://{BUCKET}/{collected_run.prefix}model/"
    assert pointer["val_nats_per_char"] == report["val_nats_per_char"]
    with sqlite3.connect(collected_run.home / "airflow.db") as db:
        events = db.execute(
            "SELECT asset.uri, asset_event.extra FROM asset_event JOIN asset ON asset.id = asset_event.asset_id "
            "WHERE asset_event.source_run_id = ?",
            (collected_run.run_id,),
        ).fetchall()
    assert [(uri, json.loads(extra)["pointer"]["model"]) for uri, extra in events] == [
        (f"s3://{BUCKET}/runs/latest", pointer["model"])
    ]


@pytest.mark.slow
def test_a_stages_xcom_is_its_headline_figures_not_growing_lists(collected_run):
    with sqlite3.connect(collected_run.home / "airflow.db") as db:
        (window_xcom,) = db.execute(
            "SELECT value FROM xcom WHERE run_id = ? AND task_id = 'window' AND key = 'return_value'",
            (collected_run.run_id,),
        ).fetchone()
    window_xcom = json.loads(window_xcom)
    block_size = json.loads(collected_run.read(run_folder.CONFIG_FILE))["data"]["block_size"]
    assert window_xcom["stage"] == "window" and window_xcom["block_size"] == block_size
    assert (
        "sequences" not in window_xcom and json.loads(collected_run.read(run_folder.stats_path("window")))["sequences"]
    )


@pytest.mark.slow
def test_the_collected_model_loads_and_predicts(collected_run):
    model_dir = collected_run.tmp_path / "model-from-s3"
    for key in collected_run.keys:
        if key.startswith(f"{run_folder.MODEL_FOLDER}/"):
            (model_dir / key).parent.mkdir(parents=True, exist_ok=True)
            (model_dir / key).write_bytes(collected_run.read(key))
    from spark_jobs.generate import load_model

    model, tokenizer = load_model(f"file://{model_dir / 'model'}")
    ids = tokenizer.encode("ROMEO:").ids
    logits = np.asarray(model(np.array([ids], dtype=np.int32), training=False))
    assert logits.shape[:2] == (1, len(ids)) and logits.shape[2] >= tokenizer.get_vocab_size()
    assert np.isfinite(logits).all()


def xcom(collected_run, task_id: str, key: str):
    with sqlite3.connect(collected_run.home / "airflow.db") as db:
        (value,) = db.execute(
            "SELECT value FROM xcom WHERE run_id = ? AND task_id = ? AND key = ?", (collected_run.run_id, task_id, key)
        ).fetchone()
    return json.loads(value)


@pytest.mark.slow
def test_the_collect_tasks_run_report_link_opens_the_report_page_on_s3(collected_run):
    url = xcom(collected_run, "collect", REPORT_URL_KEY)
    assert url.startswith(f"{collected_run.s3_endpoint}/{BUCKET}/{collected_run.prefix}{run_folder.REPORT_HTML}?")
    assert xcom(collected_run, "collect", RunReportLink().xcom_key) == url  # what the UI's link button opens
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=30) as response:  # loopback
        assert response.headers["Content-Type"] == "text/html; charset=utf-8"
        assert response.read() == collected_run.read(run_folder.REPORT_HTML)
    assert f"report: s3://{BUCKET}/{collected_run.prefix}{run_folder.REPORT_HTML} (the task's link" in (
        collected_run.output
    )


@pytest.fixture(scope="module")
def report_page(collected_run, tmp_path_factory):
    """The run folder's report.html open in headless Chromium, with a screenshot of all of it."""
    with chromium(tmp_path_factory.mktemp("chromium-profile")) as driver:
        driver.get(lake.join(collected_run.run_dir, run_folder.REPORT_HTML))
        full_page_screenshot(driver, "dag-local-report.png")
        yield driver


@pytest.mark.slow
def test_the_report_page_draws_training_at_every_log_interval_and_validation_at_each_pass(collected_run, report_page):
    def rows(path: str) -> list[dict]:
        return list(csv.DictReader(io.StringIO(collected_run.read(path).decode())))

    evaluations, points = rows(run_folder.EPOCHS_CSV_PATH), rows(run_folder.STEPS_CSV_PATH)
    config = json.loads(collected_run.read(run_folder.CONFIG_FILE))["train"]
    logged = [step for step in range(1, config["max_steps"] + 1) if step % config["log_interval"] == 0]
    assert [int(point["step"]) for point in points] == sorted({*logged, config["max_steps"]})
    for chart, counts in (
        ("chart-loss", {"training": len(points), "validation": len(evaluations)}),
        ("chart-learning-rate", {"learning rate": len(points)}),
        ("chart-tokens-per-s", {"tokens/s": len(points)}),
    ):
        drawn = report_page.find_elements(By.CSS_SELECTOR, f"svg#{chart} g.series")
        assert {
            group.get_attribute("data-name"): len(group.find_elements(By.CSS_SELECTOR, "circle.point"))
            for group in drawn
        } == counts, chart
    assert len(report_page.find_elements(By.CSS_SELECTOR, "svg#timeline rect.bar")) == len(STAGE_NAMES)


@pytest.mark.slow
def test_the_report_pages_figures_are_the_reports(collected_run, report_page):
    report = json.loads(collected_run.read(run_folder.REPORT_JSON))
    assert lake.read_bytes(lake.join(collected_run.run_dir, run_folder.REPORT_HTML)) == collected_run.read(
        run_folder.REPORT_HTML
    )

    def shown(element_id: str) -> str:
        return report_page.find_element(By.ID, element_id).text

    assert shown("figure-val-nats-per-char") == f"{report['val_nats_per_char']:.4f}"
    assert shown("figure-val-loss") == f"{report['final_val_loss']:.4f}"
    assert shown("figure-steps") == f"{report['train']['steps']:,}" == "40"
    assert shown("figure-parameters") == f"{report['train']['parameters']:,}"
    assert shown("figure-corpus-chars") == f"{sum(split['chars'] for split in report['splits'].values()):,}"
    settings = shown("settings")
    assert f"train.max_steps {load_config().train.max_steps} 40" in settings
    assert "keep_runs" not in settings  # make run's SET put it in the DAG's config file: the deployment's, not a change
    spark = shown("spark-metrics")
    for stage, metrics in report["spark"].items():  # Spark's metrics where the stage recorded them
        assert metrics["app_id"] in spark if metrics else "not recorded" in spark, stage
    assert report_page.find_element(By.ID, "sample").get_attribute("textContent") == as_html_parses(report["sample"])


def as_html_parses(text: str) -> str:
    """text as a browser's HTML parser reads it: CR LF and CR as LF, NUL dropped (a sample may hold any)."""
    return re.sub(r"\r\n?", "\n", text).replace("\x00", "")


@pytest.mark.slow
def test_make_run_prints_where_the_outputs_are_on_a_quiet_console(collected_run):
    """The README's first command (its Python part): the summary after the run, one line per task."""
    out = collected_run.out
    (run_path,) = (collected_run.lake / run_folder.RUNS_FOLDER).iterdir()
    assert f"run folder:       {run_path.as_uri()}\n" in out and (run_path / run_folder.REPORT_TEXT).is_file()
    report = json.loads((run_path / run_folder.REPORT_JSON).read_text())
    assert f"val nats/char:    {report['val_nats_per_char']:.4f}\n" in out
    assert f"latest model:     s3://{BUCKET}/runs/latest/e2e.json -> {report['s3_uri']}model/\n" in out
    assert "keep_runs:        removed 1 older run folder(s)" in out and "e2e-older" in out
    assert f"generated sample:\n{printable(report['sample'])}" in out
    assert list((collected_run.home / "tmp").iterdir()) == [], "the command's temporary files went with it"
    check_the_quiet_console(out, collected_run.home)


@pytest.mark.slow
def test_make_run_tracks_the_run_in_mlflow_and_registers_its_model_as_champion(collected_run):
    from mlflow import MlflowClient

    mlflow = MlflowClient(collected_run.mlflow_store)
    (run,) = mlflow.search_runs([mlflow.get_experiment_by_name("gpt-pipeline").experiment_id])
    report = json.loads(collected_run.read(run_folder.REPORT_JSON))
    assert run.info.status == "FINISHED" and run.info.run_name == report["run"]
    assert run.data.tags["airflow.run_id"] == collected_run.run_id and run.data.tags["gpt_pipeline.target"] == "local"
    assert run.data.tags["gpt_pipeline.record"] == report["s3_uri"]
    assert run.data.params["train.max_steps"] == "40" and run.data.params["corpus"] == str(report["corpus"])
    assert run.data.metrics["final_val_nats_per_char"] == report["val_nats_per_char"]
    evaluations = mlflow.get_metric_history(run.info.run_id, "val_loss")
    assert [point.step for point in evaluations] == [row["step"] for row in report["evaluations"]]
    artifacts = [item.path for item in mlflow.list_artifacts(run.info.run_id, "model")]
    assert "model/model.safetensors" in artifacts and "model/config.json" in artifacts
    champion = mlflow.get_model_version_by_alias("e2e", "champion")
    assert champion.run_id == run.info.run_id
    assert f"MLflow:           {collected_run.mlflow_store} (`make mlflow` shows it" not in collected_run.out
    assert f"MLflow:           {collected_run.mlflow_store}\n" in collected_run.out


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
