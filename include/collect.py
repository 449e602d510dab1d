"""The collect and promote tasks: copy a run's record to S3 with a short report, then point the
run name's `latest` pointer at its model.

The record is the resolved config, stats/, model/ and samples.txt of the run folder; it goes to
s3://{s3.bucket}/{s3.prefix}/{run folder name}/ through the amazon provider's S3Hook, so the
Airflow AWS connection decides where S3 is (AWS, LocalStack or a local moto server). The pointer
is s3://{s3.bucket}/{s3.prefix}/latest/{run_name}.json: where consumers of the newest model look.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import posixpath
from datetime import datetime, timezone
from pathlib import Path

from include import locks
from spark_jobs.lib import lake, run_folder
from spark_jobs.lib.config import PipelineConfig, from_json
from spark_jobs.lib.errors import PipelineError
from spark_jobs.lib.train_state import MODEL_DIR

log = logging.getLogger(__name__)

AWS_CONN_ID = "aws_default"
RECORD_FILES = (run_folder.CONFIG_FILE, run_folder.SAMPLES_PATH)
RECORD_FOLDERS = ("stats/", f"{MODEL_DIR}/")
REPORT_JSON, REPORT_TEXT = run_folder.REPORT_JSON, run_folder.REPORT_TEXT
LATEST_FOLDER = "latest"
REMOVING = "REMOVING"  # in a run folder that prune_runs has begun to remove


class RunFolder:
    """Lists and reads a run folder on local disk (file://) or on S3 through the hook."""

    def __init__(self, uri: str, hook):
        self.uri = uri.rstrip("/")
        self.hook = hook
        self.name = posixpath.basename(self.uri)

    def files(self) -> list[str]:
        """Paths of every file in the folder, relative to it."""
        if self.uri.startswith("s3://"):
            bucket, prefix = self.hook.parse_s3_url(self.uri)
            keys = self.hook.list_keys(bucket_name=bucket, prefix=prefix + "/") or []
            return sorted(key[len(prefix) + 1 :] for key in keys)
        return [posixpath.relpath(uri, self.uri) for uri in lake.list_files(self.uri)]

    def has(self, relative: str) -> bool:
        uri = lake.join(self.uri, relative)
        if uri.startswith("s3://"):
            return self.hook.check_for_key(uri)
        return lake.exists(uri)

    def read(self, relative: str) -> bytes:
        uri = lake.join(self.uri, relative)
        if uri.startswith("s3://"):
            return self.hook.get_key(uri).get()["Body"].read()
        return lake.read_bytes(uri)

    def read_json(self, relative: str) -> dict:
        return json.loads(self.read(relative))

    def config(self) -> PipelineConfig:
        return from_json(self.read(run_folder.CONFIG_FILE).decode("utf-8"))

    def write(self, relative: str, data: bytes) -> None:
        uri = lake.join(self.uri, relative)
        if uri.startswith("s3://"):
            bucket, key = self.hook.parse_s3_url(uri)
            self.hook.load_bytes(data, key=key, bucket_name=bucket, replace=True)
        else:
            lake.write_bytes(uri, data)

    def remove(self, *paths: str) -> None:
        """Remove files of the folder, those that are there."""
        if not self.uri.startswith("s3://"):
            for path in paths:
                lake.delete(lake.join(self.uri, path))
        elif paths:
            bucket, prefix = self.hook.parse_s3_url(self.uri)
            self.hook.delete_objects(bucket, [f"{prefix}/{path}" for path in paths])  # 1000 a request

    def modified(self, relative: str) -> datetime:
        uri = lake.join(self.uri, relative)
        if uri.startswith("s3://"):
            return self.hook.get_key(uri).last_modified.astimezone(timezone.utc)
        return datetime.fromtimestamp(os.path.getmtime(lake.local_path(uri)), timezone.utc)

    def siblings(self) -> list[RunFolder]:
        """The run folders of the lake, this one among them."""
        runs = posixpath.dirname(self.uri)
        if runs.startswith("s3://"):
            bucket, prefix = self.hook.parse_s3_url(runs)
            folders = self.hook.list_prefixes(bucket_name=bucket, prefix=prefix + "/", delimiter="/") or []
            return [RunFolder(f"s3://{bucket}/{folder.rstrip('/')}", self.hook) for folder in sorted(folders)]
        local = Path(lake.local_path(runs))
        return [RunFolder(lake.join(runs, path.name), self.hook) for path in sorted(local.iterdir()) if path.is_dir()]

    def delete(self) -> None:
        """A REMOVING marker goes in first and out last, so that a removal that stops halfway is
        finished by the next one; the report and the stages' stats go first, so that a folder half
        removed never looks collected or its stages complete."""
        self.write(REMOVING, b"")
        markers = (REPORT_JSON, REPORT_TEXT, "stats/")
        files = [path for path in self.files() if path != REMOVING]
        first = [path for path in files if path.startswith(markers)]
        self.remove(*first)
        self.remove(*[path for path in files if path not in first])
        self.remove(REMOVING)
        if not self.uri.startswith("s3://"):
            lake.delete(self.uri)  # the folders left, empty


def record_files(run: RunFolder) -> list[str]:
    files = [path for path in run.files() if path in RECORD_FILES or path.startswith(RECORD_FOLDERS)]
    missing = [name for name in RECORD_FILES if name not in files]
    if missing:
        raise PipelineError(f"run folder {run.uri} has no {', '.join(missing)}: the run did not complete")
    return files


def build_report(run: RunFolder, s3_uri: str, stages: tuple[str, ...]) -> dict:
    stats = {stage: run.read_json(f"stats/{stage}.json") for stage in stages}
    config = run.read_json(run_folder.CONFIG_FILE)
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
        "warnings": [f"[{stage}] {message}" for stage in stages for message in stats[stage].get("warnings", [])],
        "train": train,
        "evaluations": evaluations(run.read("stats/epochs.csv").decode("utf-8")),
        "sample": run.read(run_folder.SAMPLES_PATH).decode("utf-8"),
    }


