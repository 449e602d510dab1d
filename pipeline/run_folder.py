"""The run-folder contract: every path of a run folder, the stages' completion markers, and the one
reader of the run's config.json (read_config).

Every run writes under one run folder, {lake}/runs/{run_id}/; stages talk to each other only
through it, and no other module spells its paths. Paths here are relative to the run folder
(`lake.join(run, PATH)` is the file's URI), except where a function returns a URI.

A stage is complete when its stats file stats/{stage}.json exists: stages write their outputs
first and that file last, and clear it before they start, so a crashed stage never looks finished.
Starting a stage also removes the completion markers of the stages that read its outputs
(pipeline.stages), so they never look finished with outputs made from older inputs; their
other files stay until they run again.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable

from pipeline import lake
from pipeline.config import ConfigError, PipelineConfig
from pipeline.config_files import validate
from pipeline.errors import PipelineError

RUNS_FOLDER = "runs"  # in the lake: the run folders

# What the run starts with: the resolved config (create_run).
CONFIG_FILE = "config.json"
# tokenize's: the tokenizer (read by window when packing, and by train) and the tokens (Parquet).
TOKENIZER_FOLDER = "tokenizer"
TOKENIZER_PATH = f"{TOKENIZER_FOLDER}/tokenizer.json"
TOKENS_FOLDER = "tokens"
# window's: the windows (Parquet).
WINDOWS_FOLDER = "windows"
# positional_embed's: the token vectors [V, D], the position table [T, D] and what they hold.
EMBEDDINGS_FOLDER = "embeddings"
TOKEN_VECTORS_PATH = f"{EMBEDDINGS_FOLDER}/token_vectors.npy"
POSITIONS_PATH = f"{EMBEDDINGS_FOLDER}/positions.npy"
EMBEDDINGS_META_PATH = f"{EMBEDDINGS_FOLDER}/meta.json"
# export's: the TFRecord shards, tfrecords/{split}/part-*.tfrecord, and their manifest (read by train).
TFRECORDS_FOLDER = "tfrecords"
MANIFEST_PATH = f"{TFRECORDS_FOLDER}/manifest.json"
# Where a stage stages its output before moving it in place (hidden from readers by its '_').
STAGING_FOLDER = "_staging"
# smoke's (the EMR target's cluster check): each node's probe object, written, read back and removed.
SMOKE_PROBE_FOLDER = "_smoke"
# Every stage's stats, its completion marker (stats_path); train's curve besides.
STATS_FOLDER = "stats"
EPOCHS_CSV_PATH = f"{STATS_FOLDER}/epochs.csv"
# The training loss, learning rate and speed at every train.log_interval (the report's curves).
STEPS_CSV_PATH = f"{STATS_FOLDER}/steps.csv"
ERRORS_FOLDER = "errors"  # error_path
# Every Spark application's event log, one file per stage (spark_event_log_path), for the History Server.
SPARK_EVENTS_FOLDER = "spark-events"
PROGRESS_FOLDER = "progress"  # progress_path
# train's: the backup an unfinished training resumes from, and the model with a copy of the tokenizer.
BACKUP_FOLDER = "checkpoints"
BACKUP_PATH = f"{BACKUP_FOLDER}/state.npz"
MODEL_FOLDER = "model"
MODEL_FILE = "model.keras"  # in the model folder
MODEL_TOKENIZER_FILE = "tokenizer.json"  # in the model folder
# The same weights in formats other tools load (spark_jobs.model.export_hf, export_saved_model), in the
# model folder; models of runs trained before they were written have neither.
MODEL_HF_FOLDER = "hf"  # a Hugging Face GPT-2 checkpoint: transformers' AutoModelForCausalLM, AutoTokenizer
MODEL_SAVED_MODEL_FOLDER = "saved_model"  # a TensorFlow SavedModel: tf.saved_model.load, TF Serving
MODEL_HF_PATH = f"{MODEL_FOLDER}/{MODEL_HF_FOLDER}"
MODEL_SAVED_MODEL_PATH = f"{MODEL_FOLDER}/{MODEL_SAVED_MODEL_FOLDER}"
# generate's: prompt and continuation.
SAMPLES_PATH = "samples.txt"
# TensorBoard's event files: train's scalars (the chief's) and generate's samples (spark_jobs.training.tensorboard_log).
TENSORBOARD_FOLDER = "tensorboard"
# The run's report, written by the collect task once every stage has completed.
REPORT_JSON = "report.json"
REPORT_TEXT = "report.md"
REPORT_HTML = "report.html"  # one file: its charts and styles inline
REPORTS = (REPORT_JSON, REPORT_TEXT, REPORT_HTML)
# Held by the command or task using a local run folder (include/locks.py); hidden: no reader of the
# run folder takes it for an output.
LOCK_FILE = ".in-use.lock"
# In a run folder that prune_runs has begun to remove (include/prune.py).
REMOVING = "REMOVING"


# Reads a file of a run folder, named by its path there, as bytes: how the reading functions below
# reach a run folder the lake cannot (Airflow's tasks read S3 through their connection, include/record.py).
ReadFile = Callable[[str], bytes]
RUN_ID_HASH_CHARS = 8  # of the SHA-256 of a run id safe_run_id had to change


class StageIncomplete(PipelineError):
    """A stage's input is missing because the stage that writes it has not completed."""


