"""The TensorBoard log of a run folder, on local disk and on S3 (a moto server)."""

from __future__ import annotations

import pytest

from pipeline import lake
from spark_jobs.training import tensorboard_log
from tests.spark_jobs.tensorboard_events import read_events

ROW = {"step": 20, "val_loss": 2.5, "val_nats_per_char": 1.25}


def logged_training(run: str, resumed: bool) -> tensorboard_log.TrainingLog:
    """Steps 1-20 logged every 10 steps, the first step left out of the throughput (it compiles)."""
    log = tensorboard_log.TrainingLog(run, resumed=resumed)
    for step in range(1, 21):
        log.add_step(grad_norm=float(step), seconds=None if step == 1 else 0.5)
        if step % 10 == 0:
            log.progress(step, loss=3.0 - step / 100, learning_rate=step / 1000, tokens_per_step=64)
    log.validation(ROW)
    return log


def test_the_training_log_reaches_the_run_folder_at_each_upload_and_at_its_end(folder):
    log = logged_training(folder, resumed=False)
    log.events.upload()
    [(name, tags)] = read_events(folder).items()
    assert name.startswith("events.out.tfevents.")
    assert tags[tensorboard_log.TRAIN_LOSS] == pytest.approx({10: 2.9, 20: 2.8})
    assert tags[tensorboard_log.LEARNING_RATE] == pytest.approx({10: 0.01, 20: 0.02})
    # Over the steps since the previous point: 1-10, then 11-20.
    assert tags[tensorboard_log.GRAD_NORM_MEAN] == pytest.approx({10: 5.5, 20: 15.5})
    assert tags[tensorboard_log.GRAD_NORM_MAX] == pytest.approx({10: 10, 20: 20})
    assert tags[tensorboard_log.TOKENS_PER_S] == pytest.approx({10: 128, 20: 128})
    assert set(tags[tensorboard_log.MEMORY_RSS]) == {10, 20} and tags[tensorboard_log.MEMORY_PEAK][20] > 50
    assert tags[tensorboard_log.VAL_LOSS] == {20: 2.5} and tags[tensorboard_log.VAL_NATS_PER_CHAR] == {20: 1.25}

    log.add_step(grad_norm=3.0, seconds=None)  # as a resumed attempt's first step, which compiles
    log.progress(21, loss=2.7, learning_rate=0.021, tokens_per_step=64)
    log.events.close()
    [tags] = read_events(folder).values()
    assert tags[tensorboard_log.TRAIN_LOSS] == pytest.approx({10: 2.9, 20: 2.8, 21: 2.7})
    # No step since the previous point was timed: no throughput rather than a made-up one.
    assert 21 not in tags[tensorboard_log.TOKENS_PER_S]


def test_a_resumed_training_keeps_the_earlier_event_files_and_a_new_one_starts_afresh(folder):
    logged_training(folder, resumed=False).events.close()
    logged_training(folder, resumed=True).events.close()
    assert len(read_events(folder)) == 2
    logged_training(folder, resumed=False).events.close()
    assert len(read_events(folder)) == 1


def test_the_samples_are_one_text_summary_that_generating_again_replaces(folder):
    logged_training(folder, resumed=False).events.close()
    tensorboard_log.write_samples(folder, 40, ["ROMEO:\n  *Hark*", "JULIET: no"])
    tensorboard_log.write_samples(folder, 40, ["ROMEO:\n  *Hark* again", "JULIET: yes"])
    events = read_events(folder)
    samples = [tags[tensorboard_log.SAMPLES] for tags in events.values() if tensorboard_log.SAMPLES in tags]
    # Code blocks: TensorBoard's Markdown keeps the lines, their indent and the '*' as they are.
    assert samples == [{40: "    ROMEO:\n      *Hark* again\n\n---\n\n    JULIET: yes"}]
    assert len(events) == 2 and lake.exists(tensorboard_log.folder_uri(folder))


def test_a_sample_keeps_every_line_in_its_code_block_whatever_ends_the_line():
    markdown = tensorboard_log.samples_markdown(["ROMEO:\rHark\r\nno\nmore"])
    assert markdown == "    ROMEO:\n    Hark\n    no\n    more"
