"""The EMR rehearsal end to end: the `target: emr` DAG, unchanged, against moto's EMR and S3 API,
every step really run on a Spark standalone cluster whose two core nodes are 127.0.0.2 and
127.0.0.3 (local_platform/rehearsal). One rehearsal on a slice of tinyshakespeare with a small
training budget, in which one TensorFlow worker is killed once a training backup exists, is
checked by the tests below, one claim each; another, `make rehearse`'s own command in its private
network namespace, fails on a corpus that is not UTF-8 text, and lists what it listened on."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import psutil
import pytest

from include import emr_code, emr_steps, wheelhouse
from local_platform.console import shortened
from local_platform.dag_test import latest_pointer, read_report
from local_platform.rehearsal.emr_runner import split_s3
from local_platform.rehearsal.keep import kept_path
from local_platform.rehearsal.rehearse import Rehearsal
from pipeline import run_folder
from pipeline.config import REPO_ROOT
from pipeline.run_folder import BACKUP_PATH
from pipeline.stages import CLUSTER_CHECK, EMR_STEP_NAMES, STAGE_NAMES
from spark_jobs.generate import load_model
from tests.conftest import SMALL_DATA
from tests.listening import watch_listening

# The module's first test runs the rehearsal (`rehearsed`): 174 s on 2 cores (docs/rehearsal.md),
# several times that on a loaded machine whose stages first record their JVM class archives; the
# DAG run has no limit of its own.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

SMALL = [
    *SMALL_DATA,
    "model.n_layer=1",
    "model.n_head=2",
    "train.batch_size=16",
    "train.max_steps=300",
    "train.warmup_steps=4",
    "train.learning_rate=0.005",
    "train.eval_interval=100",
    "train.eval_batches=4",
    "train.log_interval=50",
    "train.checkpoint_interval=100",
    "generate.max_new_tokens=20",
]


def objects(rehearsal: Rehearsal, uri: str) -> dict[str, bytes]:
    """{key: body} of every object below an s3:// folder of the rehearsal's moto server."""
    bucket, prefix = split_s3(uri)
    client = rehearsal.s3.client()
    keys = [
        item["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/")
        for item in page.get("Contents", [])
    ]
    return {key: client.get_object(Bucket=bucket, Key=key)["Body"].read() for key in keys}


