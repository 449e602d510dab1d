"""Overrides on the configuration: `section.key=value` settings (a command's repeatable `--set`,
make's SET, the trigger form's overrides lines) and nested dicts, merged into the data read from
pipeline.yaml before it is validated; and the settings' dotted names.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import types
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from pipeline.config import ConfigError, PipelineConfig
from pipeline.errors import cut, shown
from pipeline.strict_yaml import Refused, parse_yaml


def apply_overrides(data: dict, overrides: list[str | dict] | dict | None) -> dict:
    """Merge overrides into raw config data: `section.key=value` strings and/or nested dicts.
    Unknown keys are left for validation to reject."""
    if not overrides:
        return data
    if isinstance(overrides, dict):
        return _deep_merge(data, overrides)
    for text in overrides:
        if isinstance(text, dict):
            data = _deep_merge(data, text)
            continue
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {shown(text)}: {cut(part)} is not a section")
            node = child
        node[path[-1]] = value
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """'train.max_steps=200' -> (['train', 'max_steps'], 200). Values are parsed as YAML; what YAML
    cannot parse (e.g. schedule=@weekly) stays a string, and so does an unquoted value with a '#'
    in it (lake=/data/lake #2), which YAML would cut at the '#' as a comment. A text setting takes
    the text as typed whatever YAML makes of it: generate.prompt=yes is 'yes', not True, and
    generate.prompt=ROMEO: Hark is not a mapping. YAML's anchors and aliases are refused (a text
    setting takes them as typed)."""
    key, sep, raw = text.partition("=")
    path, raw = key.strip().split("."), raw.strip()
    if not sep or not key.strip():
        raise ConfigError(
            f"override {shown(text)} is not of the form section.key=value (quote a value that holds spaces)"
        )
    if "#" in raw and raw[:1] not in ("'", '"'):
        return path, raw
    try:
        value = parse_yaml(raw) if raw else ""
    except Refused as refused:
        if _takes_text(path):
            return path, raw
        raise ConfigError(f"invalid configuration: {cut(key.strip())}: {refused.problem}") from None
    except yaml.YAMLError:
        return path, raw
    if value is not None and not isinstance(value, str) and _takes_text(path):
        return path, raw
    return path, value


def _takes_text(path: list[str]) -> bool:
    """Whether the setting at path takes text (str, or str or None): a value for it is never read
    as a number, a boolean or a collection."""
    annotation = field_annotation(path)
    if get_origin(annotation) in (Union, types.UnionType):
        return str in get_args(annotation)
    return annotation is str


def _deep_merge(base: dict, extra: dict) -> dict:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def add_set_argument(parser: argparse.ArgumentParser, help_prefix: str = "") -> None:
    """A command line's --set: one section.key=value setting per --set, repeated for more."""
    parser.add_argument(  # one value per --set: a list would swallow the arguments after it
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help=f"{help_prefix}one config setting, e.g. --set train.max_steps=500 or --set 'generate.prompt=To be'; "
        "repeat --set for each setting (the value is read as YAML; a text setting takes it as typed)",
    )


def setting(data: dict, name: str) -> Any:
    """The value of a dotted setting name in a config's data (None where there is none):
    setting(data, "emr.region")."""
    return functools.reduce(
        lambda section, key: section.get(key) if isinstance(section, dict) else None, name.split("."), data
    )


def field_info(path: list[str]) -> FieldInfo | None:
    """The schema's field of the setting at path (["train", "learning_rate"]): its type and
    constraints; None for no such setting."""
    section: type[BaseModel] = PipelineConfig
    for part in path[:-1]:
        field = section.model_fields.get(part)
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return None
        section = field.annotation
    return section.model_fields.get(path[-1])


def field_annotation(path: list[str]) -> Any:
    """The type of the setting at path (["train", "learning_rate"] -> float), None for no such setting."""
    field = field_info(path)
    return None if field is None else field.annotation


def config_names(section: type[BaseModel] = PipelineConfig, prefix: str = "") -> list[str]:
    """The dotted name of every section and setting: ["run_name", ..., "train", "train.learning_rate", ...]."""
    names = []
    for name, field in section.model_fields.items():
        names.append(f"{prefix}{name}")
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            names += config_names(field.annotation, f"{prefix}{name}.")
    return names


def closest_settings(unknown: str) -> list[str]:
    """Settings an unknown name may have meant: the same key in another section (train.stride ->
    data.stride), else a name spelled alike (train.max_step -> train.max_steps)."""
    names = config_names()
    key = unknown.rsplit(".", 1)[-1]
    return [name for name in names if name.rsplit(".", 1)[-1] == key] or difflib.get_close_matches(unknown, names, n=1)
