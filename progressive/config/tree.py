"""Dataclasses to and from nested dicts (YAML, JSON, ``--dotted.key value`` overrides), with errors that name
the field: the generic half of progressive.config, which holds the schema (YAML text is read by ``reader.py``).

``from_dict(cls, tree)`` builds a dataclass from a nested dict, converting YAML and command-line values to the
annotated types (``int | None``, ``list[Level]``, nested dataclasses); an unknown key or a wrong type raises
ConfigError starting with the dotted field name. A class with a ``from_tree(value, where)`` classmethod parses
its own section (a section whose keys are not fixed fields), and one with ``as_tree()`` dumps itself.
``to_dict`` is the inverse, ``set_dotted`` applies an override, ``flatten`` gives ``{"a.b.0.c": value}``.
"""

from __future__ import annotations

import copy
import reprlib
import types
import typing
from dataclasses import fields, is_dataclass
from typing import Any

from progressive.config.reader import ConfigError, read_yaml

INT_LIMIT = 2**63 - 1  # integer settings are 64-bit: a value past it is a typo, not a plan
_short = reprlib.Repr()  # (keyword arguments only from Python 3.12)
_short.maxstring, _short.maxother, _short.maxlevel, _short.maxlist, _short.maxdict = 80, 80, 2, 4, 4


class Verbatim(str):
    """A command-line value: kept exactly as typed for a string field (``--name 010`` is "010", not 8), read
    as a number or a boolean for those fields, and as YAML only for a list or a section."""


def show(value: Any) -> str:
    """``value``'s repr, cut short (an error message never prints a huge or self-referencing value whole)."""
    return _short.repr(value)


def _scalar(tp: Any) -> bool:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return all(_scalar(a) for a in typing.get_args(tp))
    return tp in (str, int, float, bool, type(None)) or typing.get_origin(tp) is typing.Literal


def _whole(value: Any, where: str) -> int:
    """An int exactly (a big integer is not rounded through float), within 64 bits."""
    if isinstance(value, int):
        num = value
    else:
        text = str(value).strip().replace("_", "")
        try:
            num = int(text)
        except ValueError:
            f = float(text)  # "1e6": a whole number written as a float
            if f != f or f in (float("inf"), float("-inf")) or f != int(f):
                raise ValueError from None
            num = int(f)
    if abs(num) > INT_LIMIT:
        raise ConfigError(f"{where}: {show(value)} is out of range (a 64-bit integer)")
    return num


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert a YAML/CLI value to the annotated type ``tp``, or raise ConfigError naming ``where``."""
    if isinstance(value, Verbatim) and not _scalar(tp) and tp is not Any:
        value = read_yaml(str(value), f"--{where}")  # a list or a section given on the command line
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in args:
                return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return coerce(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: cannot be None")
    if origin is typing.Literal:  # a choice: read as its values' type; the section checks it is one of them
        kinds = {type(a) for a in typing.get_args(tp)}
        return coerce(value, kinds.pop() if len(kinds) == 1 else Any, where)
    if isinstance(tp, type) and hasattr(tp, "from_tree"):
        return tp.from_tree(value, where)
    if is_dataclass(tp):
        return from_dict(tp, value, where)
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {show(value)}")
        return [coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{where}: expected true/false, got {show(value)}")
    if tp in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected a number, got {show(value)}")
        try:
            if tp is int:  # exactly: a big integer is not rounded through float
                return _whole(value, where)
            return float(value)
        except ConfigError:
            raise
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"{where}: expected {tp.__name__}, got {show(value)}") from None
    if tp is str:
        if isinstance(value, Verbatim):
            return str(value)
        if isinstance(value, bool):  # YAML 1.1 reads no/yes/off/on as booleans: `mixed_precision: no`
            return "yes" if value else "no"
        if isinstance(value, (dict, list)) or value is None:
            raise ConfigError(f"{where}: expected a string, got {show(value)}")
        return str(value)
    return value


def from_dict(cls: type, data: Any, where: str = "") -> Any:
    """Build dataclass ``cls`` from a nested dict; unknown keys and wrong types raise ConfigError."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {show(data)}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(f"{prefix}{unknown[0]}: unknown key; valid keys here: {', '.join(sorted(names))}")
    kwargs = {k: coerce(v, hints[k], f"{where}.{k}" if where else k) for k, v in data.items()}
    return cls(**kwargs)


def plain(obj: Any) -> Any:
    """``obj`` as plain dicts, lists and scalars (a deep copy)."""
    if hasattr(obj, "as_tree"):
        return obj.as_tree()
    if is_dataclass(obj):
        return {f.name: plain(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    return copy.deepcopy(obj)


def to_dict(cfg: Any) -> dict:
    """The config as plain nested dicts/lists (YAML/JSON-ready); ``method`` in the recipe's shape."""
    return plain(cfg)


def set_dotted(tree: dict, key: str, value: Any) -> None:
    """Set ``tree[a][b][0][c] = value`` for key "a.b.0.c"; raises ConfigError for unknown paths."""
    parts = key.split(".")
    node: Any = tree
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        here = ".".join(parts[: i + 1])
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"{here}: no list item {part} (the list has {len(node)} items)")
            idx = int(part)
            if last:
                node[idx] = value
            else:
                node = node[idx]
            continue
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(f"{here}: unknown key (from --{key})")
        if last:
            node[part] = value
        else:
            if node[part] is None:
                node[part] = {}  # e.g. --method.vcycle.levels.0.up.steps 5 when ``up`` is unset
            node = node[part]


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"train.lr": 1e-3, "method.vcycle.levels.0.alpha": 0.25, ...}."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else k))
        return out
    if isinstance(tree, list):
        out = {}
        for i, v in enumerate(tree):
            out.update(flatten(v, f"{prefix}.{i}"))
        return out if tree else {prefix: []}
    return {prefix: tree}
