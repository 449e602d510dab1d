"""The run's report (include/report.py)."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from include.report import report_text
from include.report_html import charts, nice_ticks, report_html
from include.report_link import report_url


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


EVALUATIONS = [
    {
        "step": 20,
        "train_loss": 3.1,
        "val_loss": 2.7,
        "val_nats_per_char": 1.0,
        "learning_rate": 0.002,
        "tokens_per_s": 5000,
    },
    {
        "step": 40,
        "train_loss": 2.6,
        "val_loss": 2.5,
        "val_nats_per_char": 0.9,
        "learning_rate": 2e-4,
        "tokens_per_s": 5200,
    },
    {
        "step": 60,
        "train_loss": 2.4,
        "val_loss": 2.4,
        "val_nats_per_char": 0.85,
        "learning_rate": 1e-4,
        "tokens_per_s": 5100,
    },
]
SPARK = {
    "app_id": "local-1764100000000",
    "executors": 1,
    "jobs": 3,
    "stages": 4,
    "tasks": 12,
    "failed_tasks": 0,
    "task_seconds": {"min": 0.1, "median": 0.5, "max": 2.25},
    "executor_run_seconds": 6.5,
    "gc_seconds": 0.2,
    "input_bytes": 1_234_567,
    "input_records": 40,
    "output_bytes": 2048,
    "output_records": 40,
    "shuffle_read_bytes": 0,
    "shuffle_write_bytes": 0,
    "peak_execution_memory_bytes": 64_000_000,
    "event_log": "file:///tmp/spark-events/local-1764100000000",
}


def html_report(**fields) -> dict:
    """A report.json with what report.html draws: curves, stage times, Spark metrics, settings."""
    return (
        small_report(
            run_name="books",
            collected_at="2026-11-25T20:02:00+00:00",
            evaluations=EVALUATIONS,
            splits={"train": {"chars": 9000, "tokens": 4000, "windows": 60}, "val": {"chars": 1000, "tokens": 450}},
            stage_seconds={"tokenize": 15.0, "train": 70.5, "generate": 3.0},
            stage_times={
                "tokenize": ["2026-11-25T20:00:00.000+00:00", "2026-11-25T20:00:20.000+00:00"],
                "train": ["2026-11-25T20:00:21.000+00:00", "2026-11-25T20:01:40.000+00:00"],
                "generate": [None, None],
            },
            spark={"tokenize": SPARK, "train": None},
            settings={"train.max_steps": [1500, 60], "corpus": [["file:///a.txt"], ["file:///b.txt"]]},
            train={"steps": 60, "workers": 2, "parameters": 123456, "tokens_per_s": 5100.2, "train_wall_s": 8.2},
            sample="ROMEO: <b>the & end</b>",
        )
        | fields
    )


class Page(HTMLParser):
    """report.html's elements: each start tag with its attributes and the id of the svg it is in,
    and the text of each element that has an id."""

    def __init__(self, html: str):
        super().__init__()
        self.tags, self.text, self.svg, self.open_ids = [], {}, None, []
        self.feed(html)

    def handle_startendtag(self, tag, attrs):  # <line/>: no text inside
        self.tags.append((tag, dict(attrs), self.svg))

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.svg = attrs.get("id") if tag == "svg" else self.svg
        self.tags.append((tag, attrs, self.svg))
        if tag != "meta":  # the page's one element without an end tag
            self.open_ids.append(attrs.get("id"))

    def handle_endtag(self, tag):
        self.open_ids.pop()
        self.svg = None if tag == "svg" else self.svg

    def handle_data(self, data):
        for element_id in filter(None, self.open_ids):
            self.text[element_id] = self.text.get(element_id, "") + data

    def find(self, tag: str, svg: str | None = None, css_class: str | None = None) -> list[dict]:
        return [
            attrs
            for name, attrs, within in self.tags
            if name == tag
            and (svg is None or within == svg)
            and (css_class is None or css_class in attrs.get("class", "").split())
        ]


def test_the_html_report_draws_a_point_per_validation_pass_in_each_chart():
    page = Page(report_html(html_report()))
    for chart, series in (("chart-loss", 2), ("chart-learning-rate", 1), ("chart-tokens-per-s", 1)):
        assert len(page.find("g", chart, "series")) == series
        assert len(page.find("circle", chart, "point")) == series * len(EVALUATIONS), chart
    validation = [float(point["cy"]) for point in page.find("circle", "chart-loss")][len(EVALUATIONS) :]
    steps = [float(point["cx"]) for point in page.find("circle", "chart-loss")][len(EVALUATIONS) :]
    assert steps == sorted(steps) and validation == sorted(validation)  # later steps right; lower loss lower


def test_the_training_loss_is_drawn_per_character_with_the_training_splits_tokens_per_character():
    chart = charts(html_report())["loss"]
    training, validation = chart["series"]
    assert (training["name"], validation["name"]) == ("training", "validation")
    assert [point["value"] for point in training["points"]] == pytest.approx([3.1 * 4 / 9, 2.6 * 4 / 9, 2.4 * 4 / 9])
    assert [point["value"] for point in validation["points"]] == [1.0, 0.9, 0.85]


STEPS = [
    {"step": float(step), "train_loss": 3.4 - step / 40, "learning_rate": 0.002, "tokens_per_s": 5000.0}
    for step in range(5, 65, 5)
]


def test_with_steps_csv_the_training_curves_have_a_point_per_log_interval():
    chart = charts(html_report(steps=STEPS))
    training, validation = chart["loss"]["series"]
    assert [point["step"] for point in training["points"]] == [point["step"] for point in STEPS]
    assert [point["value"] for point in training["points"]] == pytest.approx([p["train_loss"] * 4 / 9 for p in STEPS])
    assert len(validation["points"]) == len(EVALUATIONS)  # validation stays at its passes
    for name in ("learning_rate", "tokens_per_s"):
        (series,) = chart[name]["series"]
        assert len(series["points"]) == len(STEPS), name


def test_the_charts_value_axes_start_at_zero():
    for name, chart in charts(html_report(steps=STEPS)).items():
        assert chart["y_ticks"][0]["label"] == "0", name
        bottom = chart["plot"]["bottom"]
        assert chart["y_ticks"][0]["at"] == bottom, name


def test_the_html_reports_figures_are_the_reports():
    page = Page(report_html(html_report()))
    assert page.text["figure-val-nats-per-char"] == "0.9000"
    assert page.text["figure-val-loss"] == "2.5000"
    assert page.text["figure-steps"] == "60"
    assert page.text["figure-parameters"] == "123,456"
    assert page.text["figure-corpus-chars"] == "10,000"
    assert "?" == Page(report_html(html_report(train={}))).text["figure-steps"]  # stats without the figure


def test_the_timeline_has_a_bar_per_stage_with_times_and_on_emr_the_start_up_and_every_step():
    page = Page(report_html(html_report()))
    bars = page.find("rect", "timeline", "bar")
    assert len(bars) == 2  # generate's times were not recorded
    assert float(bars[1]["x"]) > float(bars[0]["x"]) + float(bars[0]["width"])  # train started after tokenize
    emr = {
        "cluster_id": "j-1",
        "release": "emr-7.12.0",
        "created": "2026-11-25T20:00:00+00:00",
        "ready": "2026-11-25T20:07:00+00:00",
        "hours_so_far": 0.5,
        "cost_usd_so_far": 1.25,
        "steps": [
            {
                "name": "tokenize",
                "state": "FAILED",
                "seconds": 60.0,
                "started": "2026-11-25T20:07:10+00:00",
                "ended": "2026-11-25T20:08:10+00:00",
            },
            {
                "name": "tokenize",
                "state": "COMPLETED",
                "seconds": 70.0,
                "started": "2026-11-25T20:09:10+00:00",
                "ended": "2026-11-25T20:10:20+00:00",
            },
            {"name": "window", "state": "PENDING", "seconds": None, "started": None, "ended": None},
        ],
    }
    page = Page(report_html(html_report(emr=emr)))
    assert [bar["class"] for bar in page.find("rect", "timeline", "bar")] == [
        "bar startup",
        "bar failed",
        "bar completed",
    ]
    assert page.text["figure-cost"] == "$1.25"
    assert "not recorded" in Page(report_html(html_report(stage_times={}))).text["timeline-missing"]


def test_the_spark_metrics_table_shows_each_stages_metrics_or_not_recorded():
    page = Page(report_html(html_report()))
    table = page.text["spark-metrics"]
    assert "local-1764100000000" in table and "1.2 MB" in table and "0.1 / 0.5 / 2.2 s" in table
    missing = page.find("td", css_class="missing")
    assert [cell["rowspan"] for cell in missing] == [str(len(SPARK))] * 2  # train's (null) and generate's (absent)
    assert "not recorded" in Page(report_html(html_report(spark={}))).text["spark-metrics"]


def test_a_stage_that_ran_no_spark_task_shows_no_task_times():
    """generate samples on the driver: its Spark application runs no task, so it has no task times."""
    driver_only = SPARK | {"tasks": 0, "task_seconds": {"min": None, "median": None, "max": None}}
    table = Page(report_html(html_report(spark={"tokenize": SPARK, "generate": driver_only}))).text["spark-metrics"]
    assert "no tasks" in table and "0.1 / 0.5 / 2.2 s" in table


def test_the_html_report_lists_the_changed_settings_and_escapes_the_corpus_text():
    html = report_html(html_report())
    settings = Page(html).text["settings"]
    assert "train.max_steps" in settings and "1500" in settings and "60" in settings
    assert "ROMEO: &lt;b&gt;the &amp; end&lt;/b&gt;" in html
    assert "<script" not in html and " src=" not in html and "http" not in html  # nothing fetched, no script


def test_the_run_report_link_on_aws_is_the_s3_consoles_page_of_report_html():
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    assert report_url("s3://gpt-pipeline/runs/books-r+1/", S3Hook(aws_conn_id=None, region_name="eu-west-1")) == (
        "https://console.aws.amazon.com/s3/object/gpt-pipeline?prefix=runs%2Fbooks-r%2B1%2Freport.html&region=eu-west-1"
    )


def test_ticks_are_round_and_cover_the_values():
    assert nice_ticks(0, 40) == [0, 10, 20, 30, 40]
    assert nice_ticks(2.1, 4.4) == [2.0, 2.5, 3.0, 3.5, 4.0, 4.5]
    assert nice_ticks(0.85, 0.85) == pytest.approx([0.4, 0.6, 0.8, 1.0, 1.2, 1.4])  # one value: a range around it


def test_the_sample_section_says_how_long_generation_took():
    generation = {"samples": 2, "generated_tokens": 200, "generation_s": 4.25, "tokens_per_s": 47.1}
    expected = "2 sample(s), 200 new tokens in 4.2 s (47 tokens/s, compiling the decoder included)."
    assert f"## Sample\n\n{expected}\n\n```\n" in report_text(small_report(generation=generation))
    assert expected in Page(report_html(html_report(generation=generation))).text["generation"]
    assert "new tokens in" not in report_text(small_report())


@pytest.mark.parametrize("sample", ["ROMEO: hark", "```\n# not a heading\n````\n[a link](http://x)", "`"])
def test_report_md_holds_the_sample_in_one_code_block_whatever_backticks_it_holds(sample):
    from markdown_it import MarkdownIt

    text = report_text(small_report(sample=sample))
    tokens = MarkdownIt("commonmark").parse(text[text.index("## Sample") :])
    assert [token.type for token in tokens] == ["heading_open", "inline", "heading_close", "fence"]
    assert tokens[-1].content == sample + "\n"


CLUSTER_CHECK = {
    "master": "yarn",
    "nodes": [
        {"worker": 0, "address": "10.0.1.17", "versions": {"python": "3.11.14", "tensorflow": "2.21.0"}},
        {"worker": 1, "address": "10.0.1.18", "versions": {"python": "3.11.14"}},  # an older check's, say
    ],
    "distinct_addresses": True,
    "yarn": {"yarn.scheduler.maximum-allocation-mb": 28672},
    "executor_mb": {"spark.executor.memory": 6656, "spark.executor.memoryOverhead": 19968},
}


def test_the_report_shows_what_the_cluster_check_found_on_each_node():
    text = report_text(small_report(cluster_check=CLUSTER_CHECK))
    assert (
        "## Cluster check\n\nWhat the smoke step found on the core nodes before the first stage.\n\n"
        "- addresses: each training worker on a node of its own\n"
        "- an executor asks for spark.executor.memory 6,656 MB + spark.executor.memoryOverhead 19,968 MB\n"
        "- YARN's limits: yarn.scheduler.maximum-allocation-mb 28,672 MB\n\n"
        "| worker | address | python | tensorflow |\n|---|---|---|---|\n"
        "| 0 | 10.0.1.17 | 3.11.14 | 2.21.0 |\n| 1 | 10.0.1.18 | 3.11.14 | ? |\n"
    ) in text
    page = report_html(small_report(cluster_check=CLUSTER_CHECK))
    assert "<h2>Cluster check</h2>" in page and "<td>10.0.1.18</td>" in page
    assert "<li>YARN&#39;s limits: yarn.scheduler.maximum-allocation-mb 28,672 MB</li>" in page
    rehearsed = CLUSTER_CHECK | {"master": "spark://127.0.0.1:7077", "yarn": None}
    assert "- YARN's limits: no YARN to check against (master spark://127.0.0.1:7077)\n" in report_text(
        small_report(cluster_check=rehearsed)
    )


def test_a_run_without_a_cluster_check_has_no_such_section():
    for report in (small_report(), small_report(cluster_check=None)):
        assert "Cluster check" not in report_text(report) and "Cluster check" not in report_html(report)
