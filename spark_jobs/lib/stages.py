"""What depends on what in a run folder: the stages each stage reads, and the settings that shape
each stage's outputs. Re-running a stage, or changing a setting of an existing run, makes the
stages after it stale; their completion markers are removed so that nothing stale counts as done.
"""

from __future__ import annotations

from typing import Any

INPUTS = {
    "tokenize": (),
    "window": ("tokenize",),
    "positional_embed": ("tokenize", "window"),
    "export": ("tokenize", "window"),
    "train": ("tokenize", "positional_embed", "export"),
    "generate": ("train",),
}
# Config paths (a section stands for all its keys) whose value a stage's outputs depend on, besides
# its inputs. The rest (run_name, target, lake, s3, schedule, local, emr) changes where and how a run
# goes, not what it makes.
SETTINGS = {
    "tokenize": ("corpus", "tokenizer", "data.val_fraction", "data.val_split", "data.bad_files"),
    "window": ("data.block_size", "data.stride", "data.pack_documents"),
    "positional_embed": ("embedding",),
    "export": ("data.shards",),
    "train": ("model", "train"),
    "generate": ("generate",),
}


def downstream(stage: str) -> list[str]:
    """The stages that read `stage`'s outputs, directly or through others, in pipeline order."""
    found = {stage}
    for other, inputs in INPUTS.items():  # INPUTS is in pipeline order: inputs come first
        if found.intersection(inputs):
            found.add(other)
    return [other for other in INPUTS if other in found and other != stage]


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
    for stage, settings in SETTINGS.items():
        if any(path == setting or path.startswith(f"{setting}.") for path in changed for setting in settings):
            stale |= {stage, *downstream(stage)}
    return [stage for stage in INPUTS if stage in stale]
