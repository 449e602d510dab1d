"""The promote task (include/promote.py): the run name's latest pointer, against a moto server."""

from __future__ import annotations

import pytest

from include.promote import promote_record
from include.record import RECOLLECTED, collect_record
from pipeline import lake, run_folder
from pipeline.errors import PipelineError
from pipeline.stages import STAGE_NAMES
from tests.include.records import (
    RECORD_BUCKET,
    collected_run,
    latest,
    record,
)


def test_promote_points_latest_at_each_new_model_and_keeps_the_one_before(s3, hook, tmp_path):
    first = collected_run(s3, hook, tmp_path, "promote-1", 0.9)
    decision = promote_record(first["s3_uri"], hook)
    assert decision["promoted"] and decision["reason"] == "the first model of this run name"
    assert decision["latest"] == f"s3://{RECORD_BUCKET}/runs/latest/books.json"
    pointer = latest(s3)
    assert decision["pointer"] == pointer
    assert pointer["run"] == "promote-1" and pointer["model"] == first["s3_uri"] + f"{run_folder.MODEL_FOLDER}/"
    assert pointer["val_nats_per_char"] == 0.9 and "previous" not in pointer
    # The pointer leads to a model that is there.
    model = s3.client().get_object(Bucket=RECORD_BUCKET, Key=pointer["model"].split("/", 3)[3] + "model.keras")
    assert model["Body"].read() == b"\x00model bytes\xff"

    worse = collected_run(s3, hook, tmp_path, "promote-2", 1.4)  # s3.promote: always, the default
    decision = promote_record(worse["s3_uri"], hook)
    assert decision["promoted"] and decision["reason"] == "s3.promote: always"
    assert latest(s3)["run"] == "promote-2"
    assert latest(s3)["previous"] == {"run": "promote-1", "record": first["s3_uri"], "val_nats_per_char": 0.9}

    # A retried promote (say its first attempt wrote the pointer, then lost its worker) keeps it as it is.
    pointer = latest(s3)
    again = promote_record(worse["s3_uri"], hook)
    assert again["promoted"] and again["reason"] == "latest points at this record's model already"
    assert latest(s3) == again["pointer"] == pointer


def test_promote_if_better_keeps_a_better_model_and_takes_an_equal_or_better_one(s3, hook, tmp_path):
    policy = "s3.promote=if_better"
    promote_record(collected_run(s3, hook, tmp_path, "other-name", 0.5, policy, "run_name=sonnets")["s3_uri"], hook)
    # Each run name has its own pointer: a better model of another corpus does not count.
    first = promote_record(collected_run(s3, hook, tmp_path, "gate-1", 1.0, policy, "run_name=plays")["s3_uri"], hook)
    assert first["promoted"] and first["reason"] == "the first model of this run name"

    worse = collected_run(s3, hook, tmp_path, "gate-2", 1.2, policy, "run_name=plays")
    decision = promote_record(worse["s3_uri"], hook)
    assert not decision["promoted"]
    assert decision["reason"] == (
        "validation loss 1.2 nats/char is higher than 1.0 of gate-1, which latest points at (s3.promote: if_better)"
    )
    assert latest(s3, "plays")["run"] == decision["pointer"]["run"] == "gate-1"

    for run_id, nats_per_char in (("gate-3", 1.0), ("gate-4", 0.8)):
        report = collected_run(s3, hook, tmp_path, run_id, nats_per_char, policy, "run_name=plays")
        decision = promote_record(report["s3_uri"], hook)
        assert decision["promoted"], decision["reason"]
        assert decision["reason"].startswith(f"validation loss {nats_per_char} nats/char is no higher than")
        assert latest(s3, "plays")["run"] == run_id
    assert latest(s3, "plays")["previous"]["run"] == "gate-3"
    assert latest(s3, "sonnets")["run"] == "other-name"


def retrain(run_dir: str, nats_per_char: float) -> None:
    """The run folder as the run trained again leaves it: a model of other files and bytes, and its
    validation nats/char."""
    model = lake.join(run_dir, run_folder.MODEL_FOLDER)
    for uri in lake.list_files(model):
        lake.delete(uri)
    lake.write_bytes(lake.join(model, run_folder.MODEL_FILE), b"retrained")
    lake.write_bytes(lake.join(model, "weights.h5"), b"a new file")
    train = lake.read_json(run_folder.stats_uri(run_dir, "train")) | {"final_val_nats_per_char": nats_per_char}
    lake.write_json(run_folder.stats_uri(run_dir, "train"), train)


def served_model(s3, run_name: str) -> dict[str, bytes]:
    """The files of the model the run name's latest pointer names, by path within it."""
    model = latest(s3, run_name)["model"].removeprefix(f"s3://{RECORD_BUCKET}/runs/")
    return record(s3, model.rstrip("/"))