def runs_folder(lake_uri: str) -> str:
    """The lake's folder of run folders."""
    return lake.join(lake_uri, RUNS_FOLDER)


def run_dir(config: PipelineConfig, run_id: str) -> str:
    """The run folder of `run_id`, a folder name already (safe_run_id's): any other is refused."""
    if run_id != safe_run_id(run_id):
        raise PipelineError(f"run id {run_id!r} is not a folder name: make it one with safe_run_id where it comes in")
    return lake.join(runs_folder(config.lake), run_id)


def safe_run_id(run_id: str) -> str:
    """The run id as a folder name: Airflow run ids hold ':' and '+', which are awkward in paths and
    S3 keys, and a leading '.' would make a hidden folder, or with '..' the lake itself. Applied once,
    where a run id comes in (the DAG's form_config, the stage runner's --run-id); what follows, the
    run folder, the EMR code's folder and the cluster's name and tags, takes the result as it is.
    A run id that had to change gets the start of its SHA-256 appended, so that two that differ only
    where they changed (`a:b` and `a+b`, or `a_b` itself) never share a run folder."""
    if not run_id:
        raise PipelineError("a run id must not be empty")
    safe = "".join(char if char.isalnum() or char in "-_." else "_" for char in run_id)
    safe = "_" + safe[1:] if safe.startswith(".") else safe
    if safe == run_id:
        return safe
    return f"{safe}-{hashlib.sha256(run_id.encode()).hexdigest()[:RUN_ID_HASH_CHARS]}"


def read_config(run: str, read: ReadFile | None = None) -> PipelineConfig:
    """The run's resolved config, its config.json, validated: what every stage and task of the run
    works with. Read from the lake, or with `read`."""
    return validate(read_config_data(run, read))


def read_config_data(run: str, read: ReadFile | None = None) -> dict:
    """The run's config.json as written, not validated: for comparing settings with it or applying
    overrides to it, and for run folders of other versions, whose settings may not validate now."""
    uri = lake.join(run, CONFIG_FILE)
    if read is None and not lake.exists(uri):
        raise PipelineError(f"run folder {run} has no {CONFIG_FILE}: create the run first")
    text = read(CONFIG_FILE) if read else lake.read_bytes(uri)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"resolved config {uri} is not valid JSON: {error}") from None


