"""Training statistics: one stats/epochs.csv row per evaluation interval, and the process's
memory and CPU figures that go with it; one stats/steps.csv point per log interval."""

from __future__ import annotations

import csv
import io
import math
import resource

import numpy as np
import psutil

EPOCH_COLUMNS = (
    "epoch",
    "step",
    "duration_ms",
    "train_loss",
    "train_accuracy",
    "val_loss",
    "val_accuracy",
    "val_perplexity",
    "val_nats_per_char",
    "val_bits_per_char",
    "grad_norm_mean",
    "grad_norm_max",
    "grad_norm_min",
    "grad_norm_var",
    "learning_rate",
    "tokens_per_s",
    "process_memory_used_mb",
    "process_memory_total_mb",
    "process_memory_max_mb",
    "process_cpu_load",
    "system_cpu_load",
    "workers",
    "resumed_from_step",
)
# A point of the training curve: the loss of one step, every train.log_interval steps.
STEP_COLUMNS = ("step", "train_loss", "learning_rate", "tokens_per_s")

MB = 1024 * 1024


def peak_rss_mb() -> float:
    """The process's peak resident memory so far (ru_maxrss is in kB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def nats_per_char(loss_per_token: float, tokens: int, chars: int) -> float:
    """Per-character loss, comparable across tokenizers: a token covers tokens/chars of a character."""
    return loss_per_token * tokens / chars


class StepTimes:
    """An attempt's step times, its first step apart: that one traces and compiles (XLA) the
    training step, which takes as long as many steps, so throughput leaves it out."""

    def __init__(self):
        self.compile_s: float | None = None
        self.steps, self.seconds = 0, 0.0

    def add(self, seconds: float) -> bool:
        """Count a step; False for the attempt's first one, which is not timed with the others."""
        if self.compile_s is None:
            self.compile_s = seconds
            return False
        self.steps += 1
        self.seconds += seconds
        return True

    def per_step(self) -> float | None:
        return self.seconds / self.steps if self.steps else None


class IntervalStats:
    """Collects per-step figures between two evaluations."""

    def __init__(self):
        self.process = psutil.Process()
        self.process.cpu_percent()  # starts the process CPU measurement interval
        psutil.cpu_percent()
        self.losses, self.accuracies, self.grad_norms = [], [], []
        self.timed_steps, self.train_seconds = 0, 0.0

    def add_step(self, loss: float, accuracy: float, grad_norm: float, seconds: float | None) -> None:
        """seconds: None for a step left out of the throughput (an attempt's first, see StepTimes)."""
        self.losses.append(loss)
        self.accuracies.append(accuracy)
        self.grad_norms.append(grad_norm)
        if seconds is not None:
            self.timed_steps += 1
            self.train_seconds += seconds

    def row(
        self,
        *,
        epoch: int,
        step: int,
        duration_s: float,
        tokens_per_step: int,
        learning_rate: float,
        val_loss: float,
        val_accuracy: float,
        tokens: int,
        chars: int,
        workers: int,
        resumed_from_step: int,
    ) -> dict:
        norms = np.array(self.grad_norms, dtype=np.float64)
        val_nats = nats_per_char(val_loss, tokens, chars)
        memory = self.process.memory_info()
        return {
            "epoch": epoch,
            "step": step,
            "duration_ms": round(duration_s * 1000, 1),
            "train_loss": float(np.mean(self.losses)),
            "train_accuracy": float(np.mean(self.accuracies)),
            "val_loss": val_loss,
            "val_accuracy": val_accuracy,
            "val_perplexity": math.exp(val_loss),
            "val_nats_per_char": val_nats,
            "val_bits_per_char": val_nats / math.log(2),
            "grad_norm_mean": float(norms.mean()),
            "grad_norm_max": float(norms.max()),
            "grad_norm_min": float(norms.min()),
            "grad_norm_var": float(norms.var()),
            "learning_rate": learning_rate,
            # None (empty) for an interval of the compiling step alone
            "tokens_per_s": self.timed_steps * tokens_per_step / max(self.train_seconds, 1e-9)
            if self.timed_steps
            else None,
            "process_memory_used_mb": memory.rss / MB,
            "process_memory_total_mb": memory.vms / MB,
            "process_memory_max_mb": peak_rss_mb(),
            "process_cpu_load": self.process.cpu_percent() / 100 / psutil.cpu_count(),
            "system_cpu_load": psutil.cpu_percent() / 100,
            "workers": workers,
            "resumed_from_step": resumed_from_step,
        }


def epochs_csv(rows: list[dict]) -> str:
    return csv_text(rows, EPOCH_COLUMNS)


def steps_csv(points: list[dict]) -> str:
    return csv_text(points, STEP_COLUMNS)


def read_steps_csv(text: str, up_to_step: int) -> list[dict]:
    """The points of a steps.csv up to a step (those a resumed training keeps)."""
    points = [
        {"step": int(row["step"])} | {column: float(row[column]) for column in STEP_COLUMNS[1:]}
        for row in csv.DictReader(io.StringIO(text))
    ]
    return [point for point in points if point["step"] <= up_to_step]


def csv_text(rows: list[dict], columns: tuple[str, ...]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: round(value, 6) if isinstance(value, float) else value for key, value in row.items()})
    return out.getvalue()