CURVE_COLUMNS = ("step", "train_loss", "val_loss", "val_nats_per_char", "learning_rate")
CURVE_HEADINGS = ("step", "training loss", "validation loss", "validation nats/char", "learning rate")


def evaluations(epochs_csv: str) -> list[dict]:
    """The validation passes of stats/epochs.csv: step, losses and learning rate of each."""
    rows = csv.DictReader(io.StringIO(epochs_csv))
    return [{column: float(row[column]) for column in CURVE_COLUMNS if row.get(column)} for row in rows]


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
        + (emr_text(report["emr"]) if "emr" in report else "")
        + (f"## Warnings\n\n{warnings}\n\n" if warnings else "")
        + f"## Sample\n\n```\n{report['sample']}\n```\n"
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


def emr_text(cluster: dict) -> str:
    steps = "\n".join(f"| {step['name']} | {step['state']} | {figure(step['seconds'])} |" for step in cluster["steps"])
    return (
        f"## EMR\n\nCluster {cluster['cluster_id']} ({cluster['release']}), created {cluster['created']}: "
        f"{figure(cluster['hours_so_far'])} hours and about ${figure(cluster['cost_usd_so_far'], ',.2f')} on demand "
        f"when collect ran.\n\n| step | state | seconds |\n|---|---|---|\n{steps}\n\n"
    )


def check_bucket(hook, bucket: str, setting: str) -> str:
    """`bucket`, named by the config's `setting`, which must exist (validate_config checks the
    record's and, on EMR, the logs' before the run too)."""
    if not hook.check_for_bucket(bucket):
        raise PipelineError(
            f"{setting}: bucket {bucket!r} does not exist or is not accessible through the Airflow "
            f"connection {hook.aws_conn_id}"
        )
    return bucket


