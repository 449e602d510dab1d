"""Who may change what: the deployment's settings, which only its config file sets, and the check
that a run (its trigger form, an API call, `--set` on a deployed DAG) changes none of them and reads
its corpus from within the deployment's corpus_roots.

The schema marks each deployment setting once (pipeline/config.py, DEPLOYMENT); a marked section
is the deployment's as a whole. Every other setting is a run's.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from pipeline.config import DEPLOYMENT, WHO, ConfigError, PipelineConfig, is_glob
from pipeline.errors import cut, name_some, shown
from pipeline.overrides import config_names, parse_override, setting
from pipeline.stages import changed_settings, flatten


def deployment_sections(section: type[BaseModel] = PipelineConfig, prefix: str = "") -> list[str]:
    """The dotted names of the fields marked DEPLOYMENT: ["target", "corpus_roots", "lake", ..., "emr"]."""
    names = []
    for name, field in section.model_fields.items():
        extra = field.json_schema_extra
        if isinstance(extra, dict) and extra.get(WHO) == DEPLOYMENT[WHO]:
            names.append(f"{prefix}{name}")
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            names += deployment_sections(field.annotation, f"{prefix}{name}.")
    return names


def is_deployment_setting(name: str) -> bool:
    """Whether a dotted setting name ("emr.region", "s3", "train.max_steps") is the deployment's."""
    return any(name == marked or name.startswith(f"{marked}.") for marked in deployment_sections())


def deployment_settings() -> list[str]:
    """Every deployment setting and section by its dotted name."""
    return [name for name in config_names() if is_deployment_setting(name)]


def refused(name: str, deployed_value: Any, run_value: Any, config_file: str) -> ConfigError:
    return ConfigError(
        f"{name}: a deployment setting, which a run cannot change: this DAG's {name} is {shown(deployed_value)}, "
        f"read from {config_file} (got {shown(run_value)}); edit {config_file} to change it"
    )


def check_overrides(overrides: list[str | dict], deployed: dict, config_file: str) -> None:
    """Refuse a run's overrides that give a deployment setting another value than the deployment's
    file (`deployed`, as read) holds: before validation, whose complaints about such a value (an
    s3:// lake for target local) would miss the point."""
    for override in overrides:
        for name, value in named_settings(override).items():
            if is_deployment_setting(name) and value != setting(deployed, name):
                raise refused(name, setting(deployed, name), value, config_file)


def named_settings(override: str | dict) -> dict[str, Any]:
    """{dotted name: value} of the settings an override gives."""
    if isinstance(override, dict):
        return flatten(override)
    path, value = parse_override(override)
    return {".".join(path): value}


def check_run_settings(deployed: PipelineConfig, run: PipelineConfig, config_file: str) -> None:
    """Refuse a run whose validated settings differ from the deployment's in a deployment setting,
    or whose corpus is not the deployment's and lies outside its corpus_roots."""
    changed = changed_settings(deployed.model_dump(mode="json"), run.model_dump(mode="json"))
    for name, (deployed_value, run_value) in changed.items():
        if is_deployment_setting(name):
            raise refused(name, deployed_value, run_value, config_file)
    check_corpus_roots([uri for uri in run.corpus if uri not in deployed.corpus], deployed.corpus_roots)


def check_corpus_roots(corpus: Iterable[str], roots: list[str]) -> None:
    """Each corpus entry (path, glob or URI) must lie within one of the roots once resolved: `~`,
    `..` and symlinks of its leading part, before any glob; a glob holding `..` is refused."""
    for uri in corpus:
        resolved = resolved_corpus(uri)
        if not any(within(resolved, resolved_corpus(root)) for root in roots):
            raise ConfigError(
                f"corpus: {cut(uri)} (resolved: {cut(resolved)}) is outside the folders and prefixes this deployment "
                f"lets a run read, corpus_roots: {name_some(roots)}"
            )


def check_corpus_files(files: Iterable[str], roots: list[str]) -> None:
    """The local files a run's corpus lists, each resolved (a link in a folder of a root may lead out of it)."""
    check_corpus_roots([uri for uri in files if uri.startswith("file://")], roots)


def resolved_corpus(uri: str) -> str:
    """A corpus URI as the check compares it: a local one's leading, glob-free folders resolved."""
    if not uri.startswith("file://"):
        return uri
    parts = uri.removeprefix("file://").split("/")
    globbed = next((i for i, part in enumerate(parts) if is_glob(part)), len(parts))
    if ".." in parts[globbed:]:
        raise ConfigError(f"corpus: {cut(uri)}: a glob may not hold '..'")
    leading = os.path.realpath("/".join(parts[:globbed]) or "/")
    return "file://" + posixpath.join(leading, *parts[globbed:])


def within(uri: str, root: str) -> bool:
    """Whether uri is root or below it, on a '/' boundary (s3://bucket/corpus is not within s3://bucket/corp)."""
    root = root if root.endswith("/") else root + "/"
    return uri == root.rstrip("/") or uri.startswith(root)
