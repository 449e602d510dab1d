"""The run's report, written by the collect task: its figures gathered from the run folder's
stats, config and samples (build_report, report.json) and the page that shows them (report_text,
report.md; report.html is include/report_html.py's)."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import datetime, timezone

from include.model_formats import model_formats, model_formats_text
from pipeline import run_folder
from pipeline.config_files import load_config
from pipeline.stages import CLUSTER_CHECK, changed_settings

GENERATION_KEYS = ("samples", "generated_tokens", "generation_s", "tokens_per_s")


def build_report(run, s3_uri: str, stages: tuple[str, ...]) -> dict:
    stats = {stage: run.read_json(run_folder.stats_path(stage)) for stage in stages}
    config = run_folder.read_config_data(run.uri, run.read)  # compared as written with the defaults
    train = stats["train"]
    return {
        "run": run.name,
        "run_name": config["run_name"],
        "collected_at": datetime.now(timezone.utc).isoformat(timespec="microseconds"),
        "run_folder": run.uri,
        "s3_uri": s3_uri,
        "final_val_loss": train.get("final_val_loss"),
        "val_nats_per_char": train.get("final_val_nats_per_char"),
        "corpus": config["corpus"],
        "files": stats["tokenize"].get("files"),
        "skipped_files": len(stats["tokenize"].get("skipped", [])),
        "vocab_size": stats["tokenize"].get("tokenizer", {}).get("vocab_size"),
        "splits": stats["export"].get("splits", {}),
        "model": config["model"] | {"dim": config["embedding"]["dim"], "block_size": config["data"]["block_size"]},
        "stage_seconds": {stage: stats[stage].get("duration_s") for stage in stages},
        # Each stage's Spark application from start to stop (the timeline), and Spark's metrics of it.
        "stage_times": {stage: [stats[stage].get("started_at"), stats[stage].get("finished_at")] for stage in stages},
        "spark": {stage: stats[stage].get("spark") for stage in stages},
        "settings": {path: list(values) for path, values in changed_settings(defaults(), config).items()},
        "warnings": [f"[{stage}] {message}" for stage in stages for message in stats[stage].get("warnings", [])],
        "train": train,
        "evaluations": evaluations(run.read(run_folder.EPOCHS_CSV_PATH).decode("utf-8")),
        "steps": training_points(run),
        "sample": run.read(run_folder.SAMPLES_PATH).decode("utf-8"),
        "generation": {key: stats["generate"].get(key) for key in GENERATION_KEYS} if "generate" in stats else {},
        "model_formats": model_formats(run.has, s3_uri),
        "cluster_check": cluster_check(run),
    }


def cluster_check(run) -> dict | None:
    """What the EMR target's cluster check found (its stats): each node's address and package
    versions, YARN's limits and what an executor asks of them; None for a run without it (target
    local, or a run folder from before the check)."""
    path = run_folder.stats_path(CLUSTER_CHECK.name)
    if not run.has(path):
        return None
    found = run.read_json(path)
    return {
        "master": found.get("master"),
        "nodes": found.get("nodes", []),
        "distinct_addresses": found.get("distinct_addresses"),
        "yarn": found.get("yarn"),
        "executor_mb": found.get("executor_mb", {}),
    }


def defaults() -> dict:
    """The settings of the defaults file (pipeline.yaml, or GPT_PIPELINE_CONFIG's), resolved as a
    run's config.json holds them: the report lists the settings the run changed."""
    return json.loads(load_config().to_json())


CURVE_COLUMNS = ("step", "train_loss", "val_loss", "val_nats_per_char", "learning_rate")
CURVE_HEADINGS = ("step", "training loss", "validation loss", "validation nats/char", "learning rate")


def evaluations(epochs_csv: str) -> list[dict]:
    """The validation passes of stats/epochs.csv: step, losses, learning rate and tokens/s of each."""
    rows = csv.DictReader(io.StringIO(epochs_csv))
    columns = (*CURVE_COLUMNS, "tokens_per_s")
    return [{column: float(row[column]) for column in columns if row.get(column)} for row in rows]


def training_points(run) -> list[dict]:
    """The training curve of stats/steps.csv, one point per log interval: [] for a run folder from
    before it was written (the report then draws the training loss of the validation passes)."""
    if not run.has(run_folder.STEPS_CSV_PATH):
        return []
    rows = csv.DictReader(io.StringIO(run.read(run_folder.STEPS_CSV_PATH).decode("utf-8")))
    return [{column: float(value) for column, value in row.items() if value} for row in rows]


def figure(value, spec: str = ",") -> str:
    return "?" if value is None else format(value, spec)


def report_text(report: dict) -> str:
    train, model, splits = report["train"], report["model"], report["splits"]
    data = "; ".join(
        f"{split} {figure(counts.get('chars'))} characters, {figure(counts.get('tokens'))} tokens, "
        f"{figure(counts.get('windows'))} windows"
        for split, counts in splits.items()
    )
    curve = "\n".join(
        "| "
        + " | ".join(figure(row.get(column), ".0f" if column == "step" else ".4g") for column in CURVE_COLUMNS)
        + " |"
        for row in report["evaluations"]
    )
    stages = "\n".join(f"| {stage} | {seconds} |" for stage, seconds in report["stage_seconds"].items())
    warnings = "\n".join(f"- {message}" for message in report["warnings"])
    return (
        f"# Run {report['run']}\n\n"
        f"Final validation loss: **{figure(report['final_val_loss'], '.4f')} nats/token**, "
        f"**{figure(report['val_nats_per_char'], '.4f')} nats/char**.\n\n"
        f"- record: {report['s3_uri']}\n"
        f"- run folder: {report['run_folder']}\n"
        f"- corpus: {', '.join(report['corpus'])} ({files_text(report)}): "
        f"{data}\n"
        f"- model: {model['n_layer']} layers, {model['n_head']} heads, width {model['dim']}, "
        f"{model['block_size']} tokens of context, vocabulary {figure(report['vocab_size'])}: "
        f"{figure(train.get('parameters'))} parameters\n"
        f"- training: {figure(train.get('steps'))} steps on {figure(train.get('workers'))} workers, "
        f"{figure(train.get('tokens_per_s'), ',.0f')} tokens/s, {figure(train.get('train_wall_s'), ',.0f')} s"
        f"{resumed_text(train)}\n\n"
        f"## Validation\n\n| {' | '.join(CURVE_HEADINGS)} |\n|{'---|' * len(CURVE_HEADINGS)}\n{curve}\n\n"
        f"## Stages\n\n| stage | seconds |\n|---|---|\n{stages}\n\n"
        + spark_text(report.get("spark", {}))
        + (emr_text(report["emr"]) if "emr" in report else "")
        + (cluster_check_text(report["cluster_check"]) if report.get("cluster_check") else "")
        + (f"## Warnings\n\n{warnings}\n\n" if warnings else "")
        + model_formats_text(report.get("model_formats", {}))
        + f"## Sample\n\n{generation_text(report.get('generation', {}))}{code_block(report['sample'])}"
    )


def code_block(text: str) -> str:
    """text as a Markdown code block, fenced with more backticks than any run of them in it (as
    CommonMark allows): a sample that holds ``` does not end its block and go on as Markdown."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}\n"


def generation_text(generation: dict) -> str:
    """How long the generate stage took to write the samples (compiling its decoder included)."""
    if not generation.get("generation_s"):
        return ""
    return (
        f"{figure(generation['samples'])} sample(s), {figure(generation['generated_tokens'])} new tokens in "
        f"{generation['generation_s']:,.1f} s ({figure(generation['tokens_per_s'], ',.0f')} tokens/s, "
        "compiling the decoder included).\n\n"
    )


def files_text(report: dict) -> str:
    """'36 files' or, with files data.bad_files=skip left out, '36 files read, 1 skipped'."""
    files, skipped = report["files"], report.get("skipped_files", 0)
    if files is None:
        return "? files"
    read = f"{files - skipped:,} file{'' if files - skipped == 1 else 's'}"
    return f"{read} read, {skipped:,} skipped" if skipped else read


def resumed_text(train: dict) -> str:
    """For a training resumed from a backup: the speed and time above are its last attempt's."""
    if not train.get("resumed_from_step"):
        return ""
    return (
        f" (resumed from step {train['resumed_from_step']:,}: the speed and time are of the last "
        f"{figure(train.get('steps_this_attempt'))} steps)"
    )


SPARK_HEADINGS = (
    "stage",
    "executors",
    "jobs",
    "stages",
    "tasks (failed)",
    "task s min / median / max",
    "run s",
    "GC s",
    "input MB (records)",
    "output MB (records)",
    "shuffle read / write MB",
    "peak memory MB",
)


def spark_text(spark: dict[str, dict | None]) -> str:
    """The table of each stage's Spark metrics (its stats' `spark`); a stage without them shows '?'."""
    if not spark:
        return ""
    rows = "\n".join(f"| {stage} | {spark_row(metrics)} |" for stage, metrics in spark.items())
    return (
        "## Spark\n\nWhat Spark recorded of each stage's application (its event log: spark-events/ in the run folder)."
        f"\n\n| {' | '.join(SPARK_HEADINGS)} |\n|{'---|' * len(SPARK_HEADINGS)}\n{rows}\n\n"
    )


def spark_row(metrics: dict | None) -> str:
    if metrics is None:
        return " | ".join("?" * (len(SPARK_HEADINGS) - 1))
    seconds = metrics["task_seconds"]
    return " | ".join(
        (
            figure(metrics["executors"]),
            figure(metrics["jobs"]),
            figure(metrics["stages"]),
            f"{figure(metrics['tasks'])} ({figure(metrics['failed_tasks'])})",
            " / ".join(figure(seconds[key], ",.2f") for key in ("min", "median", "max")),
            figure(metrics["executor_run_seconds"], ",.1f"),
            figure(metrics["gc_seconds"], ",.1f"),
            f"{megabytes(metrics['input_bytes'])} ({figure(metrics['input_records'])})",
            f"{megabytes(metrics['output_bytes'])} ({figure(metrics['output_records'])})",
            f"{megabytes(metrics['shuffle_read_bytes'])} / {megabytes(metrics['shuffle_write_bytes'])}",
            megabytes(metrics["peak_execution_memory_bytes"]),
        )
    )


def megabytes(count: int | None) -> str:
    return figure(None if count is None else count / 1e6, ",.1f")


def emr_text(cluster: dict) -> str:
    steps = "\n".join(f"| {step['name']} | {step['state']} | {figure(step['seconds'])} |" for step in cluster["steps"])
    return (
        f"## EMR\n\nCluster {cluster['cluster_id']} ({cluster['release']}), created {cluster['created']}: "
        f"{figure(cluster['hours_so_far'])} hours and about ${figure(cluster['cost_usd_so_far'], ',.2f')} "
        f"at {cluster.get('cost_basis', 'on-demand prices')} when collect ran.\n\n"
        f"| step | state | seconds |\n|---|---|---|\n{steps}\n\n"
    )


def cluster_check_rows(check: dict) -> tuple[list[str], list[list[str]]]:
    """The table of the nodes the cluster check found: worker, address, then each package's version.
    (A package that did not import failed the check, which then wrote no stats.)"""
    packages = list(dict.fromkeys(package for node in check["nodes"] for package in node.get("versions", {})))
    rows = [
        [
            str(node.get("worker", "?")),
            node.get("address", "?"),
            *(node.get("versions", {}).get(package, "?") for package in packages),
        ]
        for node in check["nodes"]
    ]
    return ["worker", "address", *packages], rows


def cluster_check_findings(check: dict) -> list[str]:
    """The cluster check's verdicts in words: the workers' addresses, YARN's limits against an executor."""
    distinct = check.get("distinct_addresses")
    addresses = (
        "?"
        if distinct is None
        else "each training worker on a node of its own"
        if distinct
        else "training workers sharing a node"
    )
    yarn, executor = check.get("yarn"), check.get("executor_mb") or {}
    asked = " + ".join(f"{key} {figure(value)} MB" for key, value in executor.items()) or "?"
    limits = (
        "; ".join(f"{key} {figure(value)} MB" for key, value in yarn.items())
        if yarn
        else f"no YARN to check against (master {check.get('master') or '?'})"
    )
    return [f"addresses: {addresses}", f"an executor asks for {asked}", f"YARN's limits: {limits}"]


def cluster_check_text(check: dict) -> str:
    headings, rows = cluster_check_rows(check)
    table = "\n".join("| " + " | ".join(row) + " |" for row in rows)
    findings = "\n".join(f"- {line}" for line in cluster_check_findings(check))
    return (
        f"## Cluster check\n\nWhat the {CLUSTER_CHECK.name} step found on the core nodes before the first stage.\n\n"
        f"{findings}\n\n| {' | '.join(headings)} |\n|{'---|' * len(headings)}\n{table}\n\n"
    )