def collect_record(run_dir: str, hook, stages: tuple[str, ...], extra: dict | None = None) -> dict:
    """Copy the run's record to S3, then the report (written last: its presence means complete);
    the run folder gets the report too (a command that uses the folder again removes it). `extra` goes
    into the report as it is (on EMR: the cluster and its steps, under "emr")."""
    run = RunFolder(run_dir, hook)
    config = run.config()
    bucket = check_bucket(hook, config.s3.bucket, "s3.bucket")
    prefix = posixpath.join(config.s3.prefix.strip("/"), run.name)
    paths, record = record_files(run), RunFolder(f"s3://{bucket}/{prefix}", hook)
    record.remove(REPORT_JSON, REPORT_TEXT)  # a record collected before is not whole until its new report is in
    for path in paths:
        hook.load_bytes(run.read(path), key=f"{prefix}/{path}", bucket_name=bucket, replace=True)
    record.remove(*[path for path in record.files() if path not in paths])  # an earlier collect's, gone from the run
    report = build_report(run, f"s3://{bucket}/{prefix}/", stages) | (extra or {})
    files = {REPORT_TEXT: report_text(report), REPORT_JSON: json.dumps(report, indent=2)}
    for name, text in files.items():
        hook.load_string(text, key=f"{prefix}/{name}", bucket_name=bucket, replace=True)
    try:
        for name, text in files.items():
            run.write(name, text.encode("utf-8"))
    except Exception as error:  # a copy for convenience (the record has it): e.g. a lake Airflow may only read
        log.warning("the report was not copied to the run folder %s: %s", run.uri, error)
    return report


def remove_old_runs(run_dir: str, hook) -> list[str]:
    """With keep_runs set, remove the lake's run folders of this run's name and corpus that collect
    finished, all but the newest keep_runs (this run among them), and return them. Runs without a report
    (unfinished, or being run again), runs of other names or corpora and folders it cannot read (logged) are
    left alone, and so is the run whose model the latest pointer names (s3.promote: if_better may
    keep an older one); records on S3 stay. A removal that stopped halfway (its folder holds
    REMOVING) is finished."""
    run = RunFolder(run_dir, hook)
    config = run.config()
    if config.keep_runs is None:
        return []
    others, unfinished_removals = [], []
    for folder in run.siblings():
        if folder.uri == run.uri:
            continue
        try:
            if folder.has(REMOVING):
                unfinished_removals.append(folder)
            elif collected_lineage(folder) == (config.run_name, config.corpus):
                others.append((collected_at(folder), folder))
        except (OSError, ValueError, AttributeError) as error:  # another's folder must not stop this run's prune
            log.warning("keep_runs: left %s alone, it cannot be read: %s", folder.uri, error)
    others.sort(key=lambda item: item[0], reverse=True)
    old = [folder for _, folder in others[config.keep_runs - 1 :]]
    served = latest_run(config, hook)
    if served in [folder.name for folder in old]:
        log.info("keep_runs: kept %s, whose model the latest pointer names", served)
    removed = []
    for folder in [folder for folder in old if folder.name != served] + unfinished_removals:
        try:
            with locks.run_folder_held(folder.uri, "prune_runs"):
                folder.delete()
            removed.append(folder.uri)
        except locks.InUse as error:  # being run again: no longer a collected run to prune
            log.warning("keep_runs: left %s alone: %s", folder.uri, error)
    return removed


def latest_run(config, hook) -> str | None:
    """The run folder name whose model the run name's latest pointer names, if there is one."""
    key = latest_key(config)
    if not hook.check_for_key(key, bucket_name=config.s3.bucket):
        return None
    return json.loads(hook.read_key(key, bucket_name=config.s3.bucket))["run"]


