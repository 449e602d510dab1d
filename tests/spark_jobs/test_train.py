"""The train and generate stages end to end: real upstream stages on a slice of tinyshakespeare,
then spark-submit with a barrier stage of two TensorFlow workers over loopback."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from include.local_spark import local_argv, spark_env, submit_stage
from local_platform.moto_s3 import LocalS3
from pipeline import lake, run_folder
from pipeline.config import REPO_ROOT
from pipeline.config_files import load_config
from spark_jobs.generate import load_model
from spark_jobs.model import export_hf
from spark_jobs.training import memory, tensorboard_log
from spark_jobs.training.train_stats import EPOCH_COLUMNS
from spark_jobs.training.trainer import build_optimizer
from tests.listening import Watched, watch_listening
from tests.spark_jobs.tensorboard_events import read_events

# A session's first test using `preprocessed` runs four spark-submit stages; the killed worker's test
# then waits up to 240 + 400 s on its own for a training of 600 steps and its retry.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

TINY_TRAINING = [
    "model.n_layer=1",
    "model.n_head=2",
    "train.batch_size=16",
    "train.max_steps=40",
    "train.warmup_steps=4",
    "train.learning_rate=0.005",
    "train.eval_interval=20",
    "train.eval_batches=4",
    "train.log_interval=10",
    "train.checkpoint_interval=20",
    "generate.max_new_tokens=20",
]


@pytest.fixture(scope="module")
def prepared(preprocessed, code_dir):
    """The preprocessed run folder (tests/conftest.py) with this module's training settings, and
    the packaged code to spark-submit the train and generate stages with."""
    config, run, _ = preprocessed
    return load_config(overrides=[config.model_dump(), *TINY_TRAINING]), run, code_dir


def fresh_run(prepared, name: str, overrides: list[str]) -> tuple:
    """A copy of the prepared run folder with some training settings changed."""
    config, run, code = prepared
    source = Path(lake.local_path(run))
    target = source.with_name(name)
    shutil.copytree(source, target)
    config = load_config(overrides=[config.model_dump(), *overrides])
    lake.write_text(lake.join(target.as_uri(), run_folder.CONFIG_FILE), config.to_json())
    return config, target.as_uri(), code


def epoch_rows(run: str) -> list[dict]:
    return csv_rows(run, run_folder.EPOCHS_CSV_PATH)


def csv_rows(run: str, path: str) -> list[dict]:
    return list(csv.DictReader(lake.read_text(lake.join(run, path)).splitlines()))


def test_two_workers_train_one_model_listening_on_loopback_only_and_generation_repeats(
    prepared, tmp_path, monkeypatch, capfd
):
    config, run, code = fresh_run(prepared, "two-workers", [])
    # A backup of another training: the stage says, in its log and its stats, that it starts over.
    stale = io.BytesIO()
    np.savez(stale, meta=np.array(json.dumps({"step": 20, "rows": [], "fingerprint": "another training"})))
    lake.write_bytes(lake.join(run, run_folder.BACKUP_PATH), stale.getvalue())
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    watched = watch_listening(lambda: submit_stage("train", config, run, code))
    check_listening(watched)
    backup = lake.join(run, run_folder.BACKUP_PATH)
    ignored = f"ignoring the training backup {backup} (step 20): it was taken with other settings or TFRecords"
    assert f"WARNING [train] {ignored}; training starts from step 0" in capfd.readouterr().err
    # The workers leave without interpreter shutdown, so the source files TensorFlow's autograph
    # writes to the temporary folder would stay behind on every run unless the stage removed them.
    assert not list(tmp_path.glob("__autograph_generated_file*"))

    stats = lake.read_json(run_folder.stats_uri(run, "train"))
    workers = stats["worker_results"]
    assert [worker["worker"] for worker in workers] == [0, 1]
    assert all(worker["workers"] == 2 and worker["steps"] == 40 for worker in workers)
    # Each worker trained on its own shards, yet both end with the very same weights.
    assert workers[0]["weights_digest"] == workers[1]["weights_digest"]
    assert stats["resumed_from_step"] == 0 and stats["tokens_per_s"] > 0
    assert [message for message in stats["warnings"] if message.startswith(ignored)]

    rows = epoch_rows(run)
    assert list(rows[0]) == list(EPOCH_COLUMNS)
    assert [int(row["step"]) for row in rows] == [20, 40]
    assert all(row["workers"] == "2" for row in rows)
    first, last = rows[0], rows[-1]
    assert float(last["train_loss"]) < float(first["train_loss"])
    assert float(last["val_loss"]) < float(first["val_loss"])
    # The training loss is the whole batch's mean, not the sum of the workers' (which would be twice it).
    assert all(0.7 < float(row["train_loss"]) / float(row["val_loss"]) < 1.4 for row in rows)
    # Each row's learning rate is the one its last step used (optimizer iteration step - 1).
    _, schedule = build_optimizer(config)
    expected_rates = [float(schedule(19)), float(schedule(39))]
    assert [float(row["learning_rate"]) for row in rows] == pytest.approx(expected_rates, rel=2e-3)  # the CSV rounds
    assert float(last["val_nats_per_char"]) == pytest.approx(stats["final_val_nats_per_char"], rel=1e-5)
    # The last evaluation scores every validation window once, whatever passes came before it.
    assert float(last["val_loss"]) == pytest.approx(whole_split_loss(run), rel=2e-5)
    assert float(first["grad_norm_min"]) <= float(first["grad_norm_mean"]) <= float(first["grad_norm_max"])
    # The first step, which compiles, is timed apart (tests/spark_jobs/test_train_inputs.py: left out of tokens/s).
    assert stats["compile_s"] > 0 and stats["tokens_per_s"] > 0 and float(first["tokens_per_s"]) > 0
    progress = lake.read_json(lake.join(run, run_folder.progress_path("train")))  # what the EMR task logs while it runs
    assert (progress["step"], progress["max_steps"], progress["seconds_left"]) == (40, 40, 0) and progress["loss"] > 0
    # The windows were small enough to stay in memory, and the memory estimate runs were checked
    # against came close to what the workers reached.
    assert all(worker["windows_in_memory"] for worker in workers)
    vocab = lake.read_json(lake.join(run, run_folder.MANIFEST_PATH))["vocab_size"]
    peak = max(float(row["process_memory_max_mb"]) for row in rows)
    assert 0.8 <= memory.worker_peak_mb(config, vocab)["total"] / peak <= 1.3, peak

    model_folder = lake.join(run, run_folder.MODEL_FOLDER)
    saved = {uri.removeprefix(model_folder + "/") for uri in lake.list_files(model_folder)}
    hf = {f"{run_folder.MODEL_HF_FOLDER}/{name}" for name in export_hf.FILES}
    saved_model = {name for name in saved if name.startswith(run_folder.MODEL_SAVED_MODEL_FOLDER + "/")}
    assert saved - saved_model == {run_folder.MODEL_FILE, run_folder.MODEL_TOKENIZER_FILE, *hf}
    assert f"{run_folder.MODEL_SAVED_MODEL_FOLDER}/saved_model.pb" in saved_model
    assert not lake.exists(lake.join(run, run_folder.BACKUP_FOLDER)), "backups are removed once the stage is complete"
    check_tensorboard_log(run, rows, [float(schedule(step - 1)) for step in LOG_STEPS])

    submit_stage("generate", config, run, code)
    sample = lake.read_text(lake.join(run, run_folder.SAMPLES_PATH))
    assert sample.startswith(config.generate.prompt) and len(sample) > len(config.generate.prompt) + 5
    submit_stage("generate", config, run, code)
    assert lake.read_text(lake.join(run, run_folder.SAMPLES_PATH)) == sample
    # Generating again replaced generate's event file: the training's and one text of the samples.
    events = read_events(run)
    [samples] = [tags[tensorboard_log.SAMPLES] for tags in events.values() if tensorboard_log.SAMPLES in tags]
    assert len(events) == 2 and samples == {40: tensorboard_log.samples_markdown([sample.removesuffix("\n")])}


LOG_STEPS = [10, 20, 30, 40]  # train.log_interval=10, train.max_steps=40


def check_listening(watched: Watched) -> None:
    """Every socket the spark-submit JVM, its Python workers and the two TensorFlow workers listened
    on was on loopback or in a namespace holding only loopback, and the workers were contained."""
    print("\nlistening during training:\n  " + "\n  ".join(watched.summary()))
    print(f"other network namespaces: {watched.namespaces}; this machine's addresses: {watched.addresses}")
    assert {entry.name for entry in watched.seen.values()} >= {"java", "python"}, watched.summary()
    workers = [
        entry for entry in watched.seen.values() if "spark_jobs.training.trainer" in watched.commands.get(entry.pid, "")
    ]
    assert len({entry.pid for entry in workers}) == 2, watched.summary()
    watched.assert_loopback_only()
    assert all(entry.netns != watched.here for entry in workers), "the TensorFlow workers are not contained"


def check_tensorboard_log(run: str, rows: list[dict], rates: list[float]) -> None:
    """One event file, the chief's, with a point of every figure every log_interval steps and the
    validation figures of stats/epochs.csv at its rows' steps."""
    [tags] = read_events(run).values()
    progress = (
        tensorboard_log.TRAIN_LOSS,
        tensorboard_log.LEARNING_RATE,
        tensorboard_log.GRAD_NORM_MEAN,
        tensorboard_log.GRAD_NORM_MAX,
        tensorboard_log.TOKENS_PER_S,
        tensorboard_log.MEMORY_RSS,
        tensorboard_log.MEMORY_PEAK,
    )
    assert {tag: sorted(tags[tag]) for tag in progress} == {tag: LOG_STEPS for tag in progress}
    assert all(value > 0 for tag in progress for value in tags[tag].values())
    assert [tags[tensorboard_log.LEARNING_RATE][step] for step in LOG_STEPS] == pytest.approx(rates, rel=1e-6)
    for column, tag in (
        ("val_loss", tensorboard_log.VAL_LOSS),
        ("val_nats_per_char", tensorboard_log.VAL_NATS_PER_CHAR),
    ):
        assert tags[tag] == pytest.approx({int(row["step"]): float(row[column]) for row in rows}, rel=1e-5)
    # Steps 1-20 are the first row's: the largest gradient norm of its two points is the row's.
    first_max = max(tags[tensorboard_log.GRAD_NORM_MAX][step] for step in (10, 20))
    assert first_max == pytest.approx(float(rows[0]["grad_norm_max"]), rel=1e-5)
    mean = np.mean([tags[tensorboard_log.GRAD_NORM_MEAN][step] for step in (10, 20)])
    assert mean == pytest.approx(float(rows[0]["grad_norm_mean"]), rel=1e-5)


