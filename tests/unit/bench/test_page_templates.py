"""The pages' prose is in bench/pages/templates/: every template is read by a page module, and the sentences for
inputs not recorded yet come out whole (the committed results exercise the others: ``bench.pages --check``)."""

from __future__ import annotations

import re

from bench.pages import results
from bench.pages.text import ROOT, TEMPLATES


def test_every_template_is_filled_by_a_page_module_and_every_name_filled_has_a_template():
    code = "\n".join(p.read_text() for p in (ROOT / "bench" / "pages").glob("*.py"))
    used = set(re.findall(r"""(?:fill|template)\(\s*["']([a-z0-9_]+)["']""", code))
    files = {p.stem for p in TEMPLATES.glob("*.md")}
    assert files - used == set(), "templates no page module fills"
    assert used - files == set(), "names filled without a template"


def test_the_sentences_for_results_not_recorded_yet_are_whole():
    assert results._frontier_verdict("MIDAS", [("midas", "midas")], {}, {}) == \
        "- **MIDAS**: not run yet (`python -m bench.frontier`)."
    table = results.headline({}, None, None)
    assert "| AutoFreeze / AutoCache | " in table and "| no recorded run in bench/results | `python -m" in table
    assert results._other_rows(None, None, None) == []
    assert "$" not in table
