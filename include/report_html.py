"""report.html: the run's report as one page (include/templates/report.html.j2) with inline SVG
charts, so that the one file shows whole wherever it is opened, downloaded from S3 included.

The functions here turn report.json's figures into what the template draws: each chart's points
and axis ticks in the SVG's own coordinates, the timeline's bars, the Spark metrics' cells."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import jinja2

from include.report import cluster_check_findings, cluster_check_rows, figure, files_text

TEMPLATES = Path(__file__).parent / "templates"
TEMPLATE = "report.html.j2"
# A chart's size and its plotting area inside it (the rest holds the axes' labels).
WIDTH, HEIGHT = 520, 240
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 12, 36
TIMELINE_WIDTH = 1040
TIMELINE_ROW = 26  # pixels per bar
TIMELINE_LABEL = 170  # pixels left of the bars for their names


@dataclass(frozen=True)
class Scale:
    """A linear map from data values [low, high] to pixels [start, end]."""

    low: float
    high: float
    start: float
    end: float

    def __call__(self, value: float) -> float:
        span = self.high - self.low
        return round(self.start + (value - self.low) / span * (self.end - self.start), 1)


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round values covering [low, high], about `count` of them: 0, 0.5, 1, ... or 0, 2000, 4000, ..."""
    if high <= low:
        low, high = (low - 1, high + 1) if low == 0 else (low - abs(low) / 2, high + abs(high) / 2)
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(factor * magnitude for factor in (1, 2, 2.5, 5, 10) if factor * magnitude >= raw)
    first = math.floor(low / step)
    last = math.ceil(high / step - 1e-9)  # a high on a tick ends there
    return [round(index * step, 12) for index in range(first, last + 1)]


def line_chart(series: dict[str, list[tuple[float, float]]], x_label: str, y_label: str) -> dict:
    """A chart of `series` ({name: [(x, y), ...]}): each one's points and polyline, and the axes'
    ticks, in the SVG's coordinates. Series with no points are left out."""
    series = {name: points for name, points in series.items() if points}
    xs = [x for points in series.values() for x, _ in points] or [0.0]
    ys = [y for points in series.values() for _, y in points] or [0.0]
    # Both axes from zero: a reader compares magnitudes (how far the loss fell), not only shapes.
    x_ticks, y_ticks = nice_ticks(min(0.0, min(xs)), max(xs)), nice_ticks(min(0.0, min(ys)), max(ys))
    x = Scale(x_ticks[0], x_ticks[-1], LEFT, WIDTH - RIGHT)
    y = Scale(y_ticks[0], y_ticks[-1], HEIGHT - BOTTOM, TOP)
    return {
        "width": WIDTH,
        "height": HEIGHT,
        "plot": {"left": LEFT, "right": WIDTH - RIGHT, "top": TOP, "bottom": HEIGHT - BOTTOM},
        "x_label": x_label,
        "y_label": y_label,
        "x_ticks": [{"at": x(value), "label": tick_label(value)} for value in x_ticks],
        "y_ticks": [{"at": y(value), "label": tick_label(value)} for value in y_ticks],
        "series": [
            {
                "name": name,
                "points": [{"x": x(px), "y": y(py), "value": py, "step": px} for px, py in points],
                "line": " ".join(f"{x(px)},{y(py)}" for px, py in points),
            }
            for name, points in series.items()
        ],
    }


def tick_label(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:,.4g}"


def curve(evaluations: list[dict], column: str, factor: float = 1.0) -> list[tuple[float, float]]:
    return [(row["step"], row[column] * factor) for row in evaluations if column in row and "step" in row]


def charts(report: dict) -> dict:
    """The training's curves: training loss, learning rate and speed at every log interval
    (stats/steps.csv; a run folder without it, at the validation passes of stats/epochs.csv), and
    validation loss at each validation pass. Training loss is per token: its nats/char uses the
    training split's tokens per character, as the validation's does."""
    rows, train_split = report["evaluations"], report["splits"].get("train", {})
    points = report.get("steps") or rows
    tokens_per_char = train_split["tokens"] / train_split["chars"] if train_split.get("chars") else None
    loss = {"validation": curve(rows, "val_nats_per_char")}
    if tokens_per_char:
        loss = {"training": curve(points, "train_loss", tokens_per_char)} | loss
    return {
        "loss": line_chart(loss, "step", "nats/char"),
        "learning_rate": line_chart({"learning rate": curve(points, "learning_rate")}, "step", "learning rate"),
        "tokens_per_s": line_chart({"tokens/s": curve(points, "tokens_per_s")}, "step", "tokens/s"),
    }


