"""The table of the pipeline's stages: each stage's name, its spark-submit application file, the
stages whose outputs it reads, and the settings that shape its outputs; and what depends on what.

Re-running a stage, or changing a setting of an existing run, makes the stages after it stale;
their completion markers are removed so that nothing stale counts as done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Stage:
    """One stage: `app_file` in spark_jobs/; `inputs`, the stages whose outputs it reads;
    `settings`, config paths (a section stands for all its keys) whose value its outputs depend
    on, besides its inputs. The rest (run_name, target, lake, s3, schedule, local, emr) changes where and
    how a run goes, not what it makes."""

    name: str
    app_file: str
    inputs: tuple[str, ...]
    settings: tuple[str, ...]


# In pipeline order: a stage's inputs come before it.
STAGES: tuple[Stage, ...] = (
    Stage(
        "tokenize",
        "tokenize_corpus.py",
        inputs=(),
        settings=("corpus", "tokenizer", "data.val_fraction", "data.val_split", "data.bad_files"),
    ),
    Stage(
        "window",
        "window.py",
        inputs=("tokenize",),
        settings=("data.block_size", "data.stride", "data.pack_documents"),
    ),
    Stage("positional_embed", "positional_embed.py", inputs=("tokenize", "window"), settings=("embedding",)),
    Stage("export", "export_tfrecord.py", inputs=("tokenize", "window"), settings=("data.shards",)),
    Stage("train", "train.py", inputs=("tokenize", "positional_embed", "export"), settings=("model", "train")),
    Stage("generate", "generate.py", inputs=("train",), settings=("generate",)),
)
STAGE_NAMES: tuple[str, ...] = tuple(stage.name for stage in STAGES)
# The Spark stages before training, which make its data.
PREPROCESSING_STAGES: tuple[str, ...] = STAGE_NAMES[: STAGE_NAMES.index("train")]
_BY_NAME = {stage.name: stage for stage in STAGES}


def by_name(name: str) -> Stage:
    """The stage of that name, or a ValueError naming the stages there are."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown stage {name!r}; stages are {', '.join(STAGE_NAMES)}") from None


def downstream(stage: str) -> list[str]:
    """The stages that read `stage`'s outputs, directly or through others, in pipeline order."""
    found = {stage}
    for other in STAGES:  # in pipeline order: inputs come first
        if found.intersection(other.inputs):
            found.add(other.name)
    return [name for name in STAGE_NAMES if name in found and name != stage]


def flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        flat |= flatten(value, f"{path}.") if isinstance(value, dict) else {path: value}
    return flat


def changed_settings(old: dict, new: dict) -> dict[str, tuple[Any, Any]]:
    """{setting: (old value, new value)} for every setting whose value differs."""
    before, after = flatten(old), flatten(new)
    return {
        path: (before.get(path), after.get(path))
        for path in sorted(before | after)
        if before.get(path) != after.get(path)
    }


def stale_stages(changed: list[str]) -> list[str]:
    """The stages whose outputs the changed settings make stale, with those after them."""
    stale = set()
    for stage in STAGES:
        if any(path == setting or path.startswith(f"{setting}.") for path in changed for setting in stage.settings):
            stale |= {stage.name, *downstream(stage.name)}
    return [name for name in STAGE_NAMES if name in stale]
