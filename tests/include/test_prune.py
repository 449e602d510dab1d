"""The prune_runs task (include/prune.py): keep_runs removing older collected run folders."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from include.promote import promote_record
from include.prune import remove_old_runs
from include.record import RECOLLECTED, StoredRun, collect_record
from pipeline import lake, run_folder
from pipeline.config_files import load_config
from pipeline.stages import STAGE_NAMES
from tests.include.records import (
    LAKE_BUCKET,
    RECORD_BUCKET,
    finished_run,
    latest,
    record,
    run_files,
)


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
        collect_record(run_dir, hook, STAGE_NAMES)

    assert remove_old_runs(books[2], hook) == [books[0]]
    written = StoredRun(books[1], hook).modified(run_folder.REPORT_JSON)  # what stands in for an older report's time
    assert abs((datetime.now(timezone.utc) - written).total_seconds()) < 60
    left = [folder.uri for folder in StoredRun(books[2], hook).siblings()]
    assert left == sorted([*books[1:], sonnets, other_corpus, unfinished, without_setting])
    assert record(s3, "books-0")[f"{run_folder.MODEL_FOLDER}/{run_folder.MODEL_FILE}"] == b"\x00model bytes\xff", (
        "the record on S3 stays"
    )
    assert remove_old_runs(books[2], hook) == []
    collect_record(without_setting, hook, STAGE_NAMES)
    assert remove_old_runs(without_setting, hook) == [], "keep_runs is null: every run stays"


def test_a_folder_prune_runs_cannot_read_is_left_alone_and_the_others_pruned(s3, hook, tmp_path, caplog):
    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}, "run_name=books", "keep_runs=1"])
    old, broken, new = (run_folder.run_dir(config, run_id) for run_id in ("books-old", "books-broken", "books-new"))
    for run_dir in (old, broken, new):
        finished_run(s3, run_dir, run_files(config.to_json()))
        collect_record(run_dir, hook, STAGE_NAMES)
    Path(lake.local_path(lake.join(broken, run_folder.CONFIG_FILE))).write_text("{broken")

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
        collect_record(run_dir, hook, STAGE_NAMES)
    remove = StoredRun.remove

    def fail_on_the_data(folder: StoredRun, *paths: str) -> None:
        if f"{run_folder.TOKENS_FOLDER}/part-0.parquet" in paths:
            raise OSError("the disk went away")
        remove(folder, *paths)

    monkeypatch.setattr(StoredRun, "remove", fail_on_the_data)
    with pytest.raises(OSError, match="went away"):
        remove_old_runs(new, hook)
    left = StoredRun(old, hook)
    assert (
        left.has(f"{run_folder.TOKENS_FOLDER}/part-0.parquet")
        and left.has(run_folder.REMOVING)
        and not left.has(run_folder.REPORT_JSON)
    )
    assert not left.has(run_folder.stats_path("train")), "no stage of it looks complete either"
    monkeypatch.setattr(StoredRun, "remove", remove)
    assert remove_old_runs(new, hook) == [old], "the next prune finishes it"
    assert [folder.uri for folder in StoredRun(new, hook).siblings()] == [new]
    assert left.files() == []


def test_a_run_folder_in_use_is_not_pruned(s3, hook, tmp_path, caplog):
    from include import locks

    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}, "run_name=books", "keep_runs=1"])
    old, new = (run_folder.run_dir(config, run_id) for run_id in ("books-old", "books-new"))
    for run_dir in (old, new):
        finished_run(s3, run_dir, run_files(config.to_json()))
        collect_record(run_dir, hook, STAGE_NAMES)
    with locks.run_folder_held(old, "python -m local_platform.stage_runner"):
        assert remove_old_runs(new, hook) == []
    assert lake.exists(lake.join(old, run_folder.REPORT_JSON))
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
        promote_record(collect_record(run_dir, hook, STAGE_NAMES)["s3_uri"], hook)
    assert latest(s3, "served")["run"] == "served-best"
    assert remove_old_runs(newest, hook) == [worse]
    assert lake.exists(lake.join(best, run_folder.REPORT_JSON))
    assert "keep_runs: kept served-best, whose model the latest pointer names" in caplog.text


def test_a_run_latest_points_at_is_kept_whichever_of_its_records_it_names(s3, hook, tmp_path):
    """A run collected again has a record per collect; the pointer names the run folder all the same."""
    config = load_config(
        overrides=[{"lake": str(tmp_path / "lake")}, "run_name=resumed", "keep_runs=1", "s3.promote=if_better"]
    )
    old, new = (run_folder.run_dir(config, run_id) for run_id in ("resumed-old", "resumed-new"))
    for run_dir, nats_per_char in ((old, 0.9), (new, 1.5), (old, 0.7)):  # the old run trained and collected again
        finished_run(s3, run_dir, run_files(config.to_json(), nats_per_char))
        promote_record(collect_record(run_dir, hook, STAGE_NAMES)["s3_uri"], hook)
    assert latest(s3, "resumed")["record"].startswith(f"s3://{RECORD_BUCKET}/runs/resumed-old{RECOLLECTED}")
    assert remove_old_runs(new, hook) == []
    assert lake.exists(lake.join(old, run_folder.REPORT_JSON))


def test_reports_of_an_older_version_are_ordered_by_their_files_time(s3, hook, tmp_path):
    """Their reports hold no collected_at: the report file's time stands in for it."""
    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}, "run_name=books", "keep_runs=2"])
    runs = [run_folder.run_dir(config, f"books-{name}") for name in ("b-older", "a-newer", "new")]
    for days_ago, run_dir in zip((20, 10, 0), runs, strict=True):
        finished_run(s3, run_dir, run_files(config.to_json()))
        collect_record(run_dir, hook, STAGE_NAMES)
        if days_ago:
            report = StoredRun(run_dir, hook).read_json(run_folder.REPORT_JSON)
            del report["collected_at"]
            path = Path(lake.local_path(lake.join(run_dir, run_folder.REPORT_JSON)))
            path.write_text(json.dumps(report))
            os.utime(path, (time.time() - days_ago * 86400,) * 2)
    assert remove_old_runs(runs[2], hook) == [runs[0]]
