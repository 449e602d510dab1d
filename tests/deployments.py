"""A deployment's config file for a test: pipeline.yaml with the deployment settings a test needs
(a lake in its temporary folder, target emr, a schedule, corpus_roots, ...), which the DAG reads
as its own when GPT_PIPELINE_CONFIG names it. A run's form or overrides cannot change them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from pipeline.config_files import DEFAULT_CONFIG_PATH, read_yaml
from pipeline.overrides import apply_overrides


def write_deployment(path: Path, changes: dict, base: Path = DEFAULT_CONFIG_PATH) -> Path:
    """base (pipeline.yaml) with changes applied, written to path."""
    path.write_text(yaml.safe_dump(apply_overrides(read_yaml(base), changes), sort_keys=False))
    return path


def amend_deployment(path: Path, changes: dict) -> Path:
    """A deployment file with more changes."""
    return write_deployment(path, changes, base=path)


def deploy(monkeypatch: pytest.MonkeyPatch, path: Path, changes: dict) -> Path:
    """The deployment file, named by GPT_PIPELINE_CONFIG for the rest of the test."""
    monkeypatch.setenv("GPT_PIPELINE_CONFIG", str(write_deployment(path, changes)))
    return path


def deployment_env(path: Path, changes: dict, env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """env with GPT_PIPELINE_CONFIG naming the deployment file, for a process a test starts."""
    return {**env, "GPT_PIPELINE_CONFIG": str(write_deployment(path, changes))}