def whole_split_loss(run: str) -> float:
    """The saved model's mean loss per token over every validation window, each once."""
    import tensorflow as tf

    from spark_jobs.text.tfrecord import decode_example, iter_records

    model, _ = load_model(lake.join(run, run_folder.MODEL_FOLDER))
    manifest = lake.read_json(lake.join(run, run_folder.MANIFEST_PATH))
    windows = [
        decode_example(record)
        for shard in manifest["splits"]["val"]["shards"]
        for record in iter_records(lake.read_bytes(lake.join(run, run_folder.TFRECORDS_FOLDER, shard)))
    ]
    assert len(windows) == manifest["splits"]["val"]["windows"]
    inputs = np.stack([window["input_ids"] for window in windows]).astype(np.int32)
    targets = np.stack([window["target_ids"] for window in windows]).astype(np.int32)
    logits = model(inputs, training=False)
    return float(tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)))


def run_processes(run: str) -> list[psutil.Process]:
    """Every process working on the run: spark-submit's JVM, the barrier tasks, the TensorFlow workers."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if run in " ".join(process.info["cmdline"] or []):
                found.append(process)
    return found


def training_processes(run: str) -> list[psutil.Process]:
    """The run's TensorFlow workers."""
    return [process for process in run_processes(run) if "spark_jobs.training.trainer" in process.info["cmdline"]]


