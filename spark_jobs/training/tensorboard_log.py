"""The run's TensorBoard log, tensorboard/ in the run folder: the training's scalars (written by
the chief worker) and the generated samples as text (written by the generate stage).

tf.summary writes only to local disk here (TensorFlow's S3 file system is not installed), so each
writer writes to a local folder and copies its event file to the run folder, file:// or s3://.
Every writer makes an event file of its own, named by its time and process; TensorBoard reads a
folder's event files as one run.

The summaries are written with tf.summary.write and the metadata of TensorBoard's scalar and text
plugins: tf.summary.scalar and tf.summary.text are TensorBoard's own code, and the stages do not
need the tensorboard package (on EMR nodes either), only its viewer does.
"""

from __future__ import annotations

import posixpath
import re
import shutil
import tempfile

import numpy as np
import psutil

from pipeline import lake, run_folder
from spark_jobs.training.train_stats import MB, peak_rss_mb

# Written every train.log_interval steps and at the last step.
TRAIN_LOSS = "loss/train"
LEARNING_RATE = "optimizer/learning_rate"
GRAD_NORM_MEAN = "optimizer/grad_norm_mean"
GRAD_NORM_MAX = "optimizer/grad_norm_max"
TOKENS_PER_S = "speed/tokens_per_s"
MEMORY_RSS = "memory/rss_mb"
MEMORY_PEAK = "memory/peak_rss_mb"
# Written with each validation row of stats/epochs.csv (every train.eval_interval steps and at the last).
VAL_LOSS = "loss/val_per_token"
VAL_NATS_PER_CHAR = "loss/val_nats_per_char"
# The generate stage's, at the training's last step.
SAMPLES = "samples"
# The end of the generate stage's event file names, so that running it again replaces its file.
SAMPLES_SUFFIX = ".samples.v2"
MARKDOWN_LINE_ENDING = re.compile(r"\r\n|\r|\n")


def folder_uri(run: str) -> str:
    return lake.join(run, run_folder.TENSORBOARD_FOLDER)


class EventFile:
    """A tf.summary writer on a local folder whose event file is copied to the run's tensorboard/."""

    def __init__(self, run: str, filename_suffix: str = ".v2"):
        import tensorflow as tf

        self.tf, self.uri = tf, folder_uri(run)
        self.local = tempfile.mkdtemp(prefix="gpt-pipeline-tensorboard-")
        self.writer = tf.summary.create_file_writer(self.local, filename_suffix=filename_suffix)

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        """One point per tag at `step`; a None value (a figure the interval lacks) is left out."""
        for tag, value in values.items():
            if value is not None:
                self.write(step, tag, self.tf.constant(value, self.tf.float32), "scalars")

    def text(self, step: int, tag: str, text: str) -> None:
        """Text, which TensorBoard renders as Markdown."""
        self.write(step, tag, self.tf.constant(text), "text")

    def write(self, step: int, tag: str, tensor, plugin: str) -> None:
        metadata = self.tf.compat.v1.SummaryMetadata(
            plugin_data=self.tf.compat.v1.SummaryMetadata.PluginData(plugin_name=plugin)
        )
        with self.writer.as_default():
            self.tf.summary.write(tag, tensor, step=step, metadata=metadata)

    def upload(self) -> None:
        self.writer.flush()
        lake.upload_dir(self.local, self.uri)

    def close(self) -> None:
        """Upload the whole file and remove the local copy."""
        self.writer.close()
        lake.upload_dir(self.local, self.uri)
        shutil.rmtree(self.local, ignore_errors=True)


class TrainingLog:
    """The chief worker's scalars. A training that starts from step 0 removes the run's earlier
    log; one resumed from a backup keeps it, and the backup's step is uploaded before the backup
    is written, so the earlier event files hold every step up to it."""

    def __init__(self, run: str, resumed: bool):
        if not resumed:
            lake.delete(folder_uri(run))
        self.events = EventFile(run)
        self.process = psutil.Process()
        self.grad_norms: list[float] = []
        self.timed_steps, self.seconds = 0, 0.0

    def add_step(self, grad_norm: float, seconds: float | None) -> None:
        """seconds: None for an attempt's first step, which compiles (train_stats.StepTimes)."""
        self.grad_norms.append(grad_norm)
        if seconds is not None:
            self.timed_steps += 1
            self.seconds += seconds

    def progress(self, step: int, loss: float, learning_rate: float, tokens_per_step: int) -> None:
        """The step's loss and the figures of the steps since the previous progress point."""
        norms = np.array(self.grad_norms)
        self.events.scalars(
            step,
            {
                TRAIN_LOSS: loss,
                LEARNING_RATE: learning_rate,
                GRAD_NORM_MEAN: float(norms.mean()),
                GRAD_NORM_MAX: float(norms.max()),
                TOKENS_PER_S: self.timed_steps * tokens_per_step / self.seconds if self.timed_steps else None,
                MEMORY_RSS: self.process.memory_info().rss / MB,
                MEMORY_PEAK: peak_rss_mb(),
            },
        )
        self.grad_norms, self.timed_steps, self.seconds = [], 0, 0.0

    def validation(self, row: dict) -> None:
        """A stats/epochs.csv row's validation figures."""
        self.events.scalars(row["step"], {VAL_LOSS: row["val_loss"], VAL_NATS_PER_CHAR: row["val_nats_per_char"]})


def write_samples(run: str, step: int, samples: list[str]) -> None:
    """The generated samples as one text summary at `step`, replacing an earlier generate stage's."""
    for uri in lake.list_files(folder_uri(run)):
        if posixpath.basename(uri).endswith(SAMPLES_SUFFIX):
            lake.delete(uri)
    events = EventFile(run, filename_suffix=SAMPLES_SUFFIX)
    events.text(step, SAMPLES, samples_markdown(samples))
    events.close()


def samples_markdown(samples: list[str]) -> str:
    """TensorBoard renders text as Markdown: each sample as a code block keeps its lines and characters.
    Every Markdown line ending (\\n, \\r, \\r\\n) starts an indented line: a bare \\r would end the block."""
    blocks = ["\n".join("    " + line for line in MARKDOWN_LINE_ENDING.split(sample)) for sample in samples]
    return "\n\n---\n\n".join(blocks)
