"""Training-state backups in the run folder (for resuming) and the saved model, in its formats.

A backup is one .npz with the model's variables (its weights and its dropout layers' random
state) and the optimizer's, the step and the stats rows
so far, written whole by the chief. It only exists while a training is unfinished: the train
stage's driver removes it once the stage is complete (spark_jobs.spark.stage_app.run_stage), so a later
train stage starts over, while a failure before that (another worker, saving, the driver) resumes.
"""

from __future__ import annotations

import io
import json
import shutil
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from pipeline import lake, run_folder, stages
from pipeline.config import GenerateConfig


class Ignored(Exception):
    """A backup that training cannot resume: it starts from step 0, with a warning saying why."""


class OtherSettings(Ignored):
    """A backup was taken with other settings (or TFRecords): resuming it would not continue this training."""


class Unreadable(Ignored):
    """A backup cut short or damaged (a worker's disk filled, a copy stopped halfway)."""


# What reading a damaged backup raises: zipfile's errors, numpy's and json's (ValueError), a
# missing entry (KeyError), an .npz's truncated member (EOFError), reading from the lake (OSError).
READ_ERRORS = (zipfile.BadZipFile, OSError, EOFError, ValueError, KeyError)


def save_backup(run: str, step: int, model, optimizer, rows: list[dict], identity: dict) -> None:
    """`identity`: the fingerprint a training must have to resume the backup, and its settings."""
    arrays = {f"model_{i}": v.numpy() for i, v in enumerate(model.variables)}
    arrays |= {f"optimizer_{i}": v.numpy() for i, v in enumerate(optimizer.variables)}
    meta = {"step": step, "rows": rows, **identity}
    buffer = io.BytesIO()
    np.savez(buffer, meta=np.array(json.dumps(meta)), **arrays)
    lake.write_bytes(lake.join(run, run_folder.BACKUP_PATH), buffer.getvalue())


def resume(run: str, model, optimizer, identity: dict, warn) -> dict | None:
    """load_backup, with a backup it ignores passed to `warn`: None, training starts from step 0."""
    try:
        return load_backup(run, model, optimizer, identity)
    except Ignored as ignored:
        warn(str(ignored))
        return None


def load_backup(run: str, model, optimizer, identity: dict) -> dict | None:
    """Restore the last backup into the (built) model and optimizer; returns its meta
    {step, rows}, None when there is no backup, or raises Ignored (OtherSettings, Unreadable)
    naming why it cannot be resumed, with the model and optimizer as they were."""
    uri = lake.join(run, run_folder.BACKUP_PATH)
    if not lake.exists(uri):
        return None
    try:
        meta, saved = read_backup(uri)
    except READ_ERRORS as error:
        raise Unreadable(
            f"the training backup {uri} is unreadable ({type(error).__name__}: {error}); training starts from step 0"
        ) from None
    if meta["fingerprint"] != identity["fingerprint"]:
        raise OtherSettings(
            f"ignoring the training backup {uri} (step {meta['step']}): it was taken with "
            f"{differences(meta, identity['settings'])}; training starts from step 0"
        )
    variables = {
        f"{prefix}_{i}": variable
        for prefix, of in (("model", model), ("optimizer", optimizer))
        for i, variable in enumerate(of.variables)
    }
    if set(variables) != set(saved) or any(not fits(saved[name], variable) for name, variable in variables.items()):
        raise OtherSettings(
            f"ignoring the training backup {uri} (step {meta['step']}): it holds other variables "
            "than this model and optimizer; training starts from step 0"
        )
    for name, variable in variables.items():
        variable.assign(saved[name])
    return meta


def read_backup(uri: str) -> tuple[dict, dict[str, np.ndarray]]:
    """A backup's meta and its arrays by name, read whole before any variable is assigned."""
    archive = np.load(io.BytesIO(lake.read_bytes(uri)), allow_pickle=False)
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError("not an .npz archive")
    with archive:
        arrays = {name: archive[name] for name in archive.files}
    if "meta" not in arrays:
        raise ValueError("no meta entry")
    meta = json.loads(str(arrays.pop("meta")))
    if not (isinstance(meta, dict) and isinstance(meta.get("step"), int) and isinstance(meta.get("rows"), list)):
        raise ValueError("its meta holds no step and rows")
    if "fingerprint" not in meta or not isinstance(meta.get("settings", {}), dict):
        raise ValueError("its meta holds no fingerprint and settings")
    return meta, arrays


def fits(array: np.ndarray, variable) -> bool:
    """Whether a saved array can be assigned to a variable as it is."""
    return array.shape == tuple(variable.shape) and array.dtype == np.dtype(variable.dtype)


def differences(meta: dict, settings: dict) -> str:
    changed = stages.changed_settings(meta["settings"], settings) if "settings" in meta else {}
    if not changed:
        return "other settings or TFRecords"
    return "other settings: " + ", ".join(f"{path} {old!r} -> {new!r}" for path, (old, new) in changed.items())


def save_model(run: str, model, tokenizer_json: bytes, generate: GenerateConfig, is_chief: bool) -> None:
    """Every worker saves (saving may involve collective ops under a multi-worker strategy);
    only the chief's copy goes to model/, with the other formats, and the others' temporary copies
    are removed."""
    local = Path(tempfile.mkdtemp(prefix="gpt-pipeline-model-"))
    try:
        model.save(local / run_folder.MODEL_FILE)
        (local / run_folder.MODEL_TOKENIZER_FILE).write_bytes(tokenizer_json)
        if is_chief:
            write_exports(local, tokenizer_json.decode(), generate)
            lake.delete(lake.join(run, run_folder.MODEL_FOLDER))
            lake.upload_dir(local, lake.join(run, run_folder.MODEL_FOLDER))
    finally:
        shutil.rmtree(local, ignore_errors=True)


def write_exports(model_folder: Path, tokenizer_json: str, generate: GenerateConfig) -> None:
    """The saved model as a Hugging Face GPT-2 folder and a TensorFlow SavedModel beside it, made
    from the model.keras just saved: loaded again, its variables are plain ones, not the
    distribution strategy's, whatever the training ran under."""
    import keras

    from spark_jobs.model.export_hf import write_hf_folder
    from spark_jobs.model.export_saved_model import write_saved_model

    saved = keras.saving.load_model(model_folder / run_folder.MODEL_FILE)
    write_hf_folder(saved, tokenizer_json, generate, model_folder / run_folder.MODEL_HF_FOLDER)
    write_saved_model(saved, model_folder / run_folder.MODEL_SAVED_MODEL_FOLDER)
