"""The front door does not rot: the README stays short, its links resolve, its results block is what
`python -m bench.pages` generates from the recorded bench data, and the operators' example runs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_readme_is_a_front_door_with_the_commands_first():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    first_screen = "\n".join(text.splitlines()[:30])
    assert "python train.py" in first_screen and "pytest" in first_screen and "pip install" in first_screen


def test_every_link_in_the_readme_and_docs_resolves():
    for page in [README, *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            assert (page.parent / target).exists(), f"{page.name}: {target}"


def test_results_are_what_bench_pages_generates_from_the_recorded_data():
    from bench import pages

    for path, text in pages.render().items():
        assert path.read_text() == text, f"{path.relative_to(ROOT)} is stale: run python -m bench.pages"
    assert pages.main(["--check"]) == 0


def test_docs_results_holds_only_generated_pages_each_with_a_title():
    for page in sorted((ROOT / "docs" / "results").glob("*.md")):
        lines = page.read_text().splitlines()
        assert lines[0].startswith("# "), f"{page.name}: no title"
        assert re.search(r"(Generated|Regenerated) by `python -m bench\.", "\n".join(lines[:4])), page.name


def test_the_operators_api_tour_runs():
    text = (ROOT / "docs" / "operators.md").read_text()
    section = text.split("## API tour", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    exec(compile(code, "docs/operators.md:api-tour", "exec"), scope)  # noqa: S102 - our own docs
    assert scope["same"].config.n_layer == 4 and scope["small"].config.n_embd == 128
