"""The DAG's trigger form: the knobs people change per run, as Airflow Params. It offers run
settings only: the deployment's (pipeline/deployment.py) come from its config file alone, and
validate_config refuses an `overrides` line that changes one.

Each Param stands for one field of the config model; its default is the value in
include/config/pipeline.yaml. The form only checks types: the values are validated by the config
model in the DAG's first task, so one set of rules applies to the run command, the form and the
YAML. Anything without its own field goes into `overrides` as `section.key=value` lines.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param
from pydantic import TypeAdapter

from pipeline.config import ConfigError
from pipeline.errors import cut, name_some
from pipeline.overrides import field_annotation, setting

# Param name -> (config field, description)
FIELDS: dict[str, tuple[str, str]] = {
    "corpus": ("corpus", "Corpus: UTF-8 text files: a file, a folder, a glob (books/**/*.txt) or a URI"),
    "run_name": ("run_name", "Names the run folder: runs/{run_name}-{Airflow run id}; empty: the corpus's name"),
    "vocab_size": ("tokenizer.vocab_size", "Byte-level BPE vocabulary size"),
    "block_size": ("data.block_size", "T: tokens the model sees at once"),
    "stride": ("data.stride", "Step between window starts, at most block_size"),
    "pack_documents": (
        "data.pack_documents",
        "Windows across files, each followed by <|endoftext|>: for documents shorter than a window",
    ),
    "embedding_dim": ("embedding.dim", "Width of the token and position embeddings (the model's width)"),
    "n_layer": ("model.n_layer", "Transformer blocks"),
    "n_head": ("model.n_head", "Attention heads per block; must divide embedding_dim"),
    "num_workers": ("train.num_workers", "TensorFlow workers (one per EMR core node)"),
    "batch_size": ("train.batch_size", "Global batch, split across the workers"),
    "max_steps": ("train.max_steps", "Training budget in optimizer steps"),
    "eval_interval": ("train.eval_interval", "Steps between validation passes"),
    "learning_rate": ("train.learning_rate", "Peak learning rate"),
    "prompt": ("generate.prompt", "Prompt for the generated sample; empty: a new document"),
    "max_new_tokens": ("generate.max_new_tokens", "Tokens to generate after the prompt"),
}
OVERRIDES = "overrides"
# Text fields that may be empty: the form sends an emptied field as null.
EMPTY_AS_NULL = {"prompt", "run_name"}

# JSON Schema types of a config field's type; a number may be written without a decimal point.
_JSON_TYPES = {bool: "boolean", int: "integer", float: ["number", "integer"], str: "string"}


def params(defaults: dict) -> dict[str, Param]:
    """The form, with defaults taken from the raw (unvalidated) YAML data and each Param's type from
    its config field's (YAML reads `learning_rate: 3e-4` as text, which the config model takes as a
    number, and so must the form)."""
    form = {}
    for name, (field, description) in FIELDS.items():
        default = setting(defaults, field)
        if name == "corpus":  # one path or a list of them
            kind: str | list[str] = ["string", "array"]
        elif name in EMPTY_AS_NULL:
            kind = ["string", "null"]
        else:
            annotation = field_annotation(field.split("."))
            kind, default = _JSON_TYPES[annotation], TypeAdapter(annotation).validate_python(default)
        form[name] = Param(default, type=kind, title=field, description=description)
    form[OVERRIDES] = Param(
        [],
        type="array",
        items={"type": "string"},
        title="other settings",
        description="One `section.key=value` per line for any other run setting of pipeline.yaml, e.g. "
        "data.shards=8 (not where runs go, the cluster or the schedule: those are the deployment's)",
    )
    return form


def overrides(values: dict) -> list[str | dict]:
    """Turn submitted form values into config overrides (dicts, so values are not re-parsed)."""
    unknown = sorted(set(values) - set(FIELDS) - {OVERRIDES})
    if unknown:
        names = name_some([cut(name) for name in unknown])
        raise ConfigError(f"unknown trigger parameter(s) {names}; use overrides for other settings")
    result: list[str | dict] = []
    for name, (field, _) in FIELDS.items():
        if name in values:
            value = values[name]
            result.append(_nested(field, "" if value is None and name in EMPTY_AS_NULL else value))
    result.extend(values.get(OVERRIDES) or [])
    return result


def _nested(field: str, value: Any) -> dict:
    *sections, key = field.split(".")
    node: dict = {key: value}
    for section in reversed(sections):
        node = {section: node}
    return node
