"""Reading a YAML recipe strictly: what a file says is what the run gets, or one line saying why not.

PyYAML's safe loader is lenient in ways that change a run silently or take the process down:

- a key given twice keeps the last one (a second ``train:`` section drops the first's batch size and LR);
  here it is an error naming both lines, and so are two merge keys in one mapping (``{<<: *a, <<: *b}``, of
  which PyYAML keeps one: ``<<: [*a, *b]`` merges both);
- merge keys are resolved by PyYAML's ``flatten_mapping``, whose order changed between releases (6.0.4 lets a
  later mapping in ``<<: [*b, *a]`` win, 6.0.3 and the spec an earlier one), and which rewrites the merged
  mappings in place (so one read after it was merged looked like a key given twice). Here the merge is this
  reader's (``_Strict._keys``), by YAML's merge type (https://yaml.org/type/merge.html): ``<<`` takes a mapping
  or a list of mappings, an earlier mapping in the list wins over a later one, and the mapping's own keys win
  over all; a merged mapping is checked as a written one is, and a merge of anything else, or of the mapping
  it is in, is refused naming its line;
- YAML 1.1 scalars: ``010`` is 8, ``1:30`` is 90, ``on``/``no`` are booleans, ``2024-01-01`` a date and
  ``!!binary`` bytes. Here scalars follow YAML 1.2's JSON-like core: ``true``/``false``, ``null``/``~``,
  decimal integers without leading zeros, decimal floats (``1e-3`` included) and ``.inf``/``.nan``;
  everything else is a string, exactly as written, and ``!!binary``, ``!!timestamp`` and ``!!set`` are refused;
  an explicit ``!!int``, ``!!float``, ``!!bool`` or ``!!null`` takes only those forms (``!!int 010`` was 8);
- an alias bomb (nested anchors that expand to billions of nodes) and thousands of nested brackets: here a
  document deeper than ``MAX_DEPTH`` or larger than ``MAX_NODES`` once its aliases are expanded is refused
  before anything is built from it;
- a key that is not a string (a complex key ``? [a, b]``, a number, null) names no setting, and a list key was a
  TypeError: here it is an error naming the line.

Command-line values never pass through YAML as a whole: ``tree.Verbatim`` keeps them as typed, and only a
field whose type is a list or a section reads its value as YAML (with this reader).
"""

from __future__ import annotations

import re
import reprlib
from pathlib import Path
from typing import Any

import yaml

__all__ = ["ConfigError", "read_yaml", "read_text", "MAX_DEPTH", "MAX_NODES"]

MAX_DEPTH = 64          # nested mappings / lists
MAX_NODES = 100_000     # scalars, mappings and lists, with every alias expanded

