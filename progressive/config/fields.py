"""What each config field affects, said once per field, and the checks every section shares.

A field of a section is declared with ``setting(default, AFFECTS)`` (``dataclasses.field`` with the mark in its
metadata). The mark answers the four questions that code outside the schema asks about a field:

    key       is it part of a benchmark run's cache key (bench.lib.runs.config_hash)?
    resume    may it differ when a run resumes: "refused", "warned" (allowed, printed) or "free"?
    trial     does ``--name auto`` spell it in a trial's name?
    compared  must a baseline overlaid on a run's plots share it (progressive.run.summary.find_baseline)?

The resume diff, the cache key, ``--name auto`` and the baseline look-up all read ``mark_of(key)``; no other
module lists field names for them. A field that has an effect only under some values of a field beside it (a
WSD schedule's ``cooldown``, only under ``decay: wsd``) says so once, ``counts_if=("decay", WSD)`` in its
metadata (``setting(..., counts_if=...)``, or ``dataclasses.field(metadata=counts_if(...))`` in the method
sections); ``drop_inert`` removes such fields from a config tree where they have none, so that the cache key and
the resume diff see only what a run computes with (a field added this way keeps every earlier run's key).
``path=True`` marks a file or folder path ("~" expands to the home folder).
Choices are ``Literal`` types; ``check_choices`` checks a section's against its type hints. A number's range is
the field's too (``setting(..., at_least=1, at_most=1024)``); ``check_ranges`` checks a section's.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import re
import tokenize
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from progressive.config.reader import ConfigError

__all__ = ["Mark", "MARKS", "setting", "mark_of", "field_marks", "keep", "check_choices", "check_ranges", "choices_of",
           "Decay", "WSD", "check_schedule", "counts_if", "drop_inert", "NON_EMPTY",
           "cooldown_start", "check_branches"]


@dataclass(frozen=True)
class Mark:
    """What changing a field affects (see the module docstring for the four answers)."""

    name: str
    key: bool
    resume: str  # "refused" | "warned" | "free"
    trial: bool
    compared: bool
    meaning: str


MARKS = {m.name: m for m in (
    Mark("numbers", key=True, resume="refused", trial=True, compared=True,
         meaning="what the run computes: the model, the data, the method, the budget"),
    Mark("tuning", key=True, resume="warned", trial=True, compared=True,
         meaning="what is computed from the resumed step on, without corrupting the saved state (the LR, "
                 "clipping, precision, kernels, the pipeline's split; a moved dataset or tokenizer whose content "
                 "the resume checks)"),
    Mark("records", key=True, resume="warned", trial=True, compared=False,
         meaning="when and where the run records: evaluation, log and checkpoint cadence, its caches"),
    Mark("speed", key=False, resume="warned", trial=True, compared=True,
         meaning="how the work is spread, not what it computes (up to the rounding of a sum)"),
    Mark("device", key=False, resume="refused", trial=True, compared=True,
         meaning="how tensors live on this machine and its peak FLOP/s: fixed for a run's saved state"),
    Mark("bookkeeping", key=False, resume="free", trial=False, compared=False,
         meaning="how a run is watched (trackers, progress, plots, stop timeout) and what a comparison adds"),
    Mark("place", key=False, resume="warned", trial=False, compared=False,
         meaning="where the run lies (its name and output folder: a moved run resumes)"),
)}


def setting(default: Any = dataclasses.MISSING, affects: str = "", *, factory: Any = dataclasses.MISSING,
            path: bool = False, choices: str | None = None, at_least: int | None = None, at_most: int | None = None,
            limits: str | None = None, counts_if: tuple[str, Any] | None = None) -> Any:
    """A config field with its mark: ``dataclasses.field`` whose metadata holds ``affects`` (a key of MARKS),
    ``path`` (a file or folder path), ``choices`` (how an error message words a Literal field's choices,
    default "one of a, b, c"), and the range a number must lie in: ``at_least``, ``at_most`` (past it a typo
    would allocate petabytes before anything says so), ``limits`` (how an error words the range, default
    "must be >= N" / "at most N"). ``check_ranges`` checks them. ``counts_if``: (a field of the same section,
    its values under which this field has an effect), see ``counts_if()`` and ``drop_inert``.

    Raises:
        ValueError: ``affects`` is not a mark.
    """
    if affects not in MARKS:
        raise ValueError(f"affects: one of {', '.join(MARKS)}, got {affects!r}")
    ranges = {k: v for k, v in (("at_least", at_least), ("at_most", at_most), ("limits", limits)) if v is not None}
    meta = {"affects": affects, "path": path, **({"choices": choices} if choices else {}), **ranges,
            **({"counts_if": _condition(*counts_if)} if counts_if else {})}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def field_marks(cls: type, prefix: str = "") -> dict[str, dataclasses.Field]:
    """{"train.lr": its Field, ...}: every marked field of ``cls`` and of its unmarked dataclass sections, by dotted
    path. A marked field whose value is a section (``method``) stands for all of that section."""
    out: dict[str, dataclasses.Field] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if "affects" in f.metadata:
            out[key] = f
        elif dataclasses.is_dataclass(hints[f.name]):
            out.update(field_marks(hints[f.name], f"{key}."))
    return out


def mark_of(marks: dict[str, dataclasses.Field], key: str) -> Mark:
    """The mark of dotted ``key`` ("train.lr", "method.vcycle.levels.0.alpha": the longest marked prefix);
    a field the schema no longer has (a saved config's) changes the numbers."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        f = marks.get(".".join(parts[:n]))
        if f is not None:
            return MARKS[f.metadata["affects"]]
    return MARKS["numbers"]


def keep(tree: dict, marks: dict[str, dataclasses.Field], wanted: typing.Callable[[Mark], bool],
         prefix: str = "") -> dict:
    """``tree`` (a config as nested dicts) without the fields whose mark ``wanted`` rejects; order kept."""
    out = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if key in marks:
            if wanted(MARKS[marks[key].metadata["affects"]]):
                out[k] = v
        elif isinstance(v, dict):
            out[k] = keep(v, marks, wanted, f"{key}.")
        elif wanted(mark_of(marks, key)):
            out[k] = v
    return out


def choices_of(tp: Any) -> tuple | None:
    """The values of a ``Literal`` type, also inside ``X | None`` or ``bool | Literal[...]``; None if none."""
    if typing.get_origin(tp) is typing.Literal:
        return typing.get_args(tp)
    for arg in typing.get_args(tp):
        if typing.get_origin(arg) is typing.Literal:
            return typing.get_args(arg)
    return None


def check_choices(section: Any, where: str) -> None:
    """Raise ConfigError for the first field of dataclass ``section`` whose value is not among its Literal
    type's choices (``None`` passes where the type allows it, as a bool does in ``bool | Literal["auto"]``):
    "<where>.<field>: one of a, b, got 'c'"."""
    hints = typing.get_type_hints(type(section), include_extras=False)
    for f in dataclasses.fields(section):
        options = choices_of(hints[f.name])
        if options is None:
            continue
        value = getattr(section, f.name)
        others = [a for a in typing.get_args(hints[f.name]) if isinstance(a, type)]  # None, bool, int beside it
        if any(isinstance(value, a) for a in others) or (value in options and not isinstance(value, bool)):
            continue
        words = f.metadata.get("choices") or f"one of {', '.join(map(str, options))}"
        raise ConfigError(f"{where}.{f.name}: {words}, got {value!r}")


def check_ranges(section: Any, where: str) -> None:
    """Raise ConfigError for the first field of dataclass ``section`` outside its ``setting`` range (an unset
    ``None`` passes): "<where>.<field>: must be >= 1 (or unset), got 0", "...: at most 1,024, got 100,000"."""
    hints = typing.get_type_hints(type(section), include_extras=False)
    for f in dataclasses.fields(section):
        low, high, value = f.metadata.get("at_least"), f.metadata.get("at_most"), getattr(section, f.name)
        if value is None or (low is None and high is None):
            continue
        words = f.metadata.get("limits")
        if low is not None and value < low:
            unset = " (or unset)" if type(None) in typing.get_args(hints[f.name]) else ""
            raise ConfigError(f"{where}.{f.name}: {words or f'must be >= {low}{unset}'}, got {value}")
        if high is not None and value > high:
            raise ConfigError(f"{where}.{f.name}: {words}, got {value}" if words
                              else f"{where}.{f.name}: at most {high:,}, got {value:,}")


class _NonEmpty:
    """The values of a list field but the empty list, as ``counts_if``'s ``values``: a list setting added later
    (``train.branches``) counts only once it lists something, so every earlier run's key holds."""

    def __contains__(self, value: Any) -> bool:
        return bool(value)

    def __repr__(self) -> str:
        return "NON_EMPTY"


NON_EMPTY = _NonEmpty()


def counts_if(field: str, values: tuple | _NonEmpty) -> dict[str, Any]:
    """The metadata of a field that has an effect only where the field ``field`` of its section holds one of
    ``values`` (``field`` may be the field itself: a setting added later counts only away from the value every
    earlier run had; ``NON_EMPTY``: a list that lists something). ``drop_inert`` reads it."""
    return {"counts_if": _condition(field, values)}


def _condition(field: str, values: tuple | _NonEmpty) -> tuple[str, tuple | _NonEmpty]:
    return field, values if isinstance(values, _NonEmpty) else tuple(values)


def _sections(cls: type) -> dict[str, Any]:
    """{key: its type} of a section's tree: its fields, or ``section_types()`` where the class dumps itself in
    another shape (the method section: {"vcycle": VCycleConfig, ...})."""
    own = getattr(cls, "section_types", None)
    if own is not None:
        return own()
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _dataclass_of(tp: Any) -> tuple[type | None, bool]:
    """(the dataclass that ``tp`` holds, whether as a list): ``X``, ``X | None``, ``list[X]``; (None, False)."""
    if dataclasses.is_dataclass(tp):
        return tp, False
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list and args and dataclasses.is_dataclass(args[0]):
        return args[0], True
    if origin in (typing.Union, types.UnionType):
        return next(((a, False) for a in args if dataclasses.is_dataclass(a)), (None, False))
    return None, False


def drop_inert(tree: Any, cls: type) -> Any:
    """``tree`` (a config of dataclass ``cls`` as nested dicts, e.g. ``to_dict(cfg)``) without the fields that
    have no effect in it: those whose ``counts_if`` condition fails on the value beside them. A key the class
    does not know (a saved config's) is kept as it is, and so is a field whose condition's field is absent.
    Returns a new tree; ``tree`` is not changed."""
    if not isinstance(tree, dict) or not dataclasses.is_dataclass(cls):
        return tree
    sections = _sections(cls)
    conditions = {f.name: f.metadata["counts_if"] for f in dataclasses.fields(cls) if "counts_if" in f.metadata}
    out = {}
    for k, v in tree.items():
        field, values = conditions.get(k, (None, ()))
        if field is not None and field in tree and tree[field] not in values:
            continue
        sub, many = _dataclass_of(sections.get(k))
        if sub is not None:
            v = [drop_inert(x, sub) for x in v] if many and isinstance(v, list) else drop_inert(v, sub)
        out[k] = v
    return out


Decay = Literal["linear", "cosine", "constant", "wsd", "wsd_sqrt"]  # an LR schedule's decay after its warmup
WSD = ("wsd", "wsd_sqrt")  # warmup-stable-decay: the peak held, then a cooldown over the last ``cooldown`` fraction


def cooldown_start(steps: int, cooldown: float) -> int:
    """The first step of a WSD schedule's cooldown over ``steps`` steps (progressive.methods.base.LRSchedule, before
    its floor at the warm-up's end): at least one step cools down."""
    return steps - max(1, int(round(cooldown * steps)))


def check_branches(branches: list[int], steps: int, warmup: float, decay: str, cooldown: float, where: str) -> None:
    """Raise ConfigError unless ``branches`` are cooldown branches of a ``steps``-step WSD schedule
    (progressive.run.branches): lengths in (0, steps), increasing, each forking after the warm-up."""
    if not branches:
        return
    if decay not in WSD:
        raise ConfigError(f"{where}.branches: a cooldown branch forks off a WSD schedule's stable phase, and "
                          f"{where}.decay is {decay!r} (set it to wsd or wsd_sqrt, or leave branches empty)")
    if any(isinstance(b, bool) or not isinstance(b, int) for b in branches) or list(branches) != sorted(set(branches)):
        raise ConfigError(f"{where}.branches: step counts, increasing and distinct, got {list(branches)}")
    warm = int(round(warmup * steps))
    for b in branches:
        if not 0 < b < steps:
            raise ConfigError(f"{where}.branches: a branch is shorter than the run ({steps} steps), got {b}")
        if cooldown_start(b, cooldown) < warm:
            raise ConfigError(f"{where}.branches: the branch of {b} steps would cool down from step "
                              f"{cooldown_start(b, cooldown)}, inside the run's warm-up ({warm} steps); the "
                              f"shortest is {_shortest_branch(warm, cooldown)} steps")


def _shortest_branch(warm: int, cooldown: float) -> int:
    b = 1
    while cooldown_start(b, cooldown) < warm:
        b += 1
    return b


def check_schedule(warmup: float, decay: str, min_lr_ratio: float, where: str, cooldown: float = 0.2) -> None:
    """Raise ConfigError unless (warmup, decay, min_lr_ratio, cooldown) describe an LR schedule
    (progressive.methods.base.LRSchedule): fractions in range, and under a WSD decay a warm-up and a cooldown that
    do not overlap. The cooldown's range is checked whatever the decay (a typo is a typo)."""
    if not 0 <= warmup <= 1:
        raise ConfigError(f"{where}.warmup: a fraction of the phase in [0, 1], got {warmup}")
    if decay not in typing.get_args(Decay):
        raise ConfigError(f"{where}.decay: must be one of {', '.join(typing.get_args(Decay))}, got {decay!r}")
    if not 0 <= min_lr_ratio <= 1:
        raise ConfigError(f"{where}.min_lr_ratio: must be in [0, 1], got {min_lr_ratio}")
    if not 0 < cooldown <= 1:
        raise ConfigError(f"{where}.cooldown: a fraction of the schedule's steps in (0, 1], got {cooldown}")
    if decay in WSD and warmup + cooldown > 1 + 1e-12:
        raise ConfigError(f"{where}.cooldown: warmup + cooldown must be at most 1 (the warm-up {warmup} and the "
                          f"cooldown {cooldown} overlap), got {cooldown}")


def field_help(cls: type) -> dict[str, str]:
    """{field: what it means} of a config dataclass, from where the code explains it: a ````name``: text``
    sentence of the class docstring, else the ``# comments`` on and directly above the field's line. What
    ``--print_config`` shows beside each value (``help_of``); a field explained nowhere has none."""
    said: dict[str, str] = {}
    doc = " ".join((cls.__doc__ or "").split())
    for m in re.finditer(r"``(\w+)``: (.+?)(?=\s``[\w.]+``: |$)", doc):
        said[m[1]] = m[2].rstrip(" .;")
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    said.update(_listed(cls.__doc__ or "", names))
    out: dict[str, str] = {}
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return said
    above: list[str] = []
    field: str | None = None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if tok.line.strip().startswith("#"):
                above.append(text)
            elif field is not None:
                out[field] = text
        elif tok.type == tokenize.NAME and tok.start[1] == 4 and tok.string in names and field is None:
            field = tok.string
            if above:
                out[field] = " ".join(above)
        elif tok.type == tokenize.NEWLINE:
            field, above = None, [] if field is not None else above
        elif tok.type == tokenize.NL and not tok.line.strip():
            above = []
    return {**out, **said}


def _listed(doc: str, names: set[str]) -> dict[str, str]:
    """{field: text} of a docstring that lists its fields one a line, ``name: text`` (continued on lines indented
    deeper), as DataConfig's does."""
    out: dict[str, str] = {}
    field, indent = None, 0
    for line in inspect.cleandoc(doc).splitlines():
        m = re.match(r"(\s*)(\w+): (.+)", line)
        if m and m[2] in names and (field is None or len(m[1]) <= indent):
            field, indent = m[2], len(m[1])
            out[field] = m[3].strip()
        elif field is not None and line.strip() and len(line) - len(line.lstrip()) > indent:
            out[field] += " " + line.strip()
        else:
            field = None
    return {k: v.rstrip(" .;") for k, v in out.items()}


def help_of(root: type, key: str) -> str:
    """What the dotted config ``key`` means (``field_help`` of the dataclass that holds it; list indices and
    a method's section are walked through), "" where nothing explains it."""
    cls, parts = root, key.split(".")
    while parts and parts[-1].isdigit():  # an item of a list field: the field's meaning
        parts.pop()
    for i, part in enumerate(parts):
        if part.isdigit():
            continue
        if i == len(parts) - 1 or not dataclasses.is_dataclass(cls):
            return field_help(cls).get(part, "") if dataclasses.is_dataclass(cls) else ""
        sub, _ = _dataclass_of(_sections(cls).get(part))
        if sub is None:
            return ""
        cls = sub
    return ""
