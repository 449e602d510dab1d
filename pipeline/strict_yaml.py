"""YAML as the configuration reads it, in pipeline.yaml and in a `section.key=value` setting's
value: safe YAML that refuses a key given twice in one mapping."""

from __future__ import annotations

from typing import Any

import yaml


class _StrictLoader(yaml.SafeLoader):
    """Safe YAML that refuses a key given twice in one mapping. PyYAML keeps the last one silently,
    so a second `train:` section at the end of the file would replace the first one whole."""

    def construct_mapping(self, node, deep=False):
        self.flatten_mapping(node)
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)):
                continue  # an unhashable key: the base class names it
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} is given twice in the same section", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def parse_yaml(text_or_file) -> Any:
    return yaml.load(text_or_file, Loader=_StrictLoader)