def collected_lineage(run: RunFolder) -> tuple[str, list[str]] | None:
    """The run name and corpus of a run folder collect finished (with a report), else None: the
    retrainings keep_runs counts share both (two corpora may share a default run name, input.txt's)."""
    if not (run.has(REPORT_JSON) and run.has(run_folder.CONFIG_FILE)):
        return None
    config = run.read_json(run_folder.CONFIG_FILE)
    return config.get("run_name"), config.get("corpus")


def collected_at(run: RunFolder) -> str:
    """When collect finished the run: its report's collected_at, or for a report without
    collected_at, its file's time."""
    report = run.read_json(REPORT_JSON)
    if "collected_at" in report:
        return report["collected_at"]
    return run.modified(REPORT_JSON).isoformat(timespec="microseconds")


def latest_folder(config) -> str:
    """s3://{s3.bucket}/{s3.prefix}/latest: the latest pointers, one per run name (the model asset's URI)."""
    return posixpath.join(config.s3.record_folder(), LATEST_FOLDER)


def latest_key(config) -> str:
    return posixpath.join(config.s3.prefix.strip("/"), LATEST_FOLDER, f"{config.run_name}.json")


def promotion(candidate: dict, current: dict | None, policy: str) -> tuple[bool, str]:
    """Whether `candidate` replaces `current` as latest under s3.promote `policy`, and why."""
    if current is None:
        return True, "the first model of this run name"
    if policy == "always":
        return True, "s3.promote: always"
    new, old, run = candidate["val_nats_per_char"], current.get("val_nats_per_char"), current["run"]
    if old is None or (new is not None and new <= old):
        return True, f"validation loss {new} nats/char is no higher than {old} of {run}, which latest pointed at"
    return False, (
        f"validation loss {new} nats/char is higher than {old} of {run}, which latest points at (s3.promote: if_better)"
    )


def promote_record(record_uri: str, hook) -> dict:
    """Point latest/{run_name}.json at the collected record in `record_uri`, unless s3.promote is
    if_better and the model it points at now has the lower validation nats/char.

    Returns the decision: `promoted`, the pointer's URI, the pointer written (or kept) and the reason."""
    bucket, prefix = hook.parse_s3_url(record_uri)
    read = lambda key: json.loads(hook.read_key(key, bucket_name=bucket))  # noqa: E731
    if not hook.check_for_key(posixpath.join(prefix, REPORT_JSON), bucket_name=bucket):
        raise PipelineError(f"record {record_uri} has no {REPORT_JSON}: collect did not finish")
    report = read(posixpath.join(prefix, REPORT_JSON))  # written last by collect: the record is whole
    config = from_json(hook.read_key(posixpath.join(prefix, run_folder.CONFIG_FILE), bucket_name=bucket))
    key = latest_key(config)
    current = read(key) if hook.check_for_key(key, bucket_name=bucket) else None
    candidate = {
        "run": report["run"],
        "record": report["s3_uri"],
        "model": report["s3_uri"] + "model/",
        "final_val_loss": report["final_val_loss"],
        "val_nats_per_char": report["val_nats_per_char"],
        "collected_at": report["collected_at"],
        "promoted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    same_run = current is not None and current["run"] == candidate["run"]
    if same_run and current.get("collected_at") == candidate["collected_at"]:  # a retried promote
        promoted, reason, candidate = True, "latest points at this run's model already", current
    else:
        promoted, reason = promotion(candidate, current, config.s3.promote)
        if same_run:  # whatever the policy: the model latest pointed at is gone, replaced by this one
            promoted, reason = True, "this run was collected again: its record, which latest points at, has a new model"
        if promoted:
            if current:
                candidate["previous"] = {name: current.get(name) for name in ("run", "record", "val_nats_per_char")}
            hook.load_string(json.dumps(candidate, indent=2), key=key, bucket_name=bucket, replace=True)
    return {
        "run": report["run"],
        "promoted": promoted,
        "reason": reason,
        "latest": f"s3://{bucket}/{key}",
        "pointer": candidate if promoted else current,
    }
