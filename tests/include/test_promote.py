"""The promote task (include/promote.py): the run name's latest pointer, against a moto server."""

from __future__ import annotations

import pytest

from include.promote import promote_record
from include.record import collect_record
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
    assert again["promoted"] and again["reason"] == "latest points at this run's model already"
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


def test_a_run_collected_again_replaces_its_record_and_the_pointer_follows(s3, hook, tmp_path, monkeypatch):
    """Its later tasks cleared, a run trains again and collect copies over its record: until the new
    report is in, the record is not whole, and latest, which pointed at the old model, now points at
    the new one with its figures, even under if_better (the old model is gone)."""
    first = collected_run(s3, hook, tmp_path, "again", 0.9, "s3.promote=if_better", "run_name=epics")
    assert promote_record(first["s3_uri"], hook)["promoted"]
    run_dir = first["run_folder"]
    lake.write_bytes(lake.join(run_dir, f"{run_folder.MODEL_FOLDER}/{run_folder.MODEL_FILE}"), b"retrained")
    lake.delete(lake.join(run_dir, f"{run_folder.MODEL_FOLDER}/{run_folder.MODEL_TOKENIZER_FILE}"))
    lake.write_bytes(lake.join(run_dir, f"{run_folder.MODEL_FOLDER}/weights.h5"), b"a new file")
    train = lake.read_json(run_folder.stats_uri(run_dir, "train")) | {"final_val_nats_per_char": 1.7}
    lake.write_json(run_folder.stats_uri(run_dir, "train"), train)
    load_bytes = hook.load_bytes

    def fail_on_the_model(data, key, **kwargs):
        if key.endswith(f"{run_folder.MODEL_FOLDER}/{run_folder.MODEL_FILE}"):
            raise OSError("connection reset")
        load_bytes(data, key=key, **kwargs)

    monkeypatch.setattr(hook, "load_bytes", fail_on_the_model)
    with pytest.raises(OSError, match="reset"):
        collect_record(run_dir, hook, STAGE_NAMES)
    with pytest.raises(PipelineError, match="has no report.json: collect did not finish"):
        promote_record(first["s3_uri"], hook)
    monkeypatch.setattr(hook, "load_bytes", load_bytes)

    again = collect_record(run_dir, hook, STAGE_NAMES)
    files = record(s3, "again")
    assert (
        files[f"{run_folder.MODEL_FOLDER}/{run_folder.MODEL_FILE}"] == b"retrained"
        and f"{run_folder.MODEL_FOLDER}/{run_folder.MODEL_TOKENIZER_FILE}" not in files
    )
    decision = promote_record(again["s3_uri"], hook)
    assert decision["promoted"] and decision["reason"].startswith("this run was collected again")
    pointer = latest(s3, "epics")
    assert pointer["val_nats_per_char"] == 1.7 and pointer["collected_at"] == again["collected_at"]
    assert promote_record(again["s3_uri"], hook)["reason"] == "latest points at this run's model already"


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