def test_a_killed_worker_fails_the_attempt_and_the_retry_resumes_from_the_backup(prepared):
    config, run, code = fresh_run(
        prepared, "killed-worker", ["train.max_steps=600", "train.eval_interval=100", "train.checkpoint_interval=100"]
    )
    failure = []
    stage = threading.Thread(target=lambda: _run_capturing(failure, config, run, code))
    stage.start()
    deadline = time.monotonic() + 240
    while not lake.exists(lake.join(run, run_folder.BACKUP_PATH)):
        assert stage.is_alive() and time.monotonic() < deadline, "no backup appeared"
        time.sleep(0.05)
    victim = max(training_processes(run), key=lambda process: process.pid)
    victim.send_signal(signal.SIGKILL)
    stage.join(timeout=400)
    assert not stage.is_alive() and not failure, failure

    stats = lake.read_json(run_folder.stats_uri(run, "train"))
    assert stats["resumed_from_step"] in range(100, 600, 100)
    assert stats["steps_this_attempt"] == 600 - stats["resumed_from_step"]
    rows = epoch_rows(run)
    # The rows before the backup come from the first attempt, the others from the retry.
    assert [int(row["step"]) for row in rows] == [100, 200, 300, 400, 500, 600]
    resumed = [int(row["resumed_from_step"]) for row in rows]
    assert resumed[0] == 0 and resumed[-1] == stats["resumed_from_step"]
    # TensorBoard: the first attempt's event file, uploaded up to its backup, and the retry's.
    first, retry = (tags[tensorboard_log.TRAIN_LOSS] for _, tags in sorted(read_events(run).items()))
    assert max(first) >= stats["resumed_from_step"] and min(retry) == stats["resumed_from_step"] + 10
    assert set(first) | set(retry) == set(range(10, 601, 10))
    # steps.csv, the report's training curve: every log interval once, the first attempt's up to the backup.
    assert [int(row["step"]) for row in csv_rows(run, run_folder.STEPS_CSV_PATH)] == list(range(10, 601, 10))
    assert lake.exists(lake.join(run, run_folder.MODEL_FOLDER, run_folder.MODEL_FILE))
    assert not training_processes(run)