def create_run(config: PipelineConfig, run_id: str) -> str:
    """Make a run folder holding the resolved config, or update an existing one's: the stages
    whose outputs changed settings make stale are no longer complete, and its report goes. Returns its URI."""
    from pipeline import stages  # here, not at the top: the stage table imports this module's paths

    folder = run_dir(config, run_id)
    config_uri = lake.join(folder, CONFIG_FILE)
    if lake.exists(config_uri):
        for report in REPORTS:  # run again, it is no longer a collected run (prune_runs)
            lake.delete(lake.join(folder, report))
        changed = stages.changed_settings(read_config_data(folder), json.loads(config.to_json()))
        cleared = [name for stage in stages.stale_stages(list(changed)) for name in clear_stage(folder, stage)]
        if cleared:
            settings = ", ".join(f"{path}: {old!r} -> {new!r}" for path, (old, new) in changed.items())
            print(
                f"NOTE run folder {folder}: changed {settings}; stage(s) {', '.join(cleared)} no longer complete",
                file=sys.stderr,
                flush=True,
            )
    try:
        lake.write_text(config_uri, config.to_json())
    except OSError as error:  # a lake in a read-only place, under a file, ...
        raise PipelineError(f"lake {config.lake}: cannot create the run folder {folder}: {error}") from None
    return folder


def stats_path(stage: str) -> str:
    """Where, in the run folder, a stage's stats go: its completion marker."""
    return f"{STATS_FOLDER}/{stage}.json"


def stats_uri(run: str, stage: str) -> str:
    return lake.join(run, stats_path(stage))


def smoke_probe_path(worker: int) -> str:
    """Where, in the run folder, the cluster check's task `worker` writes its probe object."""
    return f"{SMOKE_PROBE_FOLDER}/node-{worker}"


def spark_event_log_path(stage: str) -> str:
    """Where, in the run folder, a stage's Spark event log goes (spark_jobs.spark.spark_metrics)."""
    return f"{SPARK_EVENTS_FOLDER}/{stage}"


def error_path(stage: str) -> str:
    """Where, in the run folder, a stage that stopped on an error leaves it (see stage.record_error)."""
    return f"{ERRORS_FOLDER}/{stage}.json"


def recorded_error(run: str, stage: str) -> str | None:
    """The error a stage that stopped left in the run folder (error_path), if it left one."""
    uri = lake.join(run, error_path(stage))
    try:
        return str(lake.read_json(uri)["error"]) if lake.exists(uri) else None
    except (OSError, ValueError, KeyError, TypeError):  # half written or not ours: the exit code still says it failed
        return None


def progress_path(stage: str) -> str:
    """Where, in the run folder, a running stage reports how far it is (train does; the EMR target's
    task logs it while the step runs)."""
    return f"{PROGRESS_FOLDER}/{stage}.json"


def clear_stage(run: str, stage: str) -> list[str]:
    """Mark a stage and the stages that read its outputs as not complete, and remove the run's
    report, which no longer describes it; returns the stages that were complete."""
    from pipeline import stages  # here, not at the top: the stage table imports this module's paths

    cleared = [name for name in (stage, *stages.downstream(stage)) if lake.exists(stats_uri(run, name))]
    for name in cleared:
        lake.delete(stats_uri(run, name))
    for report in REPORTS:
        lake.delete(lake.join(run, report))
    return cleared


def complete_stage(run: str, stage: str, stats: dict) -> None:
    lake.write_json(stats_uri(run, stage), stats)


def require_inputs(run: str, stage: str) -> dict[str, dict]:
    """The stats of every stage whose outputs `stage` reads, by name, or StageIncomplete naming
    the first that has not completed."""
    from pipeline import stages  # here, not at the top: the stage table imports this module's paths

    return {name: require_stage(run, name) for name in stages.by_name(stage).inputs}


def require_stage(run: str, stage: str) -> dict:
    """The stats of a completed stage, or StageIncomplete naming what to run first."""
    uri = stats_uri(run, stage)
    if not lake.exists(uri):
        raise StageIncomplete(f"stage {stage!r} has not completed in run folder {run} ({uri} is missing): run it first")
    return lake.read_json(uri)
