"""The formats a run's model is stored in, where each lies in its record and the command that loads it:
what the report lists and the latest pointer names. A run trained before the Hugging Face and
SavedModel formats were written has the Keras one alone."""

from __future__ import annotations

from pipeline import run_folder

# name: (the folder in the run folder, a file only that format's folder holds, what loads it ({uri}: its folder)).
FORMATS = {
    "keras": (
        run_folder.MODEL_FOLDER,
        run_folder.MODEL_FILE,
        "python -m spark_jobs.generate --model-dir {uri}  # in this project's checkout",
    ),
    "huggingface": (
        run_folder.MODEL_HF_PATH,
        "config.json",
        'aws s3 cp --recursive {uri} gpt2 && python -c "from transformers import AutoModelForCausalLM, '
        "AutoTokenizer; model = AutoModelForCausalLM.from_pretrained('gpt2'); "
        "tokenizer = AutoTokenizer.from_pretrained('gpt2')\"",
    ),
    "saved_model": (
        run_folder.MODEL_SAVED_MODEL_PATH,
        "saved_model.pb",
        'aws s3 cp --recursive {uri} saved_model && python -c "import tensorflow as tf; '
        "logits = tf.saved_model.load('saved_model').serve(tf.constant([[0, 1, 2]]))\"",
    ),
}


def model_formats(has, record_uri: str) -> dict[str, dict]:
    """The formats the run has ({name: {"uri", "load"}}), by `has(path in the run folder)`, their
    URIs in the record at record_uri (ending in '/')."""
    formats = {}
    for name, (folder, marker, load) in FORMATS.items():
        if has(f"{folder}/{marker}"):
            uri = f"{record_uri.rstrip('/')}/{folder}/"
            formats[name] = {"uri": uri, "load": load.format(uri=uri)}
    return formats


def model_formats_text(formats: dict[str, dict]) -> str:
    """The report.md section: each format's URI and the command that loads it."""
    if not formats:
        return ""
    lines = "".join(f"- {name}: {entry['uri']}\n  `{entry['load']}`\n" for name, entry in formats.items())
    return f"## Model files\n\n{lines}\n"