def test_a_worse_model_collected_again_under_if_better_leaves_the_served_bytes(s3, hook, tmp_path, monkeypatch):
    """Its later tasks cleared, a run trains again to a worse model: collect writes a record folder
    of its own, so that neither a collect that stops halfway nor a whole one changes a byte of the
    model latest serves, and promote keeps latest where it is."""
    first = collected_run(s3, hook, tmp_path, "again", 0.9, "s3.promote=if_better", "run_name=epics")
    assert promote_record(first["s3_uri"], hook)["promoted"]
    pointer, served = latest(s3, "epics"), served_model(s3, "epics")
    retrain(first["run_folder"], 1.7)
    load_bytes = hook.load_bytes

    def fail_on_the_model(data, key, **kwargs):
        if key.endswith(f"{run_folder.MODEL_FOLDER}/{run_folder.MODEL_FILE}"):
            raise OSError("connection reset")
        load_bytes(data, key=key, **kwargs)

    monkeypatch.setattr(hook, "load_bytes", fail_on_the_model)
    with pytest.raises(OSError, match="reset"):
        collect_record(first["run_folder"], hook, STAGE_NAMES)
    assert served_model(s3, "epics") == served and latest(s3, "epics") == pointer
    monkeypatch.setattr(hook, "load_bytes", load_bytes)

    again = collect_record(first["run_folder"], hook, STAGE_NAMES)
    assert again["s3_uri"].startswith(f"s3://{RECORD_BUCKET}/runs/again{RECOLLECTED}")
    assert record(s3, again["s3_uri"].split("/")[-2])[f"{run_folder.MODEL_FOLDER}/{run_folder.MODEL_FILE}"] == (
        b"retrained"
    )
    for _ in range(2):  # the second: a retried promote decides alike
        decision = promote_record(again["s3_uri"], hook)
        assert not decision["promoted"] and decision["reason"] == (
            "validation loss 1.7 nats/char is higher than 0.9 of again, which latest points at (s3.promote: if_better)"
        )
        assert latest(s3, "epics") == decision["pointer"] == pointer and pointer["record"] == first["s3_uri"]
        assert served_model(s3, "epics") == served


@pytest.mark.parametrize(("policy", "nats_per_char"), [("if_better", 0.7), ("always", 1.7)])
def test_a_run_collected_again_and_promoted_moves_latest_to_its_new_record(s3, hook, tmp_path, policy, nats_per_char):
    """A better model, or any under s3.promote: always, moves latest to the new record; the one
    before stays whole (a reader that followed latest just before still finds its model)."""
    run_name = f"sagas-{policy}"
    first = collected_run(s3, hook, tmp_path, run_name, 0.9, f"s3.promote={policy}", f"run_name={run_name}")
    assert promote_record(first["s3_uri"], hook)["promoted"]
    before = record(s3, run_name)
    retrain(first["run_folder"], nats_per_char)

    again = collect_record(first["run_folder"], hook, STAGE_NAMES)
    decision = promote_record(again["s3_uri"], hook)

    assert decision["promoted"], decision["reason"]
    pointer = latest(s3, run_name)
    assert pointer["record"] == again["s3_uri"] != first["s3_uri"] and pointer["run"] == run_name
    assert pointer["model"] == again["s3_uri"] + f"{run_folder.MODEL_FOLDER}/"
    assert pointer["val_nats_per_char"] == nats_per_char and pointer["collected_at"] == again["collected_at"]
    assert pointer["previous"] == {"run": run_name, "record": first["s3_uri"], "val_nats_per_char": 0.9}
    assert served_model(s3, run_name) == {run_folder.MODEL_FILE: b"retrained", "weights.h5": b"a new file"}
    assert record(s3, run_name) == before
    # A retried promote (its first attempt wrote the pointer, then lost its worker) keeps it as it is.
    again_decision = promote_record(again["s3_uri"], hook)
    assert again_decision["promoted"] and again_decision["reason"] == "latest points at this record's model already"
    assert latest(s3, run_name) == again_decision["pointer"] == pointer


def test_promote_refuses_a_record_collect_has_not_finished(s3, hook, tmp_path):
    report = collected_run(s3, hook, tmp_path, "half-copied", 0.9, "run_name=poems")
    key = report["s3_uri"].split("/", 3)[3] + run_folder.REPORT_JSON
    s3.client().delete_object(Bucket=RECORD_BUCKET, Key=key)
    with pytest.raises(PipelineError, match=r"has no report.json: collect did not finish"):
        promote_record(report["s3_uri"], hook)
    assert "Contents" not in s3.client().list_objects_v2(Bucket=RECORD_BUCKET, Prefix="runs/latest/poems")


def test_the_pointer_names_each_format_of_the_model_and_of_an_older_run_the_keras_one(s3, hook, tmp_path):
    run = collected_run(s3, hook, tmp_path, "formats-1", 0.9)
    promote_record(run["s3_uri"], hook)
    model = run["s3_uri"] + f"{run_folder.MODEL_FOLDER}/"
    assert latest(s3)["model_formats"] == {
        "keras": model,
        "huggingface": f"{model}hf/",
        "saved_model": f"{model}saved_model/",
    }
    config = s3.client().get_object(Bucket=RECORD_BUCKET, Key=f"runs/formats-1/{run_folder.MODEL_HF_PATH}/config.json")
    assert config["Body"].read() == b'{"model_type": "gpt2"}'

    older = collected_run(s3, hook, tmp_path, "formats-2", 0.9, model_formats=False)
    promote_record(older["s3_uri"], hook)
    assert latest(s3)["model_formats"] == {"keras": older["s3_uri"] + f"{run_folder.MODEL_FOLDER}/"}