def test_the_local_runner_stopped_by_sigterm_leaves_no_training_behind(prepared, tmp_path):
    config, run, _ = fresh_run(prepared, "sigterm", ["train.max_steps=100000"])
    lake_dir = Path(lake.local_path(run)).parent.parent
    spark_folders = tmp_path / "spark-local"  # where Spark's temporary folders go instead of /tmp
    spark_folders.mkdir()
    with (tmp_path / "runner.log").open("w") as log:  # a file, not a pipe that nobody reads until the end
        runner = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "local_platform.stage_runner",
                "--run-id",
                "sigterm",
                "--set",
                f"lake={lake_dir}",
                "--stages",
                "train",
            ],
            cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
            env={**os.environ, "SPARK_LOCAL_DIRS": str(spark_folders)},
        )
    deadline = time.monotonic() + 240
    while len(training_processes(run)) < 2:
        assert runner.poll() is None and time.monotonic() < deadline, "training did not start"
        time.sleep(0.2)
    runner.send_signal(signal.SIGTERM)  # `kill`, as a CI job's time-out sends it
    runner.wait(timeout=60)
    stderr = (tmp_path / "runner.log").read_text()
    assert runner.returncode == 130 and "stopped: the running stage did not complete" in stderr, stderr[-2000:]
    deadline = time.monotonic() + 30
    while run_processes(run):  # the JVM goes at once; its workers follow it
        assert time.monotonic() < deadline, [process.info["cmdline"][:3] for process in run_processes(run)]
        time.sleep(0.2)
    # spark-submit was stopped with SIGTERM, not killed: Spark's shutdown removed its folders and,
    # with them, the training workers' scratch folders.
    assert not list(spark_folders.iterdir())
    assert not lake.exists(run_folder.stats_uri(run, "train"))


