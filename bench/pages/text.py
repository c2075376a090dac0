"""Where the pages' prose lives: templates in bench/pages/templates/, filled with values the page modules compute.

A template is Markdown with ``$name`` (or ``${name}``) places (``string.Template``); a missing value is an error
(``KeyError`` naming it), so a template never renders with a hole.
"""

from __future__ import annotations

from pathlib import Path
from string import Template

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = Path(__file__).resolve().parent / "templates"
README, DOCS, RESULTS = ROOT / "README.md", ROOT / "docs" / "results", ROOT / "bench" / "results"


def splice(text: str, begin: str, end: str, block: str, where: str) -> str:
    """``text`` with what lies between the markers ``begin`` and ``end`` replaced by ``block`` (markers kept).

    Raises:
        SystemExit: ``text`` (the page ``where``) lacks a marker.
    """
    if begin not in text or end not in text:
        raise SystemExit(f"{where} has no {begin} ... {end} block")
    head, rest = text.split(begin, 1)
    return f"{head}{begin}\n{block}\n{end}{rest.split(end, 1)[1]}"


def template(name: str) -> str:
    """The text of ``templates/<name>.md`` without its file's final newline."""
    return (TEMPLATES / f"{name}.md").read_text().removesuffix("\n")


def fill(name: str, **values: object) -> str:
    """``templates/<name>.md`` with its places filled from ``values``.

    Raises:
        KeyError: a place the values do not name.
    """
    return Template(template(name)).substitute({k: str(v) for k, v in values.items()})
