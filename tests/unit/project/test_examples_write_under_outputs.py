"""The commands the README and docs/ show write under outputs/ (the folder .gitignore keeps out of the repository),
never a folder at the repository root: a newcomer who pastes an example finds its output where every run's is."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md"))]  # docs/results/ is generated
# flags whose value is a path the command writes; --results bench/results is the benches' recorded data (on purpose)
OUTPUT_FLAGS = ("--output", "--out", "--output_dir", "--logging_dir")
OUT_POSITION = {"coalesce": 1, "decoalesce": 1, "interpolate": 2}  # python -m operators SUB IN.. OUT


def _commands(page: Path) -> list[tuple[int, list[str]]]:
    """(line number, argv) of every command line in the page's bash blocks (comments and continuations cut) and of
    every command quoted inline in its prose (`python ...`)."""
    out, inside = [], False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            inside = line.strip() == "```bash"
            continue
        if inside and line.strip() and not line.lstrip().startswith("#"):
            codes = [line.split("  #", 1)[0].rstrip(" \\")]
        else:
            codes = [] if inside else re.findall(r"`((?:python|torchrun|accelerate|growtrain)[^`]*)`", line)
        for code in codes:
            try:
                out.append((number, shlex.split(code)))
            except ValueError:
                continue  # not a command (a fragment of one continued from the line before)
    return out


def _placeholder(arg: str) -> bool:
    """CKPT, SMALL, NEW, <dir>: a name for the reader to fill in, not a path."""
    return arg.isupper() or arg.startswith("<")


def _written(argv: list[str]) -> list[str]:
    """The paths ``argv`` writes, as far as its flags and the operators' positions say."""
    paths = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in OUTPUT_FLAGS]
    paths += [a.split("=", 1)[1] for a in argv if a.split("=", 1)[0] in OUTPUT_FLAGS and "=" in a]
    if argv[:3] == ["python", "-m", "operators"] and len(argv) > 3 and argv[3] in OUT_POSITION:
        positional = [a for a in argv[4:] if not a.startswith("-")][:OUT_POSITION[argv[3]] + 1]
        paths += positional[OUT_POSITION[argv[3]]:]
    return paths


def test_every_example_command_in_the_readme_and_docs_writes_under_outputs():
    wrong = [f"{page.relative_to(ROOT)}:{number}: {path}" for page in PAGES for number, argv in _commands(page)
             for path in _written(argv) if not (_placeholder(path) or re.match(r"(\./)?outputs/", path))]
    assert not wrong, "examples that write outside outputs/:\n" + "\n".join(wrong)


def test_the_check_sees_an_operators_output_at_the_root_and_a_flag_outside_outputs():
    assert _written(shlex.split("python -m operators coalesce outputs/default/vcycle/final small --width 2")) == \
        ["small"]
    assert _written(shlex.split("python -m operators interpolate A B outputs/mixed --alpha 0.25")) == ["outputs/mixed"]
    assert _written(shlex.split("python -m eval.zeroshot CKPT --output results.json")) == ["results.json"]
