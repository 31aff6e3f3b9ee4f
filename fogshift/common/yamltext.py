"""Reading the YAML files users write (pipeline specs, fog topologies): UTF-8 text, each key
of a mapping once, no anchors or aliases.

PyYAML's ``safe_load`` keeps the last of two equal keys (an element's ``options`` written
twice, or ``elements`` twice, silently lost the first), and expands aliases: a few hundred
bytes of nested anchors made a structure of billions of values, which the spec's checks
walked for minutes (the dashboard's deploy form froze).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError


class _StrictLoader(yaml.SafeLoader):
    """``SafeLoader`` refusing aliases and keys given twice."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ComposerError(
                None, None,
                f"found an alias (*{event.anchor}): anchors and aliases are not accepted "
                "(write the values out)",
                event.start_mark,
            )  # fmt: skip
        return super().compose_node(parent, index)

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        # A scalar PyYAML's constructors cannot make raises ValueError, not a YAMLError:
        # an integer of over 4300 digits (Python converts no more), a date that is none
        # (2026-13-45). Every reader answered it with a traceback or a 500.
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as exc:
            shown = node.value if isinstance(node.value, str) else ""
            raise ConstructorError(
                None, None,
                f"cannot read the value {shown[:40]!r}{'…' if len(shown) > 40 else ''}: {exc}",
                node.start_mark,
            ) from None  # fmt: skip


def _mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        try:
            twice = key in seen
        except TypeError:  # unhashable: construct_mapping refuses it, saying so
            continue
        if twice:
            raise ConstructorError(
                "while reading a mapping", node.start_mark,
                f"found key {key!r} twice (each key once: the first would be lost)",
                key_node.start_mark,
            )  # fmt: skip
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def load_yaml(text: str) -> Any:
    """``text`` as YAML, strictly (see the module).

    Raises:
        yaml.YAMLError: It is not valid YAML, repeats a key, or uses an alias.
        RecursionError: It nests too deep.
    """
    return yaml.load(text, Loader=_StrictLoader)


def read_utf8(path: Path) -> str:
    """The text of a file a user wrote.

    Raises:
        OSError: It cannot be read.
        ValueError: It is not UTF-8 (the message says where, and how to mend it).
    """
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{str(path)!r} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start}): save it as UTF-8"
        ) from None
