"""The configuration's files and entry points: the defaults file (include/config/pipeline.yaml, or
the one GPT_PIPELINE_CONFIG names), `load_config` (read it, apply overrides, validate) and `validate`
for data (a run's resolved config.json is pipeline.run_folder.read_config's). A problem raises
ConfigError naming the field or the file.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import ValidationError

from pipeline.config import REPO_ROOT, ConfigError, PipelineConfig
from pipeline.errors import SHOWN_CHARS, cut, name_some, shown
from pipeline.overrides import apply_overrides, closest_settings
from pipeline.strict_yaml import parse_yaml

DEFAULT_CONFIG_PATH = REPO_ROOT / "include" / "config" / "pipeline.yaml"
PROBLEMS_SHOWN = 5  # a list of ten thousand wrong items is named by its first few
LONGEST_CHECK_MESSAGE = 4 * SHOWN_CHARS  # the checks' own messages, whatever values they repeat


def defaults_path() -> Path:
    """The defaults file: GPT_PIPELINE_CONFIG when set (e.g. a copy with target: emr), else pipeline.yaml."""
    return Path(os.environ.get("GPT_PIPELINE_CONFIG") or DEFAULT_CONFIG_PATH)


def validate(data: dict) -> PipelineConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"configuration must be a mapping, got {type(data).__name__}")
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_describe(error)) from None


def _describe(error: ValidationError) -> str:
    """The problems in one line: the first few, each naming its setting, with the value it got cut short."""
    lines = []
    for item in error.errors():
        field = cut(".".join(str(part) for part in item["loc"]))
        message = cut(item["msg"].removeprefix("Value error, "), LONGEST_CHECK_MESSAGE)
        if item["type"] == "extra_forbidden":
            message = "unknown key" + "".join(f" (did you mean {known}?)" for known in closest_settings(field)[:1])
        elif "input" in item and not isinstance(item["input"], dict):
            message += f" (got {shown(item['input'])})"
        # A check across fields (loc empty) names its fields itself.
        lines.append(f"{field}: {message}" if field else message)
    return "invalid configuration: " + name_some(lines, shown=PROBLEMS_SHOWN, separator="; ")


def read_yaml(path: Path | str) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        with path.open(encoding="utf-8") as file:  # so that an error names the file and line
            return parse_yaml(file) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ConfigError(f"config file {path} is not valid YAML: {error}") from None


def load_config(path: Path | str | None = None, overrides: list[str] | dict | None = None) -> PipelineConfig:
    """Read the YAML defaults, apply overrides, validate."""
    data = read_yaml(path or defaults_path())
    return validate(apply_overrides(data, overrides))
