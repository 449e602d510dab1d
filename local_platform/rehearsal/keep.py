"""What a rehearsal leaves to look at: its moto server, which holds the run folder, the record with
report.html, the model and the EMR steps' logs, ends with the command, so its buckets are copied
first to a folder of their own under rehearsals/ in the checkout: s3://bucket/key becomes
rehearsals/<name>/bucket/key."""

from __future__ import annotations

import shutil
import tempfile
from itertools import count
from pathlib import Path

from local_platform.rehearsal.emr_runner import split_s3

REHEARSALS = Path(__file__).resolve().parents[2] / "rehearsals"


def keep_buckets(client, parent: Path, name: str, leave_out: tuple[str, ...] = ()) -> Path:
    """Copy every object of the server's buckets, but the keys that start with one of `leave_out`,
    to a new folder parent/<name> (name-2, ... when taken), and return it. The copy is made under
    a hidden name and renamed when whole: a kept folder is complete, and never an earlier one's."""
    parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=parent))
    try:
        for bucket in client.list_buckets()["Buckets"]:
            copy_bucket(client, bucket["Name"], partial, leave_out)
        return settle(partial, parent, name)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def copy_bucket(client, bucket: str, folder: Path, leave_out: tuple[str, ...]) -> None:
    root = (folder / bucket).resolve()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            key = item["Key"]
            target = (root / key).resolve()
            # Folder markers hold nothing; a key with '..' must not write outside the copy.
            if key.startswith(leave_out) or key.endswith("/") or not target.is_relative_to(root):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("wb") as file:
                shutil.copyfileobj(client.get_object(Bucket=bucket, Key=key)["Body"], file)


def settle(partial: Path, parent: Path, name: str) -> Path:
    """The whole copy renamed to parent/name, or name-2, ... when an earlier rehearsal has that name."""
    for number in count(1):
        kept = parent / (name if number == 1 else f"{name}-{number}")
        if not kept.exists():
            partial.rename(kept)
            return kept


def kept_path(kept: Path, uri: str) -> Path:
    """Where the copy in `kept` of an s3:// URI of the rehearsal's server is."""
    bucket, key = split_s3(uri)
    return kept / bucket / key
