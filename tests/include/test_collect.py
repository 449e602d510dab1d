"""The collect task's copy to S3 (include/collect.py) through the amazon provider's S3Hook and the
Airflow connection, against a moto server: from a local run folder and from an s3:// one."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from include.collect import RunFolder, collect_record, promote_record, remove_old_runs, report_text
from include.spark_submit import STAGES
from local_platform.moto_s3 import LocalS3
from spark_jobs.lib import lake, run_folder
from spark_jobs.lib.config import load_config
from spark_jobs.lib.errors import PipelineError

RECORD_BUCKET = "gpt-pipeline"
LAKE_BUCKET = "lake-bucket"


@pytest.fixture(scope="module")
def s3():
    with LocalS3(buckets=(RECORD_BUCKET, LAKE_BUCKET)) as server:
        yield server


@pytest.fixture
def hook(s3, monkeypatch):
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    for name, value in s3.connection_env().items():
        monkeypatch.setenv(name, value)
    return S3Hook(aws_conn_id="aws_default")


def finished_run(s3, run_dir: str, files: dict[str, bytes]) -> None:
    """A run folder as the stages leave it, written to local disk or to the lake bucket."""
    for name, data in files.items():
        if run_dir.startswith("s3://"):
            bucket, _, prefix = run_dir.removeprefix("s3://").partition("/")
            s3.client().put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=data)
        else:
            lake.write_bytes(lake.join(run_dir, name), data)


SHORT_FILE_WARNING = "corpus file file:///c/a.txt: its validation part has 4 tokens, fewer than one window (129)"


def run_files(config_json: str, nats_per_char: float = 0.9) -> dict[str, bytes]:
    files = {f"stats/{stage}.json": json.dumps({"duration_s": 1.5}).encode() for stage in STAGES}
    files["stats/window.json"] = json.dumps({"duration_s": 1.5, "warnings": [SHORT_FILE_WARNING]}).encode()
    files["stats/tokenize.json"] = json.dumps(
        {"duration_s": 1.5, "files": 1, "tokenizer": {"vocab_size": 300}}
    ).encode()
    splits = {
        "train": {"chars": 9000, "tokens": 4000, "windows": 60},
        "val": {"chars": 1000, "tokens": 450, "windows": 5},
    }
    files["stats/export.json"] = json.dumps({"duration_s": 1.5, "splits": splits}).encode()
    train = {
        "duration_s": 9.0,
        "final_val_loss": 2.5,
        "final_val_nats_per_char": nats_per_char,
        "steps": 40,
        "workers": 2,
        "parameters": 123456,
        "tokens_per_s": 5123.4,
        "train_wall_s": 8.2,
    }
    files |= {
        "config.json": config_json.encode(),
        "stats/train.json": json.dumps(train).encode(),
        "stats/epochs.csv": b"epoch,step,train_loss,val_loss,val_nats_per_char,learning_rate\n1,20,3.1,2.7,1.0,0.002\n"
        + f"2,40,2.6,2.5,{nats_per_char},0.0002\n".encode(),
        "model/model.keras": b"\x00model bytes\xff",
        "model/tokenizer.json": b"{}",
        "samples.txt": "The man starts with a sample".encode(),
        "tokens/part-0.parquet": b"not part of the record",
    }
    return files


def record(s3, run_name: str) -> dict[str, bytes]:
    client, prefix = s3.client(), f"runs/{run_name}/"
    keys = [item["Key"] for item in client.list_objects_v2(Bucket=RECORD_BUCKET, Prefix=prefix)["Contents"]]
    return {key[len(prefix) :]: client.get_object(Bucket=RECORD_BUCKET, Key=key)["Body"].read() for key in keys}


@pytest.mark.parametrize("lake_root", ["local", f"s3://{LAKE_BUCKET}/lake"])
def test_collect_copies_the_record_and_writes_the_report(s3, hook, tmp_path, lake_root):
    # A run folder on S3 is the EMR target's.
    on_s3 = {"lake": lake_root, "target": "emr"}
    config = load_config(overrides=[{"lake": str(tmp_path / "lake")} if lake_root == "local" else on_s3])
    run_dir = run_folder.run_dir(config, f"run-{len(lake_root)}")
    files = run_files(config.to_json())
    finished_run(s3, run_dir, files)

    report = collect_record(run_dir, hook, STAGES)

    name = run_dir.rsplit("/", 1)[1]
    copied = record(s3, name)
    kept = {key: data for key, data in files.items() if not key.startswith("tokens/")}
    assert {key: copied[key] for key in kept} == kept
    assert set(copied) == set(kept) | {"report.json", "report.md"}
    assert json.loads(copied["report.json"]) == report
    assert report["s3_uri"] == f"s3://{RECORD_BUCKET}/runs/{name}/"
    assert (report["final_val_loss"], report["val_nats_per_char"]) == (2.5, 0.9)
    assert report["stage_seconds"] == {stage: (9.0 if stage == "train" else 1.5) for stage in STAGES}
    assert report["sample"] == "The man starts with a sample"
    text = copied["report.md"].decode()
    # The run folder keeps the report too, until a stage runs there again.
    assert lake.read_text(lake.join(run_dir, "report.md")) == text
    assert json.loads(lake.read_text(lake.join(run_dir, "report.json"))) == report
    run_folder.clear_stage(run_dir, "generate")
    assert not lake.exists(lake.join(run_dir, "report.md")) and not lake.exists(lake.join(run_dir, "report.json"))
    assert "Final validation loss: **2.5000 nats/token**, **0.9000 nats/char**." in text
    assert f"- corpus: {config.corpus[0]} (1 file): train 9,000 characters, 4,000 tokens, 60 windows; val 1,000" in text
    assert "- model: 4 layers, 4 heads, width 128, 128 tokens of context, vocabulary 300: 123,456 parameters" in text
    assert "- training: 40 steps on 2 workers, 5,123 tokens/s, 8 s\n" in text
    assert "| 20 | 3.1 | 2.7 | 1 | 0.002 |\n| 40 | 2.6 | 2.5 | 0.9 | 0.0002 |\n" in text
    assert report["evaluations"][-1] == {
        "step": 40,
        "train_loss": 2.6,
        "val_loss": 2.5,
        "val_nats_per_char": 0.9,
        "learning_rate": 0.0002,
    }
    # Stage warnings travel with the report, so that a run on EMR shows them too.
    assert report["warnings"] == [f"[window] {SHORT_FILE_WARNING}"]
    assert f"## Warnings\n\n- [window] {SHORT_FILE_WARNING}\n" in copied["report.md"].decode()


def test_the_report_of_a_resumed_training_says_its_speed_and_time_are_the_last_attempts():
    report = {
        "run": "r",
        "final_val_loss": 2.5,
        "val_nats_per_char": 0.9,
        "s3_uri": "s3://b/runs/r/",
        "run_folder": "f",
        "corpus": ["file:///c.txt"],
        "files": 1,
        "vocab_size": 300,
        "splits": {},
        "stage_seconds": {},
        "warnings": [],
        "evaluations": [],
        "sample": "",
        "model": {"n_layer": 4, "n_head": 4, "dim": 128, "block_size": 128},
        "train": {
            "steps": 300,
            "workers": 2,
            "tokens_per_s": 5123.4,
            "train_wall_s": 8.2,
            "resumed_from_step": 280,
            "steps_this_attempt": 20,
        },
    }
    assert (
        "- training: 300 steps on 2 workers, 5,123 tokens/s, 8 s (resumed from step 280: the speed and time are "
        "of the last 20 steps)\n" in report_text(report)
    )


def test_the_report_counts_the_files_read_apart_from_those_skipped():
    report = {
        "run": "r",
        "final_val_loss": 2.5,
        "val_nats_per_char": 0.9,
        "s3_uri": "s3://b/runs/r/",
        "run_folder": "f",
        "corpus": ["file:///books/**/*.txt"],
        "files": 37,
        "skipped_files": 1,
        "vocab_size": 300,
        "splits": {},
        "stage_seconds": {},
        "warnings": [],
        "evaluations": [],
        "sample": "",
        "model": {"n_layer": 4, "n_head": 4, "dim": 128, "block_size": 128},
        "train": {},
    }
    assert "- corpus: file:///books/**/*.txt (36 files read, 1 skipped): " in report_text(report)
    assert "- corpus: file:///books/**/*.txt (37 files): " in report_text(report | {"skipped_files": 0})


def test_a_run_folder_that_cannot_take_the_report_still_gets_a_whole_record(s3, hook, tmp_path, monkeypatch, caplog):
    from include import collect

    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}])
    run_dir = run_folder.run_dir(config, "read-only")
    finished_run(s3, run_dir, run_files(config.to_json()))

    def refuse(self, relative, data):
        raise PermissionError(f"cannot write {relative}")

    monkeypatch.setattr(collect.RunFolder, "write", refuse)
    report = collect_record(run_dir, hook, STAGES)
    assert set(record(s3, "read-only")) >= {"report.json", "report.md"} and report["final_val_loss"] == 2.5
    assert f"the report was not copied to the run folder {run_dir}: cannot write report.md" in caplog.text


def test_an_unfinished_run_is_not_collected(s3, hook, tmp_path):
    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}])
    run_dir = run_folder.run_dir(config, "unfinished")
    files = run_files(config.to_json())
    del files["samples.txt"]
    finished_run(s3, run_dir, files)
    with pytest.raises(PipelineError, match="has no samples.txt: the run did not complete"):
        collect_record(run_dir, hook, STAGES)


def test_a_missing_bucket_is_named(s3, hook, tmp_path):
    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}, "s3.bucket=no-such-bucket"])
    run_dir = run_folder.run_dir(config, "nowhere")
    finished_run(s3, run_dir, run_files(config.to_json()))
    with pytest.raises(PipelineError, match="s3.bucket: bucket 'no-such-bucket' does not exist"):
        collect_record(run_dir, hook, STAGES)


def collected_run(s3, hook, tmp_path, run_id: str, nats_per_char: float, *settings: str) -> dict:
    """The report of a run collected to the record bucket, named `books` whatever its id."""
    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}, "run_name=books", *settings])
    run_dir = run_folder.run_dir(config, run_id)
    finished_run(s3, run_dir, run_files(config.to_json(), nats_per_char))
    return collect_record(run_dir, hook, STAGES)


def latest(s3, run_name: str = "books") -> dict:
    return json.loads(s3.client().get_object(Bucket=RECORD_BUCKET, Key=f"runs/latest/{run_name}.json")["Body"].read())


def test_promote_points_latest_at_each_new_model_and_keeps_the_one_before(s3, hook, tmp_path):
    first = collected_run(s3, hook, tmp_path, "promote-1", 0.9)
    decision = promote_record(first["s3_uri"], hook)
    assert decision["promoted"] and decision["reason"] == "the first model of this run name"
    assert decision["latest"] == f"s3://{RECORD_BUCKET}/runs/latest/books.json"
    pointer = latest(s3)
    assert decision["pointer"] == pointer
    assert pointer["run"] == "promote-1" and pointer["model"] == first["s3_uri"] + "model/"
    assert pointer["val_nats_per_char"] == 0.9 and "previous" not in pointer
    # The pointer leads to a model that is there.
    model = s3.client().get_object(Bucket=RECORD_BUCKET, Key=pointer["model"].split("/", 3)[3] + "model.keras")
    assert model["Body"].read() == b"\x00model bytes\xff"

    worse = collected_run(s3, hook, tmp_path, "promote-2", 1.4)  # s3.promote: always, the default
    decision = promote_record(worse["s3_uri"], hook)
    assert decision["promoted"] and decision["reason"] == "s3.promote: always"
    assert latest(s3)["run"] == "promote-2"
    assert latest(s3)["previous"] == {"run": "promote-1", "record": first["s3_uri"], "val_nats_per_char": 0.9}

    # A retried promote (say its first attempt wrote the pointer, then lost its worker) keeps it as it is.
    pointer = latest(s3)
    again = promote_record(worse["s3_uri"], hook)
    assert again["promoted"] and again["reason"] == "latest points at this run's model already"
    assert latest(s3) == again["pointer"] == pointer


def test_promote_if_better_keeps_a_better_model_and_takes_an_equal_or_better_one(s3, hook, tmp_path):
    policy = "s3.promote=if_better"
    promote_record(collected_run(s3, hook, tmp_path, "other-name", 0.5, policy, "run_name=sonnets")["s3_uri"], hook)
    # Each run name has its own pointer: a better model of another corpus does not count.
    first = promote_record(collected_run(s3, hook, tmp_path, "gate-1", 1.0, policy, "run_name=plays")["s3_uri"], hook)
    assert first["promoted"] and first["reason"] == "the first model of this run name"

    worse = collected_run(s3, hook, tmp_path, "gate-2", 1.2, policy, "run_name=plays")
    decision = promote_record(worse["s3_uri"], hook)
    assert not decision["promoted"]
    assert decision["reason"] == (
        "validation loss 1.2 nats/char is higher than 1.0 of gate-1, which latest points at (s3.promote: if_better)"
    )
    assert latest(s3, "plays")["run"] == decision["pointer"]["run"] == "gate-1"

    for run_id, nats_per_char in (("gate-3", 1.0), ("gate-4", 0.8)):
        report = collected_run(s3, hook, tmp_path, run_id, nats_per_char, policy, "run_name=plays")
        decision = promote_record(report["s3_uri"], hook)
        assert decision["promoted"], decision["reason"]
        assert decision["reason"].startswith(f"validation loss {nats_per_char} nats/char is no higher than")
        assert latest(s3, "plays")["run"] == run_id
    assert latest(s3, "plays")["previous"]["run"] == "gate-3"
    assert latest(s3, "sonnets")["run"] == "other-name"


def test_a_run_collected_again_replaces_its_record_and_the_pointer_follows(s3, hook, tmp_path, monkeypatch):
    """Its later tasks cleared, a run trains again and collect copies over its record: until the new
    report is in, the record is not whole, and latest, which pointed at the old model, now points at
    the new one with its figures, even under if_better (the old model is gone)."""
    first = collected_run(s3, hook, tmp_path, "again", 0.9, "s3.promote=if_better", "run_name=epics")
    assert promote_record(first["s3_uri"], hook)["promoted"]
    run_dir = first["run_folder"]
    lake.write_bytes(lake.join(run_dir, "model/model.keras"), b"retrained")
    lake.delete(lake.join(run_dir, "model/tokenizer.json"))
    lake.write_bytes(lake.join(run_dir, "model/weights.h5"), b"a new file")
    train = lake.read_json(run_folder.stats_uri(run_dir, "train")) | {"final_val_nats_per_char": 1.7}
    lake.write_json(run_folder.stats_uri(run_dir, "train"), train)
    load_bytes = hook.load_bytes

    def fail_on_the_model(data, key, **kwargs):
        if key.endswith("model/model.keras"):
            raise OSError("connection reset")
        load_bytes(data, key=key, **kwargs)

    monkeypatch.setattr(hook, "load_bytes", fail_on_the_model)
    with pytest.raises(OSError, match="reset"):
        collect_record(run_dir, hook, STAGES)
    with pytest.raises(PipelineError, match="has no report.json: collect did not finish"):
        promote_record(first["s3_uri"], hook)
    monkeypatch.setattr(hook, "load_bytes", load_bytes)

    again = collect_record(run_dir, hook, STAGES)
    files = record(s3, "again")
    assert files["model/model.keras"] == b"retrained" and "model/tokenizer.json" not in files
    decision = promote_record(again["s3_uri"], hook)
    assert decision["promoted"] and decision["reason"].startswith("this run was collected again")
    pointer = latest(s3, "epics")
    assert pointer["val_nats_per_char"] == 1.7 and pointer["collected_at"] == again["collected_at"]
    assert promote_record(again["s3_uri"], hook)["reason"] == "latest points at this run's model already"


def test_promote_refuses_a_record_collect_has_not_finished(s3, hook, tmp_path):
    report = collected_run(s3, hook, tmp_path, "half-copied", 0.9, "run_name=poems")
    key = report["s3_uri"].split("/", 3)[3] + "report.json"
    s3.client().delete_object(Bucket=RECORD_BUCKET, Key=key)
    with pytest.raises(PipelineError, match=r"has no report.json: collect did not finish"):
        promote_record(report["s3_uri"], hook)
    assert "Contents" not in s3.client().list_objects_v2(Bucket=RECORD_BUCKET, Prefix="runs/latest/poems")


@pytest.mark.parametrize("lake_root", ["local", f"s3://{LAKE_BUCKET}/keep"])
def test_keep_runs_removes_the_oldest_collected_runs_of_the_run_name(s3, hook, tmp_path, lake_root):
    lake_setting = {"lake": str(tmp_path / "lake")} if lake_root == "local" else {"lake": lake_root, "target": "emr"}

    def finished(run_id: str, *settings: str) -> str:
        config = load_config(overrides=[lake_setting, *settings])
        run_dir = run_folder.run_dir(config, run_id)
        finished_run(s3, run_dir, run_files(config.to_json()))
        return run_dir

    books = [finished(f"books-{number}", "run_name=books", "keep_runs=2") for number in range(3)]
    sonnets = finished("sonnets-0", "run_name=sonnets", "keep_runs=2")
    # Another corpus of the same name (two folders' books.txt): not a retraining of this one.
    other_corpus = finished("books-other-corpus", {"corpus": "/elsewhere/books.txt"}, "keep_runs=2")
    unfinished = finished("books-unfinished", "run_name=books", "keep_runs=2")  # never collected
    without_setting = finished("books-kept", "run_name=books")
    for run_dir in [sonnets, other_corpus, *books]:
        collect_record(run_dir, hook, STAGES)

    assert remove_old_runs(books[2], hook) == [books[0]]
    written = RunFolder(books[1], hook).modified("report.json")  # what stands in for an older report's time
    assert abs((datetime.now(timezone.utc) - written).total_seconds()) < 60
    left = [folder.uri for folder in RunFolder(books[2], hook).siblings()]
    assert left == sorted([*books[1:], sonnets, other_corpus, unfinished, without_setting])
    assert record(s3, "books-0")["model/model.keras"] == b"\x00model bytes\xff", "the record on S3 stays"
    assert remove_old_runs(books[2], hook) == []
    collect_record(without_setting, hook, STAGES)
    assert remove_old_runs(without_setting, hook) == [], "keep_runs is null: every run stays"


def test_a_folder_prune_runs_cannot_read_is_left_alone_and_the_others_pruned(s3, hook, tmp_path, caplog):
    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}, "run_name=books", "keep_runs=1"])
    old, broken, new = (run_folder.run_dir(config, run_id) for run_id in ("books-old", "books-broken", "books-new"))
    for run_dir in (old, broken, new):
        finished_run(s3, run_dir, run_files(config.to_json()))
        collect_record(run_dir, hook, STAGES)
    Path(lake.local_path(lake.join(broken, "config.json"))).write_text("{broken")

    assert remove_old_runs(new, hook) == [old]
    assert lake.exists(broken) and f"keep_runs: left {broken} alone, it cannot be read" in caplog.text


@pytest.mark.parametrize("lake_root", ["local", f"s3://{LAKE_BUCKET}/half"])
def test_a_run_folder_half_removed_does_not_look_collected_and_the_next_prune_finishes_it(
    s3, hook, tmp_path, monkeypatch, lake_root
):
    lake_setting = {"lake": str(tmp_path / "lake")} if lake_root == "local" else {"lake": lake_root, "target": "emr"}
    config = load_config(overrides=[lake_setting, "keep_runs=1"])
    old, new = (run_folder.run_dir(config, run_id) for run_id in ("books-old", "books-new"))
    for run_dir in (old, new):
        finished_run(s3, run_dir, run_files(config.to_json()))
        collect_record(run_dir, hook, STAGES)
    remove = RunFolder.remove

    def fail_on_the_data(folder: RunFolder, *paths: str) -> None:
        if "tokens/part-0.parquet" in paths:
            raise OSError("the disk went away")
        remove(folder, *paths)

    monkeypatch.setattr(RunFolder, "remove", fail_on_the_data)
    with pytest.raises(OSError, match="went away"):
        remove_old_runs(new, hook)
    left = RunFolder(old, hook)
    assert left.has("tokens/part-0.parquet") and left.has("REMOVING") and not left.has("report.json")
    assert not left.has("stats/train.json"), "no stage of it looks complete either"
    monkeypatch.setattr(RunFolder, "remove", remove)
    assert remove_old_runs(new, hook) == [old], "the next prune finishes it"
    assert [folder.uri for folder in RunFolder(new, hook).siblings()] == [new]
    assert left.files() == []


def test_a_run_folder_in_use_is_not_pruned(s3, hook, tmp_path, caplog):
    from include import locks

    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}, "run_name=books", "keep_runs=1"])
    old, new = (run_folder.run_dir(config, run_id) for run_id in ("books-old", "books-new"))
    for run_dir in (old, new):
        finished_run(s3, run_dir, run_files(config.to_json()))
        collect_record(run_dir, hook, STAGES)
    with locks.run_folder_held(old, "python -m local_platform.stage_runner"):
        assert remove_old_runs(new, hook) == []
    assert lake.exists(lake.join(old, "report.json"))
    assert (
        f"keep_runs: left {old} alone: run folder {old} is in use by python -m local_platform.stage_runner"
        in caplog.text
    )
    assert remove_old_runs(new, hook) == [old]
    assert not lake.exists(old)


def test_the_run_folder_latest_points_at_is_kept_whatever_its_age(s3, hook, tmp_path, caplog):
    """With s3.promote: if_better the served model may be older than the newest keep_runs runs: its
    folder stays (under make airflow, the S3 record ends with the command)."""
    config = load_config(
        overrides=[{"lake": str(tmp_path / "lake")}, "run_name=served", "keep_runs=1", "s3.promote=if_better"]
    )
    best, worse, newest = (
        run_folder.run_dir(config, run_id) for run_id in ("served-best", "served-worse", "served-new")
    )
    for run_dir, nats_per_char in ((best, 0.8), (worse, 1.5), (newest, 1.4)):
        finished_run(s3, run_dir, run_files(config.to_json(), nats_per_char))
        promote_record(collect_record(run_dir, hook, STAGES)["s3_uri"], hook)
    assert latest(s3, "served")["run"] == "served-best"
    assert remove_old_runs(newest, hook) == [worse]
    assert lake.exists(lake.join(best, "report.json"))
    assert "keep_runs: kept served-best, whose model the latest pointer names" in caplog.text


def test_reports_of_an_older_version_are_ordered_by_their_files_time(s3, hook, tmp_path):
    """Their reports hold no collected_at: the report file's time stands in for it."""
    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}, "run_name=books", "keep_runs=2"])
    runs = [run_folder.run_dir(config, f"books-{name}") for name in ("b-older", "a-newer", "new")]
    for days_ago, run_dir in zip((20, 10, 0), runs, strict=True):
        finished_run(s3, run_dir, run_files(config.to_json()))
        collect_record(run_dir, hook, STAGES)
        if days_ago:
            report = RunFolder(run_dir, hook).read_json("report.json")
            del report["collected_at"]
            path = Path(lake.local_path(lake.join(run_dir, "report.json")))
            path.write_text(json.dumps(report))
            os.utime(path, (time.time() - days_ago * 86400,) * 2)
    assert remove_old_runs(runs[2], hook) == [runs[0]]


@pytest.mark.parametrize("prefix", ["", "/", "records/2026"])
def test_make_run_reads_the_report_collect_wrote_whatever_the_prefix(s3, hook, tmp_path, prefix):
    from local_platform.airflow_runner import read_report

    bucket = f"prefix-{len(prefix)}"
    s3.client().create_bucket(Bucket=bucket)
    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}, f"s3.bucket={bucket}", f"s3.prefix={prefix}"])
    run_dir = run_folder.run_dir(config, "books-1")
    finished_run(s3, run_dir, run_files(config.to_json()))
    report = collect_record(run_dir, hook, STAGES)
    assert read_report(s3, config) == report
