"""The collect task's copy of a run's record to S3 (include/record.py) through the amazon provider's
S3Hook and the Airflow connection, against a moto server: from a local run folder and from an s3:// one."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

from include.record import RECOLLECTED, collect_record
from include.report_link import report_url
from pipeline import lake, run_folder
from pipeline.config_files import load_config
from pipeline.errors import PipelineError
from pipeline.stages import CLUSTER_CHECK, STAGE_NAMES
from tests.include.records import (
    LAKE_BUCKET,
    MODEL_FORMAT_FILES,
    RECORD_BUCKET,
    SHORT_FILE_WARNING,
    finished_run,
    record,
    run_files,
)


@pytest.mark.parametrize("lake_root", ["local", f"s3://{LAKE_BUCKET}/lake"])
def test_collect_copies_the_record_and_writes_the_report(s3, hook, tmp_path, lake_root):
    # A run folder on S3 is the EMR target's.
    on_s3 = {"lake": lake_root, "target": "emr"}
    config = load_config(overrides=[{"lake": str(tmp_path / "lake")} if lake_root == "local" else on_s3])
    run_dir = run_folder.run_dir(config, f"run-{len(lake_root)}")
    files = run_files(config.to_json())
    stray = f"{run_folder.STATS_FOLDER}/{lake.temporary_name('train.json')}"  # a killed writer's: not the record's
    finished_run(s3, run_dir, files | {stray: b"half a fi"})

    report = collect_record(run_dir, hook, STAGE_NAMES)

    name = run_dir.rsplit("/", 1)[1]
    copied = record(s3, name)
    kept = {key: data for key, data in files.items() if not key.startswith(f"{run_folder.TOKENS_FOLDER}/")}
    assert {key: copied[key] for key in kept} == kept
    assert set(copied) == set(kept) | set(run_folder.REPORTS)
    html = s3.client().head_object(Bucket=RECORD_BUCKET, Key=f"runs/{name}/{run_folder.REPORT_HTML}")
    assert html["ContentType"] == "text/html; charset=utf-8"  # a browser shows it opened from S3
    assert lake.read_bytes(lake.join(run_dir, run_folder.REPORT_HTML)) == copied[run_folder.REPORT_HTML]
    assert json.loads(copied[run_folder.REPORT_JSON]) == report
    assert report["s3_uri"] == f"s3://{RECORD_BUCKET}/runs/{name}/"
    assert (report["final_val_loss"], report["val_nats_per_char"]) == (2.5, 0.9)
    assert report["stage_seconds"] == {stage: (9.0 if stage == "train" else 1.5) for stage in STAGE_NAMES}
    assert report["sample"] == "The man starts with a sample"
    text = copied[run_folder.REPORT_TEXT].decode()
    # The run folder keeps the report too, until a stage runs there again.
    assert lake.read_text(lake.join(run_dir, run_folder.REPORT_TEXT)) == text
    assert json.loads(lake.read_text(lake.join(run_dir, run_folder.REPORT_JSON))) == report
    run_folder.clear_stage(run_dir, "generate")
    assert not lake.exists(lake.join(run_dir, run_folder.REPORT_TEXT)) and not lake.exists(
        lake.join(run_dir, run_folder.REPORT_JSON)
    )
    assert "Final validation loss: **2.5000 nats/token**, **0.9000 nats/char**." in text
    assert f"- corpus: {config.corpus[0]} (1 file): train 9,000 characters, 4,000 tokens, 60 windows; val 1,000" in text
    assert "- model: 4 layers, 4 heads, width 128, 64 tokens of context, vocabulary 300: 123,456 parameters" in text
    assert "- training: 40 steps on 2 workers, 5,123 tokens/s, 8 s\n" in text
    assert "| 20 | 3.1 | 2.7 | 1 | 0.002 |\n| 40 | 2.6 | 2.5 | 0.9 | 0.0002 |\n" in text
    assert report["evaluations"][-1] == {
        "step": 40,
        "train_loss": 2.6,
        "val_loss": 2.5,
        "val_nats_per_char": 0.9,
        "learning_rate": 0.0002,
    }
    # Stage warnings travel with the report, so that a run on EMR shows them too.
    assert report["warnings"] == [f"[window] {SHORT_FILE_WARNING}"]
    assert f"## Warnings\n\n- [window] {SHORT_FILE_WARNING}\n" in copied[run_folder.REPORT_TEXT].decode()
    # Without the EMR target's cluster check (a local run, an older run folder), no such section.
    assert report["cluster_check"] is None and "## Cluster check" not in text


def test_a_run_collected_again_gets_a_record_folder_of_its_own_each_time(s3, hook, tmp_path):
    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}])
    run_dir = run_folder.run_dir(config, "twice")
    finished_run(s3, run_dir, run_files(config.to_json()))
    first = collect_record(run_dir, hook, STAGE_NAMES)
    whole = record(s3, "twice")

    again = [collect_record(run_dir, hook, STAGE_NAMES)["s3_uri"] for _ in range(2)]

    assert first["s3_uri"] == f"s3://{RECORD_BUCKET}/runs/twice/"
    for uri in again:
        assert re.fullmatch(rf"s3://{RECORD_BUCKET}/runs/twice{RECOLLECTED}\d{{8}}T\d{{6}}\.\d{{6}}Z/", uri), uri
        assert set(record(s3, uri.split("/")[-2])) == set(whole)
    assert len(set(again)) == 2 and record(s3, "twice") == whole  # the first record, untouched


def test_a_collect_that_stopped_halfway_is_finished_in_its_record_folder(s3, hook, tmp_path):
    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}])
    run_dir = run_folder.run_dir(config, "halfway")
    finished_run(s3, run_dir, run_files(config.to_json()))
    # What a collect that stopped before its report.json left: part of the record, a file the run
    # folder has no longer, the report's other files.
    left = {f"{run_folder.MODEL_FOLDER}/weights.h5": b"gone from the run", run_folder.REPORT_TEXT: b"# an old report"}
    for path, data in left.items():
        s3.client().put_object(Bucket=RECORD_BUCKET, Key=f"runs/halfway/{path}", Body=data)

    report = collect_record(run_dir, hook, STAGE_NAMES)

    assert report["s3_uri"] == f"s3://{RECORD_BUCKET}/runs/halfway/"
    copied = record(s3, "halfway")
    assert f"{run_folder.MODEL_FOLDER}/weights.h5" not in copied
    assert copied[run_folder.REPORT_TEXT] != left[run_folder.REPORT_TEXT]
    assert json.loads(copied[run_folder.REPORT_JSON]) == report


def test_the_report_of_an_emr_run_shows_what_its_cluster_check_found(s3, hook, tmp_path):
    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}])
    run_dir = run_folder.run_dir(config, "run-checked")
    node = {"worker": 0, "address": "10.0.1.17", "versions": {"python": "3.11.14"}, "import_errors": {}}
    found = {"master": "yarn", "nodes": [node], "distinct_addresses": True, "yarn": None, "executor_mb": {}}
    check = {run_folder.stats_path(CLUSTER_CHECK.name): json.dumps(found | {"duration_s": 4.2}).encode()}
    finished_run(s3, run_dir, run_files(config.to_json()) | check)

    report = collect_record(run_dir, hook, STAGE_NAMES)

    assert report["cluster_check"] == found
    assert "| 0 | 10.0.1.17 | 3.11.14 |" in record(s3, "run-checked")[run_folder.REPORT_TEXT].decode()


def test_a_run_folder_that_cannot_take_the_report_still_gets_a_whole_record(s3, hook, tmp_path, monkeypatch, caplog):
    from include import record as record_module

    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}])
    run_dir = run_folder.run_dir(config, "read-only")
    finished_run(s3, run_dir, run_files(config.to_json()))

    def refuse(self, relative, data):
        raise PermissionError(f"cannot write {relative}")

    monkeypatch.setattr(record_module.StoredRun, "write", refuse)
    report = collect_record(run_dir, hook, STAGE_NAMES)
    assert (
        set(record(s3, "read-only")) >= {run_folder.REPORT_JSON, run_folder.REPORT_TEXT}
        and report["final_val_loss"] == 2.5
    )
    assert f"the report was not copied to the run folder {run_dir}: cannot write report.md" in caplog.text


def test_an_unfinished_run_is_not_collected(s3, hook, tmp_path):
    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}])
    run_dir = run_folder.run_dir(config, "unfinished")
    files = run_files(config.to_json())
    del files[run_folder.SAMPLES_PATH]
    finished_run(s3, run_dir, files)
    with pytest.raises(PipelineError, match="has no samples.txt: the run did not complete"):
        collect_record(run_dir, hook, STAGE_NAMES)


def test_a_missing_bucket_is_named(s3, hook, tmp_path):
    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}, "s3.bucket=no-such-bucket"])
    run_dir = run_folder.run_dir(config, "nowhere")
    finished_run(s3, run_dir, run_files(config.to_json()))
    with pytest.raises(PipelineError, match="s3.bucket: bucket 'no-such-bucket' does not exist"):
        collect_record(run_dir, hook, STAGE_NAMES)


@pytest.mark.parametrize("prefix", ["", "/", "records/2026"])
def test_make_run_reads_the_report_collect_wrote_whatever_the_prefix(s3, hook, tmp_path, prefix):
    from local_platform.dag_test import read_report

    bucket = f"prefix-{len(prefix)}"
    s3.client().create_bucket(Bucket=bucket)
    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}, f"s3.bucket={bucket}", f"s3.prefix={prefix}"])
    run_dir = run_folder.run_dir(config, "books-1")
    finished_run(s3, run_dir, run_files(config.to_json()))
    report = collect_record(run_dir, hook, STAGE_NAMES)
    assert read_report(s3, config) == report


def test_the_run_report_link_opens_report_html_on_an_s3_endpoint_of_its_own(s3, hook, tmp_path):
    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}])
    run_dir = run_folder.run_dir(config, "linked")
    finished_run(s3, run_dir, run_files(config.to_json()))
    url = report_url(collect_record(run_dir, hook, STAGE_NAMES)["s3_uri"], hook)
    assert url.startswith(f"{s3.endpoint_url}/{RECORD_BUCKET}/runs/linked/report.html?")
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=30) as response:  # loopback
        assert response.headers["Content-Type"] == "text/html; charset=utf-8"
        assert response.read() == record(s3, "linked")[run_folder.REPORT_HTML]


@pytest.mark.parametrize("model_formats", [True, False])  # False: a run trained before the other formats
def test_the_record_holds_the_models_formats_and_the_report_says_how_to_load_each(s3, hook, tmp_path, model_formats):
    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}])
    run_dir = run_folder.run_dir(config, f"formats-{model_formats}")
    finished_run(s3, run_dir, run_files(config.to_json(), model_formats=model_formats))

    report = collect_record(run_dir, hook, STAGE_NAMES)

    copied = record(s3, run_dir.rsplit("/", 1)[1])
    assert all(copied.get(path) == data for path, data in MODEL_FORMAT_FILES.items()) == model_formats
    model = f"{report['s3_uri']}{run_folder.MODEL_FOLDER}/"
    expected = {"keras": model}
    if model_formats:
        expected |= {"huggingface": f"{model}hf/", "saved_model": f"{model}saved_model/"}
    assert {name: entry["uri"] for name, entry in report["model_formats"].items()} == expected
    text, html = copied[run_folder.REPORT_TEXT].decode(), copied[run_folder.REPORT_HTML].decode()
    for name, entry in report["model_formats"].items():
        assert f"- {name}: {entry['uri']}\n  `{entry['load']}`\n" in text
        assert f"<code>{entry['uri']}</code>" in html
    assert ("AutoModelForCausalLM.from_pretrained" in text) == model_formats
    assert ("tf.saved_model.load" in text) == model_formats
