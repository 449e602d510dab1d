"""On this machine the person running `make run` or `make rehearse` is the deployer: the
deployment settings of their SET, and their CORPUS, go into a copy of the defaults file that the DAG
reads as its deployment's (GPT_PIPELINE_CONFIG), and only the run settings into the run's form."""

from __future__ import annotations

from pathlib import Path

import yaml

from pipeline.deployment import is_deployment_setting, named_settings
from pipeline.overrides import apply_overrides


def is_the_deployers(override: str) -> bool:
    """Whether an override goes into the deployment's file: a deployment setting, or the corpus
    (the deployment's own corpus may lie outside its corpus_roots)."""
    return any(is_deployment_setting(name) or name == "corpus" for name in named_settings(override))


def split(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(the deployer's overrides, the run's), each in the order given."""
    return [item for item in overrides if is_the_deployers(item)], [
        item for item in overrides if not is_the_deployers(item)
    ]


def write(path: Path, defaults: dict, corpus: str | None, overrides: list[str]) -> Path:
    """The defaults with the corpus, then the deployer's overrides applied (a corpus= override wins
    over --corpus), written to path for GPT_PIPELINE_CONFIG."""
    data = apply_overrides(defaults, ([{"corpus": corpus}] if corpus else []) + overrides)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path
