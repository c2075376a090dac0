"""Markdown tables for printed summaries and README-ready results (train.py, the eval CLIs, bench/)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["format_table"]


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Render ``rows`` as a GitHub-flavoured Markdown table (floats with 4 significant digits)."""
    if not rows:
        return "(no results)"
    columns = list(columns or rows[0].keys())

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)
