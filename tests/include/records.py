"""Run folders as the stages leave them, and the records collect makes of them, for the tests of
include/record.py, report.py, promote.py and prune.py against a moto server."""

from __future__ import annotations

import json

from include.record import collect_record
from pipeline import lake, run_folder
from pipeline.config_files import load_config
from pipeline.stages import STAGE_NAMES

RECORD_BUCKET = "gpt-pipeline"
LAKE_BUCKET = "lake-bucket"


def finished_run(s3, run_dir: str, files: dict[str, bytes]) -> None:
    """A run folder as the stages leave it, written to local disk or to the lake bucket."""
    for name, data in files.items():
        if run_dir.startswith("s3://"):
            bucket, _, prefix = run_dir.removeprefix("s3://").partition("/")
            s3.client().put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=data)
        else:
            lake.write_bytes(lake.join(run_dir, name), data)


SHORT_FILE_WARNING = "corpus file file:///c/a.txt: its validation part has 4 tokens, fewer than one window (129)"


# The model's other formats, in a run folder whose train stage wrote them (spark_jobs.training.backups).
MODEL_FORMAT_FILES = {
    f"{run_folder.MODEL_HF_PATH}/config.json": b'{"model_type": "gpt2"}',
    f"{run_folder.MODEL_HF_PATH}/model.safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ",
    f"{run_folder.MODEL_SAVED_MODEL_PATH}/saved_model.pb": b"\x00graph",
    f"{run_folder.MODEL_SAVED_MODEL_PATH}/variables/variables.index": b"\x00index",
}


def run_files(config_json: str, nats_per_char: float = 0.9, model_formats: bool = True) -> dict[str, bytes]:
    """A finished run's files; without model_formats, as a run trained before the model's other formats."""
    stats = run_folder.stats_path
    files = {stats(stage): json.dumps({"duration_s": 1.5}).encode() for stage in STAGE_NAMES}
    files[stats("window")] = json.dumps({"duration_s": 1.5, "warnings": [SHORT_FILE_WARNING]}).encode()
    files[stats("tokenize")] = json.dumps({"duration_s": 1.5, "files": 1, "tokenizer": {"vocab_size": 300}}).encode()
    splits = {
        "train": {"chars": 9000, "tokens": 4000, "windows": 60},
        "val": {"chars": 1000, "tokens": 450, "windows": 5},
    }
    files[stats("export")] = json.dumps({"duration_s": 1.5, "splits": splits}).encode()
    train = {
        "duration_s": 9.0,
        "final_val_loss": 2.5,
        "final_val_nats_per_char": nats_per_char,
        "steps": 40,
        "workers": 2,
        "parameters": 123456,
        "tokens_per_s": 5123.4,
        "train_wall_s": 8.2,
    }
    files |= {
        run_folder.CONFIG_FILE: config_json.encode(),
        stats("train"): json.dumps(train).encode(),
        run_folder.EPOCHS_CSV_PATH: b"epoch,step,train_loss,val_loss,val_nats_per_char,learning_rate\n"
        + b"1,20,3.1,2.7,1.0,0.002\n"
        + f"2,40,2.6,2.5,{nats_per_char},0.0002\n".encode(),
        f"{run_folder.MODEL_FOLDER}/{run_folder.MODEL_FILE}": b"\x00model bytes\xff",
        f"{run_folder.MODEL_FOLDER}/{run_folder.MODEL_TOKENIZER_FILE}": b"{}",
        run_folder.SAMPLES_PATH: "The man starts with a sample".encode(),
        f"{run_folder.TENSORBOARD_FOLDER}/events.out.tfevents.1.node.7.0.v2": b"\x18training events",
        f"{run_folder.TENSORBOARD_FOLDER}/events.out.tfevents.2.node.9.0.samples.v2": b"\x18sample events",
        f"{run_folder.TOKENS_FOLDER}/part-0.parquet": b"not part of the record",
    }
    return files | (MODEL_FORMAT_FILES if model_formats else {})


def record(s3, run_name: str) -> dict[str, bytes]:
    client, prefix = s3.client(), f"runs/{run_name}/"
    keys = [item["Key"] for item in client.list_objects_v2(Bucket=RECORD_BUCKET, Prefix=prefix)["Contents"]]
    return {key[len(prefix) :]: client.get_object(Bucket=RECORD_BUCKET, Key=key)["Body"].read() for key in keys}


def collected_run(
    s3, hook, tmp_path, run_id: str, nats_per_char: float, *settings: str, model_formats: bool = True
) -> dict:
    """The report of a run collected to the record bucket, named `books` whatever its id."""
    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}, "run_name=books", *settings])
    run_dir = run_folder.run_dir(config, run_id)
    finished_run(s3, run_dir, run_files(config.to_json(), nats_per_char, model_formats))
    return collect_record(run_dir, hook, STAGE_NAMES)


def latest(s3, run_name: str = "books") -> dict:
    return json.loads(s3.client().get_object(Bucket=RECORD_BUCKET, Key=f"runs/latest/{run_name}.json")["Body"].read())