def test_a_diverging_loss_fails_the_stage_at_once_with_a_clear_message(prepared):
    config, run, code = fresh_run(prepared, "diverging", ["train.learning_rate=1e30"])
    completed = subprocess.run(
        local_argv("train", config, run, code), env=spark_env(), capture_output=True, text=True, timeout=600
    )
    # Exit 2 is the stage's own error; Spark giving up after retrying the barrier stage exits 1.
    assert completed.returncode == 2, completed.stderr[-3000:]
    # spark-submit passes the application's stderr on to its stdout.
    assert re.search(
        r"ERROR \[train\] training worker 0: training loss became (nan|inf) at step \d+; lower train.learning_rate",
        completed.stdout,
    ), completed.stdout[-3000:]
    assert "Lost task" not in completed.stderr, "no training task failed, so Spark retried nothing"
    assert not lake.exists(run_folder.stats_uri(run, "train"))
    assert not training_processes(run)


def _run_capturing(failure: list, *args) -> None:
    try:
        submit_stage("train", *args)
    except Exception as error:  # reported by the test thread
        failure.append(error)


def test_a_worker_trains_from_an_s3_run_folder(prepared, monkeypatch, tmp_path):
    """On EMR the run folder is on S3: the worker copies its shards to local disk and saves the
    model back (one worker in a plain process here; the barrier stage is the same either way)."""
    config, run, _ = prepared
    with LocalS3(buckets=("lake",)) as s3:
        for key, value in s3.connection_env().items():
            monkeypatch.setenv(key, value)
        s3_run = "s3://lake/runs/on-s3"
        lake.upload_dir(lake.local_path(run), s3_run)
        config = load_config(
            overrides=[
                config.model_dump(),
                {"lake": "s3://lake", "target": "emr"},
                "train.num_workers=1",
                "train.max_steps=10",
                "train.checkpoint_interval=5",
            ]
        )
        result = run_worker(s3_run, config, tmp_path)
        assert result["steps"] == 10 and result["resumed_from_step"] == 0
        assert lake.exists(lake.join(s3_run, run_folder.EPOCHS_CSV_PATH))
        # The worker leaves its backup: until the stage's driver marks the stage complete, a failure
        # (another worker's, or the driver's) must resume from it rather than from step 0.
        assert lake.exists(lake.join(s3_run, run_folder.BACKUP_PATH))
        [tags] = read_events(s3_run).values()
        assert sorted(tags[tensorboard_log.TRAIN_LOSS]) == [10] and sorted(tags[tensorboard_log.VAL_LOSS]) == [10]
        model, tokenizer = load_model(lake.join(s3_run, run_folder.MODEL_FOLDER))
        assert model.get_layer("embedding").vocab_size == tokenizer.get_vocab_size()

        # Run again reporting and evaluating more often, it resumes: those settings change no weight.
        more_often = load_config(overrides=[config.model_dump(), "train.log_interval=1", "train.eval_interval=2"])
        result = run_worker(s3_run, more_often, tmp_path)
        assert (result["resumed_from_step"], result["steps"], result["warnings"]) == (5, 5, [])
        # The resumed training adds its own event file: TensorBoard shows both (step 10 twice here, as
        # the first training went on past its backup).
        first, resumed = (tags for _, tags in sorted(read_events(s3_run).items()))
        assert sorted(first[tensorboard_log.TRAIN_LOSS]) == [10]
        assert sorted(resumed[tensorboard_log.TRAIN_LOSS]) == [6, 7, 8, 9, 10]
        assert sorted(resumed[tensorboard_log.VAL_LOSS]) == [6, 8, 10]
        # The training curve keeps the first training's points up to the backup, then the resumed one's.
        assert [int(row["step"]) for row in csv_rows(s3_run, run_folder.STEPS_CSV_PATH)] == [6, 7, 8, 9, 10]


def run_worker(run: str, config, tmp_path: Path) -> dict:
    """One training worker in a plain process on the run folder with this config; its result."""
    lake.write_text(lake.join(run, run_folder.CONFIG_FILE), config.to_json())
    result_file = tmp_path / "result.json"
    completed = subprocess.run(
        [sys.executable, "-m", "spark_jobs.training.trainer", "--run-dir", run, "--result", str(result_file)],
        cwd=REPO_ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # TensorFlow's autograph files, which a worker's exit leaves
    )
    assert completed.returncode == 0
    return json.loads(result_file.read_text())