def trainers() -> list[psutil.Process]:
    """This test's TensorFlow workers (below the rehearsal's Spark workers, which are its children)."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if "spark_jobs.training.trainer" in " ".join(process.cmdline()):
                found.append(process)
        except psutil.Error:
            pass
    return found


class WorkerKiller(threading.Thread):
    """Kills one TensorFlow worker once the train step has written a backup to the run folder."""

    def __init__(self, rehearsal: Rehearsal):
        super().__init__(daemon=True)
        self.rehearsal, self.killed, self.stop = rehearsal, None, threading.Event()

    def run(self) -> None:
        client = self.rehearsal.s3.client()
        bucket, prefix = split_s3(self.rehearsal.config.lake)
        while not self.stop.is_set():
            listing = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/runs/")
            if any(item["Key"].endswith("/" + BACKUP_PATH) for item in listing.get("Contents", [])):
                workers = trainers()
                if workers:
                    victim = max(workers, key=lambda process: process.pid)
                    self.killed = {"pid": victim.pid, "host": victim.environ().get("SPARK_LOCAL_IP")}
                    victim.kill()
                    return
            time.sleep(0.2)


@pytest.fixture(scope="module")
def rehearsed(tmp_path_factory, shakespeare):
    tmp = tmp_path_factory.mktemp("rehearsal")
    text = shakespeare.read_text(encoding="utf-8")[:60_000]
    corpus = tmp / "slice.txt"
    corpus.write_text(text[: text.rfind("\n") + 1], encoding="utf-8")
    started = time.monotonic()
    shown = io.StringIO()
    with redirect_stdout(shown), Rehearsal([str(corpus)], SMALL, home=tmp / "airflow") as rehearsal:
        killer = WorkerKiller(rehearsal)
        killer.start()
        succeeded = rehearsal.run()
        killer.stop.set()
        rehearsal.end_clusters()
        (cluster,) = rehearsal.clusters()
        report = read_report(rehearsal.s3, rehearsal.config) if succeeded else {}
        run = report.get("run_folder", "")
        found = {
            "succeeded": succeeded,
            "seconds": time.monotonic() - started,
            "config": rehearsal.config,
            "cluster": cluster,
            "steps": rehearsal.steps(cluster["Id"]),
            "report": report,
            "pointer": latest_pointer(rehearsal.s3, rehearsal.config)[1] if succeeded else {},
            "run": objects(rehearsal, run) if run else {},
            "run_prefix": split_s3(run)[1].rstrip("/") if run else "",
            "killed": killer.killed,
            "wheelhouse": objects(rehearsal, emr_code.wheelhouse_uri(rehearsal.config.emr.code_prefix)),
            "console": shown.getvalue(),
            "log": rehearsal.log,
            "logs": {
                step["Name"]: gzip.decompress(
                    objects(rehearsal, f"{cluster['LogUri']}{cluster['Id']}/steps/{step['Id']}")[
                        f"{split_s3(cluster['LogUri'])[1]}{cluster['Id']}/steps/{step['Id']}/stderr.gz"
                    ]
                ).decode()
                for step in rehearsal.steps(cluster["Id"])
            },
            "kept": rehearsal.keep(tmp / "rehearsals"),
        }
    return found


def run_file(rehearsed, path: str) -> bytes:
    return rehearsed["run"][f"{rehearsed['run_prefix']}/{path}"]


def stats(rehearsed, stage: str) -> dict:
    return json.loads(run_file(rehearsed, f"stats/{stage}.json"))


def test_the_emr_dag_succeeds_on_the_rehearsal(rehearsed):
    assert rehearsed["succeeded"], rehearsed["logs"]


def test_every_stage_ran_as_one_completed_step_on_the_cluster(rehearsed):
    # the train step's killed worker failed a Spark attempt inside the step, not the step
    assert [(step["Name"], step["Status"]["State"]) for step in rehearsed["steps"]] == [
        (stage, "COMPLETED") for stage in EMR_STEP_NAMES
    ]


def test_the_steps_ran_the_dags_arguments_against_the_rehearsal_master(rehearsed):
    config = rehearsed["config"]
    run_id = rehearsed["cluster"]["Name"].removeprefix("gpt-pipeline-")
    for step in rehearsed["steps"]:
        assert (
            step["Config"]["Args"]
            == emr_steps.stage_step(step["Name"].split(" (try ")[0], config, run_id)["HadoopJarStep"]["Args"]
        )
        assert "rehearsal: --master yarn -> spark://127.0.0.1:" in rehearsed["logs"][step["Name"]]


def test_the_first_step_was_added_once_the_cluster_had_started_and_bootstrapped(rehearsed):
    ready = rehearsed["cluster"]["Status"]["Timeline"]["ReadyDateTime"]
    assert rehearsed["steps"][0]["Status"]["Timeline"]["CreationDateTime"] >= ready


def test_prepare_found_the_rehearsals_stand_in_wheelhouse_and_built_none(rehearsed):
    ((key, body),) = rehearsed["wheelhouse"].items()
    assert key.endswith(f"/{wheelhouse.MANIFEST}") and "rehearsal" in json.loads(body)


def test_the_cluster_ends_terminated(rehearsed):
    assert rehearsed["cluster"]["Status"]["State"] == "TERMINATED"


def test_the_preprocessing_stats_come_from_the_real_stages(rehearsed):
    assert stats(rehearsed, "tokenize")["splits"]["train"]["tokens"] > 10_000
    assert stats(rehearsed, "window")["splits"]["train"]["windows"] > 100


def test_training_wrote_one_epochs_row_per_validation_pass(rehearsed):
    rows = list(csv.DictReader(run_file(rehearsed, "stats/epochs.csv").decode().splitlines()))
    assert [int(row["step"]) for row in rows] == [100, 200, 300]
    assert all(np.isfinite(float(row["val_loss"])) for row in rows)


def test_the_cluster_check_found_two_distinct_node_addresses_and_the_nodes_versions(rehearsed):
    found = stats(rehearsed, CLUSTER_CHECK.name)
    nodes = found["nodes"]
    # one worker per node, whichever node each worker's task was placed on
    assert sorted(node["address"] for node in nodes) == ["127.0.0.2", "127.0.0.3"] and found["distinct_addresses"]
    for node in nodes:
        assert set(node["versions"]) == {"python", "numpy", "pyarrow", "pyspark", "tensorflow"}, node
        assert node["versions"]["python"].startswith("3.11.") and node["versions"]["pyspark"].startswith("3.5.")
        assert node["import_errors"] == {} and node["run_folder_error"] is None
    assert found["master"].startswith("spark://127.0.0.1:") and found["yarn"] is None  # no YARN in the rehearsal
    assert not any("/_smoke/" in key for key in rehearsed["run"])  # its probes removed
    # The report shows it: a row per node, with its address and versions.
    assert rehearsed["report"]["cluster_check"]["nodes"] == nodes
    text = run_file(rehearsed, run_folder.REPORT_TEXT).decode()
    assert "## Cluster check\n" in text and "- addresses: each training worker on a node of its own\n" in text
    for node in nodes:
        versions = " | ".join(node["versions"].values())
        assert f"| {node['worker']} | {node['address']} | {versions} |" in text


def test_the_tensorflow_workers_ran_on_two_distinct_node_addresses(rehearsed):
    results = stats(rehearsed, "train")["worker_results"]
    assert sorted(result["host"] for result in results) == ["127.0.0.2", "127.0.0.3"]


def test_a_killed_worker_is_resumed_from_the_last_backup_within_the_step(rehearsed):
    assert rehearsed["killed"] is not None and rehearsed["killed"]["host"] in ("127.0.0.2", "127.0.0.3")
    train = stats(rehearsed, "train")
    assert train["resumed_from_step"] in (100, 200)
    assert train["steps_this_attempt"] == 300 - train["resumed_from_step"]


def test_every_stage_records_its_spark_metrics_with_an_executor_per_core_node(rehearsed):
    nodes = rehearsed["config"].emr.core_instance_count
    for stage in STAGE_NAMES:
        spark = stats(rehearsed, stage)["spark"]
        assert spark["app_id"].startswith("app-") and (spark["tasks"] > 0) == (stage != "generate"), (stage, spark)
        assert spark["executors"] == nodes, (stage, spark)
        assert run_file(rehearsed, spark["event_log"]).startswith(b'{"Event":"SparkListenerLogStart"')
    assert stats(rehearsed, "train")["spark"]["failed_tasks"] >= 1  # the killed worker's barrier task


def test_the_console_shows_each_task_once_as_it_starts_and_ends_and_the_log_has_the_rest(rehearsed):
    console, log = rehearsed["console"], rehearsed["log"]
    assert console.startswith(f"full log:         {log}\n"), console[:2000]
    started = re.findall(r"^task (\w+) +started$", console, re.MULTILINE)
    ended = re.findall(r"^task (\w+) +success +[\d,]+ s$", console, re.MULTILINE)
    assert sorted(started) == sorted(ended) == sorted(set(started)), console  # the sensors' pokes are one line
    assert set(STAGE_NAMES) <= set(started)
    progress = re.findall(r"^train: step [\d,]+ of 300 .*$", console, re.MULTILINE)  # the step sensor's
    assert progress and len(progress) == len(set(progress)), console  # once each, whatever the pokes
    assert max(len(line) for line in console.splitlines()) <= 200, console
    full = log.read_text()
    assert "[DAG TEST] starting task_id=tokenize" in full and "[DAG TEST] starting" not in console
    assert len(full.splitlines()) > 3 * len(console.splitlines())


def test_the_model_loads_and_predicts(rehearsed, tmp_path):
    prefix = f"{rehearsed['run_prefix']}/model/"
    for key, body in rehearsed["run"].items():
        if key.startswith(prefix) and not key.endswith("/"):
            path = tmp_path / key.removeprefix(prefix)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body)
    model, tokenizer = load_model(str(tmp_path))
    ids = tokenizer.encode("ROMEO:").ids
    logits = np.asarray(model(np.array([ids])))
    assert logits.shape[:2] == (1, len(ids)) and np.isfinite(logits).all()


def test_the_sample_is_not_empty(rehearsed):
    assert run_file(rehearsed, "samples.txt").decode().strip()
    assert rehearsed["report"]["sample"].strip()


def test_the_run_folder_and_its_report_page_stay_on_disk_after_the_server_ends(rehearsed):
    run_folder_uri, kept = rehearsed["report"]["run_folder"], rehearsed["kept"]
    assert kept.name == rehearsed["log"].stem
    assert b"<html" in kept_path(kept, f"{run_folder_uri}/{run_folder.REPORT_HTML}").read_bytes()
    kept_stats = json.loads(kept_path(kept, f"{run_folder_uri}/stats/train.json").read_text())
    assert kept_stats == stats(rehearsed, "train")
    assert (kept_path(kept, rehearsed["report"]["s3_uri"]) / run_folder.REPORT_HTML).is_file()  # the record


def test_the_record_and_the_latest_pointer_are_on_s3(rehearsed):
    report = rehearsed["report"]
    assert report["s3_uri"].startswith(f"s3://{rehearsed['config'].s3.bucket}/")
    assert rehearsed["pointer"]["model"] == report["s3_uri"] + "model/"
    assert report["emr"]["cluster_id"] == rehearsed["cluster"]["Id"]
    # collect tracked it in MLflow, model included: the folder markers pyarrow leaves in an S3 lake
    # (`model/hf/`) stopped that once.
    full = rehearsed["log"].read_text()
    assert "MLflow: run " in full and "was not tracked" not in full


def test_a_corpus_that_is_not_utf8_fails_the_run_with_the_stages_message_and_the_cluster_ends(tmp_path, shakespeare):
    """`make rehearse`'s own command, which starts itself again in a private network namespace that
    holds only loopback: every socket of the rehearsal (moto, Spark's master and workers) is there."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "slice.txt").write_text(shakespeare.read_text(encoding="utf-8")[:30_000], encoding="utf-8")
    # Past the first 64 KB, which validate_config sniffs before the cluster: the stage meets it.
    bad = b"Plain text first.\n" * 4000 + "Ce garçon est très âgé\n".encode("latin-1") * 200
    (corpus / "latin1.txt").write_bytes(bad)
    home = tmp_path / "airflow"
    ran: list[subprocess.CompletedProcess] = []
    watched = watch_listening(lambda: ran.append(make_rehearse(corpus / "*.txt", SMALL, home)))
    out, err = ran[0].stdout, ran[0].stderr
    assert ran[0].returncode == 1, err[-3000:]
    kept = Path(re.search(r"^kept: +(\S+) ", out, re.MULTILINE).group(1))
    try:
        check_the_failed_rehearsal(out, err, home, kept)
    finally:
        shutil.rmtree(kept, ignore_errors=True)
    print("\nlistening during the rehearsal:\n  " + "\n  ".join(watched.summary()))
    assert {entry.name for entry in watched.seen.values()} >= {"java", "python"}, watched.summary()
    assert all(entry.netns != watched.here for entry in watched.seen.values()), watched.summary()
    assert list(watched.namespaces.values()) == [["lo"]], watched.namespaces  # one namespace, only loopback
    watched.assert_loopback_only()


def make_rehearse(corpus: Path, settings: list[str], home: Path) -> subprocess.CompletedProcess:
    """`make rehearse CORPUS=… SET=…`'s command, with Airflow's home elsewhere."""
    command = [sys.executable, "-m", "local_platform.rehearsal.rehearse", "--corpus", str(corpus)]
    return subprocess.run(
        [*command, *(f"--set={item}" for item in settings)],
        env={**os.environ, "GPT_PIPELINE_AIRFLOW_HOME": str(home)},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )


def check_the_failed_rehearsal(out: str, err: str, home: Path, kept: Path) -> None:
    (log,) = (home / "logs").glob("rehearse-*.log")
    (error_file,) = kept.rglob(run_folder.error_path("tokenize"))  # the run folder, kept
    error = json.loads(error_file.read_text())["error"]
    assert "latin1.txt" in error and "UTF-8" in error
    assert re.search(rf"^  step {CLUSTER_CHECK.name} +COMPLETED ", out, re.MULTILINE), out  # the cluster check
    assert re.search(r"^  step tokenize +FAILED ", out, re.MULTILINE), out
    assert len(re.findall(r"^  step ", out, re.MULTILINE)) == 2, out  # none after tokenize
    assert re.search(r"^EMR cluster: +j-\w+ \(.*\), TERMINATED: ", out, re.MULTILINE), out
    # spark-submit's Python driver writes to the step's stdout, its stderr merged (Spark's PythonRunner)
    assert f"    | ERROR [tokenize] {error}\n" in out  # the step's stdout.gz
    assert f"ERROR tokenize stopped: {error}"[:199] in out  # what the DAG's task logs
    assert shortened(f"ERROR tokenize failed: tokenize: {error}") in out  # why it failed, above the log
    assert f"AirflowFailException: tokenize: {error}" in log.read_text()  # and in its full log
    assert err.splitlines()[-2:] == [
        f"full log:         {log}",
        f"ERROR the gpt_pipeline rehearsal failed in task tokenize: tokenize: {error}",
    ]
