"""The run's report (include/report.py)."""

from __future__ import annotations

from include.report import report_text


def small_report(**fields) -> dict:
    """A collected run's report.json with nothing in it but `fields`."""
    return {
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
        "train": {},
    } | fields


def test_the_report_of_a_resumed_training_says_its_speed_and_time_are_the_last_attempts():
    train = {
        "steps": 300,
        "workers": 2,
        "tokens_per_s": 5123.4,
        "train_wall_s": 8.2,
        "resumed_from_step": 280,
        "steps_this_attempt": 20,
    }
    assert (
        "- training: 300 steps on 2 workers, 5,123 tokens/s, 8 s (resumed from step 280: the speed and time are "
        "of the last 20 steps)\n" in report_text(small_report(train=train))
    )


def test_the_report_counts_the_files_read_apart_from_those_skipped():
    report = small_report(corpus=["file:///books/**/*.txt"], files=37, skipped_files=1)
    assert "- corpus: file:///books/**/*.txt (36 files read, 1 skipped): " in report_text(report)
    assert "- corpus: file:///books/**/*.txt (37 files): " in report_text(report | {"skipped_files": 0})


def test_the_report_has_a_row_of_spark_metrics_per_stage_and_question_marks_where_there_are_none():
    metrics = {
        "app_id": "local-1",
        "executors": 1,
        "jobs": 2,
        "stages": 3,
        "tasks": 1200,
        "failed_tasks": 1,
        "task_seconds": {"min": 0.334, "median": 1.442, "max": 2.543},
        "executor_run_seconds": 10.404,
        "gc_seconds": 0.134,
        "input_bytes": 2_500_000,
        "input_records": 5000,
        "output_bytes": 0,
        "output_records": 0,
        "shuffle_read_bytes": 874_000,
        "shuffle_write_bytes": 900_000,
        "peak_execution_memory_bytes": 16_908_288,
        "event_log": "spark-events/tokenize",
    }
    text = report_text(small_report(spark={"tokenize": metrics, "train": None}))
    assert (
        "| tokenize | 1 | 2 | 3 | 1,200 (1) | 0.33 / 1.44 / 2.54 | 10.4 | 0.1 | 2.5 (5,000) | 0.0 (0) | 0.9 / 0.9 "
        "| 16.9 |\n" in text
    )
    assert "| train | ? | ? | ? | ? | ? | ? | ? | ? | ? | ? | ? |\n" in text
    assert "## Spark" not in report_text(small_report())
