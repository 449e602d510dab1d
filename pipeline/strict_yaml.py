"""YAML as the configuration reads it, in pipeline.yaml and in a `section.key=value` setting's
value: safe YAML that refuses a key given twice in one mapping, anchors and aliases, and nesting
deeper than any setting goes."""

from __future__ import annotations

from typing import Any

import yaml

# The deepest setting is three levels down (embedding.word2vec.window); a value may be a list or
# mapping a few more. Far deeper nesting is a mistake, and Python's recursion would fail on it.
MAX_DEPTH = 32


class Refused(yaml.composer.ComposerError):
    """YAML the configuration never needs and refuses: an anchor or alias (&a, *a), or nesting
    deeper than MAX_DEPTH levels. Aliases let a few hundred characters stand for billions of
    values (the "billion laughs"), which a worker would run out of memory building or printing."""


class _StrictLoader(yaml.SafeLoader):
    """Safe YAML that refuses a key given twice in one mapping. PyYAML keeps the last one silently,
    so a second `train:` section at the end of the file would replace the first one whole. It
    refuses anchors, aliases and deep nesting too (Refused), and an integer too long for Python to
    read as a YAML error (ValueError otherwise)."""

    depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise Refused(None, None, "anchors and aliases (&name, *name) are not supported", event.start_mark)
        if self.depth >= MAX_DEPTH:
            raise Refused(None, None, f"nested more than {MAX_DEPTH} levels deep", event.start_mark)
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

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

    def construct_yaml_int(self, node):
        try:
            return super().construct_yaml_int(node)
        except ValueError as error:  # more digits than Python converts (sys.get_int_max_str_digits)
            raise yaml.constructor.ConstructorError(None, None, str(error), node.start_mark) from None


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)


def parse_yaml(text_or_file) -> Any:
    return yaml.load(text_or_file, Loader=_StrictLoader)