_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT = re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$")
_FLOAT = re.compile(r"^(?:[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?[0-9]+[eE][-+]?[0-9]+"
                    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")  # a dot or an exponent: 010 is no float
_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_MERGE = "tag:yaml.org,2002:merge"


class ConfigError(ValueError):
    """A config that cannot work; the message starts with the dotted name of the offending field (or the file)."""


class _Strict(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core scalars, no duplicate keys, bounded depth and expansion."""

    yaml_implicit_resolvers: dict = {}

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._merged: dict[int, dict[str, Any] | None] = {}  # a mapping node's keys (_keys); None while in progress

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise ConfigError(f"line {mark.line + 1}: nested more than {MAX_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> dict:
        if not isinstance(node, yaml.MappingNode):  # a !!map tag on a list or scalar: PyYAML's error, with its line
            return super().construct_mapping(node, deep=deep)
        return {key: self.construct_object(value, deep=deep) for key, value in self._keys(node).items()}

    def _keys(self, node: yaml.MappingNode) -> dict[str, Any]:
        """The keys that mapping ``node`` reads, each with its value's node, merge keys resolved (module
        docstring). Worked out once per node and never written into it (nodes are shared through aliases)."""
        done = self._merged.get(id(node))
        if done is not None:
            return done
        self._merged[id(node)] = None  # in progress: a merge that reaches it again merges the mapping it is in
        own, sources, line = self._own_keys(node)
        keys: dict[str, Any] = {}
        for source in sources:
            if id(source) in self._merged and self._merged[id(source)] is None:
                raise ConfigError(f"line {line}: the merge key '<<' merges the mapping it is in (through an alias to "
                                  "it); merge other mappings")
            for key, value in self._keys(source).items():
                keys.setdefault(key, value)  # an earlier mapping in the list wins over a later one
        keys.update(own)  # the mapping's own keys win over every merged one
        self._merged[id(node)] = keys
        return keys

    def _own_keys(self, node: yaml.MappingNode) -> tuple[dict[str, Any], list[Any], int]:
        """``node``'s own keys with their value nodes, the mappings its merge key names (in order) and that key's
        line (0 without one); every key checked: a string, given once."""
        own: dict[str, Any] = {}
        lines: dict[str, int] = {}
        sources: list[Any] = []
        merged = 0  # the line of the mapping's merge key
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == _MERGE:  # ``<<: *defaults``: keys given beside it win, by design
                if merged:  # PyYAML keeps one of two merge keys silently
                    raise ConfigError(f"line {line}: the merge key '<<' is given twice (first on line {merged}); "
                                      "merge several mappings with one: <<: [*a, *b]")
                merged, sources = line, _merge_sources(value_node, line)
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):  # a complex key (``? [a, b]``), a number or null: no setting is named so
                raise ConfigError(f"line {line}: the key {reprlib.repr(key)} is not a string; a recipe's keys are "
                                  "names of settings")
            if key in own:
                raise ConfigError(f"line {line}: key {key[:60]!r} is given twice (first on line {lines[key]}); "
                                  "a recipe says each setting once")
            own[key], lines[key] = value_node, line
        return own, sources, merged


def _merge_sources(value: Any, line: int) -> list[Any]:
    """The mappings a merge key on ``line`` names: its value, a mapping or a list of mappings.

    Raises:
        ConfigError: a value (or an item of the list) that is not a mapping, naming its kind and line.
    """
    sources = value.value if isinstance(value, yaml.SequenceNode) else [value]
    for source in sources:
        if not isinstance(source, yaml.MappingNode) or source.tag != "tag:yaml.org,2002:map":
            kind = source.tag.replace("tag:yaml.org,2002:", "!!") + " value" if source.id == "mapping" else source.id
            raise ConfigError(f"line {line}: the merge key '<<' takes a mapping or a list of mappings (<<: *a, or "
                              f"<<: [*a, *b]), not a {kind} (line {source.start_mark.line + 1})")
    return sources


for _first, _pattern, _tag in [(list("tTfF"), _BOOL, "tag:yaml.org,2002:bool"),
                               (list("-+0123456789"), _INT, "tag:yaml.org,2002:int"),
                               (list("-+.0123456789"), _FLOAT, "tag:yaml.org,2002:float"),
                               (["~", "n", "N", ""], _NULL, "tag:yaml.org,2002:null"),
                               (["<"], re.compile(r"^<<$"), _MERGE)]:
    _Strict.add_implicit_resolver(_tag, _pattern, _first)


def _refuse(loader: yaml.Loader, node: Any) -> Any:
    raise ConfigError(f"line {node.start_mark.line + 1}: {node.tag} values are not read here; write a plain string")


for _tag in ("tag:yaml.org,2002:binary", "tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:set",
             "tag:yaml.org,2002:omap", "tag:yaml.org,2002:pairs"):
    _Strict.add_constructor(_tag, _refuse)


def _core(kind: str, pattern: re.Pattern, forms: str) -> Any:
    """A constructor for ``!!kind`` that reads only YAML 1.2's core ``forms`` (``pattern``), then as PyYAML does: an
    untagged scalar gets the tag only in those forms, but an explicit tag reached PyYAML's YAML 1.1 rules."""
    construct = _Strict.yaml_constructors[f"tag:yaml.org,2002:{kind}"]

    def checked(loader: yaml.Loader, node: Any) -> Any:
        if isinstance(node, yaml.ScalarNode) and not pattern.match(node.value):
            raise ConfigError(f"line {node.start_mark.line + 1}: !!{kind} {node.value!r} is not written as YAML 1.2 "
                              f"writes a {kind} ({forms}); write it so, or quote it for a string")
        return construct(loader, node)
    return checked


for _kind, _pattern, _forms in [("bool", _BOOL, "true or false"), ("null", _NULL, "null or ~"),
                                ("int", _INT, "decimal digits, no leading zero"),
                                ("float", re.compile(f"{_INT.pattern}|{_FLOAT.pattern}"), "1, 0.5, 1e-3 or .inf")]:
    _Strict.add_constructor(f"tag:yaml.org,2002:{_kind}", _core(_kind, _pattern, _forms))


def _expanded_size(node: Any, memo: dict[int, int]) -> int:
    """Nodes in ``node`` with every alias expanded (a shared node counts each time it is used)."""
    key = id(node)
    if key not in memo:
        memo[key] = 0  # a node that contains itself (a recursive alias) counts once here
        if isinstance(node, yaml.MappingNode):
            size = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            size = 1 + sum(_expanded_size(v, memo) for v in node.value)
        else:
            size = 1
        memo[key] = min(size, MAX_NODES + 1)
    return memo[key]


def read_text(path: Any, where: str) -> str:
    """The text of the recipe file ``path``, which must be UTF-8 (as YAML 1.2 recommends; an editor's "UTF-16"
    or a byte-order mark of another encoding is not read).

    Raises:
        ConfigError: ``where`` and the first byte that is not UTF-8.
    """

    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); save the file "
                          "as UTF-8") from None


def read_yaml(text: str, where: str) -> Any:
    """Parse one YAML document strictly (see the module docstring).

    Args:
        text: the document.
        where: what to name in errors (a file, or a command-line flag).

    Raises:
        ConfigError: ``where``, the line, and what is wrong.
    """
    loader = _Strict(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}) > MAX_NODES:
            raise ConfigError(f"expands to more than {MAX_NODES:,} values once its aliases (*name) are expanded; "
                              "a recipe is never that large")
        return loader.construct_document(node)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML{at}: {problem}") from None
    finally:
        loader.dispose()
