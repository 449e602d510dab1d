"""The run's record: a stored run's files read and written on local disk or on S3 through the
Airflow connection (StoredRun), the files of a run folder that make the record, and the collect
task, which copies them to S3 with the run's report.

The record is the resolved config, stats/, model/, spark-events/, samples.txt and tensorboard/ of the run
folder; it goes to s3://{s3.bucket}/{s3.prefix}/{run folder name}/ through the amazon provider's S3Hook, so the
Airflow AWS connection decides where S3 is (AWS, LocalStack or a local moto server). A run collected
again gets a record of its own beside that one, {run folder name}.recollected-{UTC time}/: a whole
record, which the latest pointer may name, is never written over, and no task removes one.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
from datetime import datetime, timezone
from pathlib import Path

from include.report import build_report, report_text
from include.report_html import report_html
from pipeline import lake, run_folder
from pipeline.errors import PipelineError

log = logging.getLogger(__name__)

AWS_CONN_ID = "aws_default"
RECORD_FILES = (run_folder.CONFIG_FILE, run_folder.SAMPLES_PATH)
RECORD_FOLDERS = tuple(
    f"{folder}/"
    for folder in (
        run_folder.STATS_FOLDER,
        run_folder.MODEL_FOLDER,
        run_folder.SPARK_EVENTS_FOLDER,
        run_folder.TENSORBOARD_FOLDER,
    )
)
# What a record folder of a run collected again adds to the run folder's name, before the collect's UTC time.
RECOLLECTED = ".recollected-"
# The reports' media types on S3: a browser shows report.html opened from there (the console, a link).
CONTENT_TYPES = {
    run_folder.REPORT_JSON: "application/json",
    run_folder.REPORT_TEXT: "text/markdown; charset=utf-8",
    run_folder.REPORT_HTML: "text/html; charset=utf-8",
}


class StoredRun:
    """A run as stored in a folder, its run folder in the lake or its record on S3: lists, reads and
    writes its files on local disk (file://) or on S3 through the hook, so the Airflow connection
    decides where S3 is."""

    def __init__(self, uri: str, hook):
        self.uri = uri.rstrip("/")
        self.hook = hook
        self.name = posixpath.basename(self.uri)

    def files(self) -> list[str]:
        """Paths of every file in the folder, relative to it. On S3, not the empty objects named
        after a folder (`model/hf/`) that pyarrow's file system leaves as it makes one: no file."""
        if self.uri.startswith("s3://"):
            bucket, prefix = self.hook.parse_s3_url(self.uri)
            keys = self.hook.list_keys(bucket_name=bucket, prefix=prefix + "/") or []
            return sorted(key[len(prefix) + 1 :] for key in keys if not key.endswith("/"))
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

    def siblings(self) -> list[StoredRun]:
        """The run folders of the lake, this one among them."""
        runs = posixpath.dirname(self.uri)
        if runs.startswith("s3://"):
            bucket, prefix = self.hook.parse_s3_url(runs)
            folders = self.hook.list_prefixes(bucket_name=bucket, prefix=prefix + "/", delimiter="/") or []
            return [StoredRun(f"s3://{bucket}/{folder.rstrip('/')}", self.hook) for folder in sorted(folders)]
        local = Path(lake.local_path(runs))
        return [StoredRun(lake.join(runs, path.name), self.hook) for path in sorted(local.iterdir()) if path.is_dir()]


def record_files(run: StoredRun) -> list[str]:
    files = [
        path
        for path in run.files()
        if (path in RECORD_FILES or path.startswith(RECORD_FOLDERS)) and not lake.is_temporary(path)
    ]
    missing = [name for name in RECORD_FILES if name not in files]
    if missing:
        raise PipelineError(f"run folder {run.uri} has no {', '.join(missing)}: the run did not complete")
    return files


def check_bucket(hook, bucket: str, setting: str) -> str:
    """`bucket`, named by the config's `setting`, which must exist (validate_config checks the
    record's and, on EMR, the logs' before the run too)."""
    if not hook.check_for_bucket(bucket):
        raise PipelineError(
            f"{setting}: bucket {bucket!r} does not exist or is not accessible through the Airflow "
            f"connection {hook.aws_conn_id}"
        )
    return bucket


def record_prefix(hook, bucket: str, records_prefix: str, folder_name: str) -> str:
    """The key prefix of the record a collect of the run folder `folder_name` writes:
    {records_prefix}/{folder_name} the first time (again after a collect there stopped short of its
    report), and a new one each time the run is collected again, {folder_name}.recollected-{UTC time
    to the microsecond}."""
    first = posixpath.join(records_prefix.strip("/"), folder_name)
    if not hook.check_for_key(posixpath.join(first, run_folder.REPORT_JSON), bucket_name=bucket):
        return first
    return f"{first}{RECOLLECTED}{datetime.now(timezone.utc):%Y%m%dT%H%M%S.%fZ}"


def collect_record(run_dir: str, hook, stages: tuple[str, ...], extra: dict | None = None) -> dict:
    """Copy the run's record to S3, into a record folder no whole record is in (record_prefix), then
    the report (written last: its presence means complete); the run folder gets the report too (a
    command that uses the folder again removes it). `extra` goes into the report as it is (on EMR: the
    cluster and its steps, under "emr")."""
    run = StoredRun(run_dir, hook)
    config = run_folder.read_config(run.uri, run.read)
    bucket = check_bucket(hook, config.s3.bucket, "s3.bucket")
    paths = record_files(run)
    prefix = record_prefix(hook, bucket, config.s3.prefix, run.name)
    record = StoredRun(f"s3://{bucket}/{prefix}", hook)
    for path in paths:
        hook.load_bytes(run.read(path), key=f"{prefix}/{path}", bucket_name=bucket, replace=True)
    record.remove(*[path for path in record.files() if path not in paths])  # a collect's that stopped halfway here
    report = build_report(run, f"s3://{bucket}/{prefix}/", stages) | (extra or {})
    files = {  # report.json last
        run_folder.REPORT_TEXT: report_text(report),
        run_folder.REPORT_HTML: report_html(report),
        run_folder.REPORT_JSON: json.dumps(report, indent=2),
    }
    for name, text in files.items():
        hook.conn.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=text.encode(), ContentType=CONTENT_TYPES[name])
    try:
        for name, text in files.items():
            run.write(name, text.encode("utf-8"))
    except Exception as error:  # a copy for convenience (the record has it): e.g. a lake Airflow may only read
        log.warning("the report was not copied to the run folder %s: %s", run.uri, error)
    return report
