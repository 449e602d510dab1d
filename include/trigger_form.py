"""The DAG's trigger form: the knobs people change per run, as Airflow Params. It offers run
settings only: the deployment's (pipeline/deployment.py) come from its config file alone, and
validate_config refuses an `overrides` line that changes one.

Each Param stands for one field of the config model; its default is the value in
include/config/pipeline.yaml. The form checks what the schema says of the field alone, as Airflow
checks a Param: its type, its range (ge/gt/le/lt) and its choices (a Literal, a drop-down), read
from the schema; and it groups the fields in sections. That is a convenience: the config model
validates the values in the DAG's first task, rules between fields included (stride at most
block_size), so one set of rules applies to the run command, the form and the YAML. Anything
without its own field goes into `overrides` as `section.key=value` lines.
"""

from __future__ import annotations

from typing import Any, Literal, get_args, get_origin

from airflow.sdk import Param
from annotated_types import Ge, Gt, Le, Lt
from pydantic import TypeAdapter
from pydantic.fields import FieldInfo

from pipeline.config import ConfigError
from pipeline.errors import cut, name_some
from pipeline.overrides import field_info, setting

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
    "val_split": (
        "data.val_split",
        "Validation text: whole files, the tail of every file, or auto (files when there are many small ones)",
    ),
    "bad_files": ("data.bad_files", "What a non-UTF-8 or binary corpus file gets: fail the run, or skip the file"),
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
    "strategy": ("generate.strategy", "Each token: the most likely (greedy), or drawn among the top_k or top_p"),
    "temperature": ("generate.temperature", "Above 0; lower draws more predictably (top_k and top_p)"),
    "top_k": ("generate.top_k", "Strategy top_k: draws among this many most likely tokens"),
    "top_p": ("generate.top_p", "Strategy top_p: draws among the most likely tokens making up this probability"),
}
OVERRIDES = "overrides"
# Text fields that may be empty: the form sends an emptied field as null.
EMPTY_AS_NULL = {"prompt", "run_name"}

# The form's section of each config section ("": the fields outside one, corpus and run_name).
SECTIONS = {
    "": "data",
    "tokenizer": "data",
    "data": "data",
    "embedding": "model",
    "model": "model",
    "train": "training",
    "generate": "generation",
}
OTHER_SECTION = "other"

# JSON Schema types of a config field's type; a number may be written without a decimal point (JSON
# Schema's number takes integers). Not ["number", "integer"]: Airflow 3.3 shows a field of two types
# as a text box that turns a decimal being typed, 0.0 of 0.004, into 0.
_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}
# Each bound a schema field may have (Field(ge=1) holds Ge(ge=1)): its attribute, its JSON Schema keyword.
_BOUNDS = {Ge: ("ge", "minimum"), Gt: ("gt", "exclusiveMinimum"), Le: ("le", "maximum"), Lt: ("lt", "exclusiveMaximum")}


def params(defaults: dict) -> dict[str, Param]:
    """The form, with defaults taken from the raw (unvalidated) YAML data and each Param's type from
    its config field's (YAML reads `learning_rate: 3e-4` as text, which the config model takes as a
    number, and so must the form)."""
    form = {}
    for name, (field, description) in FIELDS.items():
        info, default = field_info(field.split(".")), setting(defaults, field)
        if name == "corpus":  # one path or a list of them
            kind: str | list[str] = ["string", "array"]
        elif name in EMPTY_AS_NULL:
            kind = ["string", "null"]
        else:
            kind, default = _json_type(info.annotation), TypeAdapter(info.annotation).validate_python(default)
        checks = {**bounds(info), **choices(info)}
        form[name] = Param(default, type=kind, title=field, description=description, section=section(field), **checks)
    form[OVERRIDES] = Param(
        [],
        type="array",
        items={"type": "string"},
        title="other settings",
        section=OTHER_SECTION,
        description="One `section.key=value` per line for any other run setting of pipeline.yaml, e.g. "
        "data.shards=8 (not where runs go, the cluster or the schedule: those are the deployment's)",
    )
    return form


def section(field: str) -> str:
    """The form's section of a config field: "train.max_steps" -> "training"."""
    return SECTIONS[field.rpartition(".")[0]]


def bounds(info: FieldInfo) -> dict[str, Any]:
    """A config field's range as JSON Schema, from its schema's constraints: {"minimum": 1}."""
    return {
        keyword: getattr(constraint, attribute)
        for constraint in info.metadata
        for kind, (attribute, keyword) in _BOUNDS.items()
        if isinstance(constraint, kind)
    }


def choices(info: FieldInfo) -> dict[str, list]:
    """A Literal config field's values as a JSON Schema enum (a drop-down in the form), else {}."""
    return {"enum": list(get_args(info.annotation))} if get_origin(info.annotation) is Literal else {}


def _json_type(annotation: Any) -> str | list[str]:
    if get_origin(annotation) is Literal:  # its values' type
        annotation = type(get_args(annotation)[0])
    return _JSON_TYPES[annotation]


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
