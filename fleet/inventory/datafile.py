"""Inventory files as plain data: YAML (`.yaml`/`.yml`, safe, no key written twice) or TOML (`.toml`).

Reading and syntax are checked here; the shape and the values are checked by
`fleet.inventory.load`. Every problem is a one-line `InventoryError`.
"""

from __future__ import annotations

import tomllib
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

from fleet.inventory.messages import one_line
from fleet.model.errors import InventoryError

# libyaml's parser when PyYAML was built with it (about 10x faster on a large inventory); same safe constructor.
_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_SafeLoader):  # type: ignore[valid-type,misc]
    """PyYAML's safe loader, refusing a key written twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                ident = (key_node.tag, key_node.value)
                if ident in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                    )
                seen.add(ident)
        mapping: dict[Hashable, Any] = super().construct_mapping(node, deep)
        return mapping


def _parse_yaml(raw: bytes, label: str) -> object:
    try:
        return yaml.load(raw, Loader=_Loader)  # _Loader is a SafeLoader
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InventoryError(label, where, f"YAML syntax error: {one_line(str(e.problem))}") from None
    except yaml.YAMLError as e:
        raise InventoryError(label, "", f"YAML syntax error: {one_line(str(e))}") from None


def _parse_toml(raw: bytes, label: str) -> object:
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise InventoryError(label, "", "not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise InventoryError(label, "", f"TOML syntax error: {one_line(str(e))}") from None


def read_data(path: Path, label: str) -> object:
    """The file's data, by its suffix; a missing file or a syntax error is an `InventoryError` naming `label`."""
    suffix = path.suffix.lower()
    if suffix not in {".yaml", ".yml", ".toml"}:
        raise InventoryError(label, "", "unknown inventory format: use a .yaml, .yml or .toml file")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InventoryError(label, "", "no such file") from None
    except OSError as e:
        raise InventoryError(label, "", one_line(e.strerror or str(e)).lower()) from None
    return _parse_toml(raw, label) if suffix == ".toml" else _parse_yaml(raw, label)