def timeline_spans(report: dict) -> list[tuple[str, datetime, datetime, str]]:
    """(name, start, end, state) of what ran: on EMR the cluster's start-up and every step EMR ran
    (retries included), else each stage's Spark application; those with both times recorded."""
    if "emr" in report:
        cluster = report["emr"]
        spans = [("cluster start-up", cluster.get("created"), cluster.get("ready"), "STARTUP")]
        spans += [(step["name"], step.get("started"), step.get("ended"), step["state"]) for step in cluster["steps"]]
    else:
        times = report.get("stage_times", {})
        spans = [(stage, *times.get(stage, (None, None)), "COMPLETED") for stage in report["stage_seconds"]]
    return [
        (name, datetime.fromisoformat(start), datetime.fromisoformat(end), state)
        for name, start, end, state in spans
        if start and end
    ]


def timeline(report: dict) -> dict | None:
    """The timeline's bars and axis, from its first start; None when no times were recorded."""
    spans = timeline_spans(report)
    if not spans:
        return None
    origin = min(start for _, start, _, _ in spans)
    total = max((end - origin).total_seconds() for _, _, end, _ in spans)
    ticks = nice_ticks(0, total)
    x = Scale(ticks[0], ticks[-1], TIMELINE_LABEL, TIMELINE_WIDTH - RIGHT)
    bars = []
    for row, (name, start, end, state) in enumerate(spans):
        offset, seconds = (start - origin).total_seconds(), (end - start).total_seconds()
        bars.append(
            {
                "name": name,
                "state": state.lower(),
                "x": x(offset),
                "width": max(x(offset + seconds) - x(offset), 1),
                "y": TOP + row * TIMELINE_ROW,
                "seconds": seconds,
            }
        )
    height = TOP + len(bars) * TIMELINE_ROW + BOTTOM
    return {
        "width": TIMELINE_WIDTH,
        "height": height,
        "start": origin.isoformat(),
        "bars": bars,
        "row": TIMELINE_ROW,
        "axis": height - BOTTOM,
        "ticks": [{"at": x(value), "label": tick_label(value)} for value in ticks],
    }


def size(value: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def seconds_range(value: dict) -> str:
    """min / median / max task seconds; none where the stage ran no task (generate samples on the driver)."""
    if value.get("min") is None:
        return "no tasks"
    return " / ".join(f"{value[key]:,.1f}" for key in ("min", "median", "max")) + " s"


# Spark's metrics of a stage (its stats' "spark"), as the table shows them: key, label, format.
SPARK_METRICS = (
    ("app_id", "application", str),
    ("executors", "executors", figure),
    ("jobs", "jobs", figure),
    ("stages", "stages", figure),
    ("tasks", "tasks", figure),
    ("failed_tasks", "failed tasks", figure),
    ("task_seconds", "task time min / median / max", seconds_range),
    ("executor_run_seconds", "executor run time", lambda value: f"{value:,.1f} s"),
    ("gc_seconds", "GC time", lambda value: f"{value:,.1f} s"),
    ("input_bytes", "input", size),
    ("input_records", "input records", figure),
    ("output_bytes", "output", size),
    ("output_records", "output records", figure),
    ("shuffle_read_bytes", "shuffle read", size),
    ("shuffle_write_bytes", "shuffle write", size),
    ("peak_execution_memory_bytes", "peak execution memory", size),
    ("event_log", "event log", str),
)


def spark_table(report: dict) -> dict:
    """Rows of Spark's metrics, one column per stage; a stage without them is "not recorded"."""
    recorded = {stage: metrics for stage, metrics in report.get("spark", {}).items() if metrics}
    stages = list(report["stage_seconds"])
    rows = [
        {
            "label": label,
            "cells": {
                stage: "?" if recorded[stage].get(key) is None else show(recorded[stage][key])
                for stage in stages
                if stage in recorded
            },
        }
        for key, label, show in SPARK_METRICS
    ]
    return {"stages": stages, "recorded": list(recorded), "rows": rows}


def settings_rows(report: dict) -> list[dict]:
    return [
        {"setting": path, "default": default, "value": value}
        for path, (default, value) in report.get("settings", {}).items()
    ]


def page(report: dict) -> dict:
    """What the template shows, besides the report itself."""
    splits = report["splits"]
    return {
        "corpus_chars": sum(counts.get("chars", 0) for counts in splits.values()) if splits else None,
        "files": files_text(report),
        "charts": charts(report),
        "timeline": timeline(report),
        "spark": spark_table(report),
        "settings": settings_rows(report),
        "cluster_check": cluster_check(report),
    }


def cluster_check(report: dict) -> dict | None:
    """The cluster check's findings and table of nodes; None for a run without it."""
    check = report.get("cluster_check")
    if not check:
        return None
    headings, rows = cluster_check_rows(check)
    return {"findings": cluster_check_findings(check), "headings": headings, "rows": rows}


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,  # the sample and file names are the corpus's text
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["figure"] = shown
    return env


def shown(value, spec: str = ",") -> str:
    """A figure as the page shows it; "?" for one the stats lack (an older run's, say)."""
    return figure(None if isinstance(value, jinja2.Undefined) else value, spec)


def report_html(report: dict) -> str:
    return environment().get_template(TEMPLATE).render(report=report, **page(report))
