"""The EMR target's Airflow pieces (include/emr_tasks.py) without AWS: a stage task adds its step
only when its try has none to wait on, and logs the training's progress."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from include import emr_tasks
from pipeline import run_folder


class FakeEmr:
    """Just enough of EmrHook for a stage task: the cluster's steps (ListSteps answers newest first,
    in pages) and the steps added."""

    def __init__(self, steps: list[tuple[str, str]]):
        self.steps = [
            {"Id": f"s-{index}", "Name": name, "Status": {"State": state}} for index, (name, state) in enumerate(steps)
        ]
        self.added: list[str] = []
        self.conn = self

    def get_paginator(self, operation: str):
        assert operation == "list_steps"
        return self

    def paginate(self, ClusterId: str):  # noqa: N803 - boto3's name
        newest_first = list(reversed(self.steps))
        return [{"Steps": newest_first[:2]}, {"Steps": newest_first[2:]}]

    def add_job_flow_steps(self, job_flow_id: str, steps: list[dict]) -> list[str]:
        self.added += [step["Name"] for step in steps]
        return [f"s-new-{len(self.added)}"]

    def describe_cluster(self, ClusterId: str) -> dict:  # noqa: N803 - boto3's name
        return {"Cluster": {"Status": {"State": "WAITING"}}}


class FakeStoredRun:
    def __init__(self):
        self.removed: list[str] = []

    def remove(self, relative: str) -> None:
        self.removed.append(relative)


@pytest.mark.parametrize(
    "steps, try_number, waits_on, adds",
    [
        ([], 1, "s-new-1", "window"),  # the first poke of the first try adds the step
        ([("window", "RUNNING")], 1, "s-0", None),  # later pokes wait on it
        ([("window", "FAILED")], 1, "s-0", None),  # ... and see it failed: the try fails
        ([("window", "FAILED")], 2, "s-new-1", "window (try 2)"),  # the retry adds it again
        ([("window", "FAILED"), ("window (try 2)", "PENDING")], 2, "s-1", None),
        ([("window", "RUNNING")], 2, "s-0", None),  # the try's task failed, not its step: wait on it
        ([("window", "COMPLETED")], 2, "s-0", None),
        ([("window", "FAILED"), ("window (try 2)", "FAILED")], 3, "s-new-1", "window (try 3)"),
        (
            [("tokenize", "COMPLETED"), ("window", "RUNNING"), ("export", "FAILED")],
            2,
            "s-1",
            None,
        ),  # other stages' steps do not count
    ],
)
def test_a_stage_task_adds_a_step_only_when_its_try_has_none_to_wait_on(steps, try_number, waits_on, adds):
    sensor = emr_tasks.EmrStageSensor(
        task_id="window",
        stage="window",
        step={"Name": "window", "HadoopJarStep": {}},
        run_dir="s3://lake/runs/r",
        job_flow_id="j-1",
    )
    sensor.__dict__["hook"] = cluster = FakeEmr(steps)  # in place of the cached EmrHook
    run = FakeStoredRun()
    sensor.stored_run = lambda: run
    assert sensor.current_step(emr_tasks.step_name("window", try_number)) == waits_on
    assert cluster.added == ([adds] if adds else [])
    assert run.removed == (
        [run_folder.error_path("window")] if adds else []
    )  # a new step starts without an earlier try's error


def test_training_progress_reads_as_a_line_of_the_task_log():
    progress = {
        "step": 40,
        "max_steps": 300,
        "loss": 4.5,
        "tokens_per_s": 25474,
        "seconds_left": 20,
        "updated_at": "2026-11-22T10:00:00Z",
    }
    assert emr_tasks.describe_progress(progress) == (
        "step 40 of 300 (13%), loss 4.5000, 25,474 tokens/s, under a minute left (at 2026-11-22T10:00:00Z)"
    )
    assert "about 2 min left" in emr_tasks.describe_progress({**progress, "seconds_left": 130})


@pytest.mark.parametrize("stage, reads_progress", [("train", True), ("window", False), ("smoke", False)])
def test_a_waiting_stage_task_reads_the_progress_of_a_stage_that_keeps_one_only(stage, reads_progress, monkeypatch):
    """Each poke that reads the run folder makes an S3 client, most of a poke's CPU: a stage that
    keeps no progress file costs its pokes none."""
    sensor = emr_tasks.EmrStageSensor(
        task_id=stage,
        stage=stage,
        step={"Name": stage, "HadoopJarStep": {}},
        run_dir="s3://lake/runs/r",
        job_flow_id="j-1",
    )
    sensor.__dict__["hook"] = FakeEmr([(stage, "RUNNING")])
    monkeypatch.setattr(emr_tasks.EmrStepSensor, "poke", lambda self, context: False)  # the step still runs
    read = []
    sensor.report_progress = lambda: read.append(stage)
    assert sensor.poke({"ti": SimpleNamespace(try_number=1)}) is False
    assert read == ([stage] if reads_progress else [])
