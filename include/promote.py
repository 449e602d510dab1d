"""The promote task: point the run name's `latest` pointer at a collected record's model, and
where those pointers are.

The pointer is s3://{s3.bucket}/{s3.prefix}/latest/{run_name}.json: where consumers of the newest
model look.
"""

from __future__ import annotations

import json
import posixpath
from datetime import datetime, timezone

from include.record import StoredRun
from pipeline import run_folder
from pipeline.errors import PipelineError

LATEST_FOLDER = "latest"


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


def names_the_same_collect(pointer: dict, candidate: dict) -> bool:
    """Whether `pointer` names the record `candidate` would: each collect writes a record folder of
    its own (include.record.record_prefix), so only a retried promote finds it named already."""
    return (pointer.get("record"), pointer.get("collected_at")) == (candidate["record"], candidate["collected_at"])


def promote_record(record_uri: str, hook) -> dict:
    """Point latest/{run_name}.json at the collected record in `record_uri`, unless s3.promote is
    if_better and the model it points at now has the lower validation nats/char. A run collected
    again is decided alike: its new record is beside the one latest may point at, which stays whole.

    Returns the decision: `promoted`, the pointer's URI, the pointer written (or kept) and the reason."""
    bucket, prefix = hook.parse_s3_url(record_uri)
    read = lambda key: json.loads(hook.read_key(key, bucket_name=bucket))  # noqa: E731
    if not hook.check_for_key(posixpath.join(prefix, run_folder.REPORT_JSON), bucket_name=bucket):
        raise PipelineError(f"record {record_uri} has no {run_folder.REPORT_JSON}: collect did not finish")
    report = read(posixpath.join(prefix, run_folder.REPORT_JSON))  # written last by collect: the record is whole
    config = run_folder.read_config(record_uri, StoredRun(record_uri, hook).read)
    key = latest_key(config)
    current = read(key) if hook.check_for_key(key, bucket_name=bucket) else None
    candidate = {
        "run": report["run"],
        "record": report["s3_uri"],
        "model": report["s3_uri"] + f"{run_folder.MODEL_FOLDER}/",
        # every format the record has, by name (keras, huggingface, saved_model): none in older reports
        "model_formats": {name: entry["uri"] for name, entry in report.get("model_formats", {}).items()},
        "final_val_loss": report["final_val_loss"],
        "val_nats_per_char": report["val_nats_per_char"],
        "collected_at": report["collected_at"],
        "promoted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if current is not None and names_the_same_collect(current, candidate):  # a retried promote
        promoted, reason, candidate = True, "latest points at this record's model already", current
    else:
        promoted, reason = promotion(candidate, current, config.s3.promote)
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


def latest_run(config, hook) -> str | None:
    """The run folder name whose model the run name's latest pointer names, if there is one."""
    key = latest_key(config)
    if not hook.check_for_key(key, bucket_name=config.s3.bucket):
        return None
    return json.loads(hook.read_key(key, bucket_name=config.s3.bucket))["run"]
