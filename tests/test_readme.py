"""The README's Python example runs as written (the front door must not rot)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_operators_example_runs():
    text = README.read_text()
    section = text.split("## Operators", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    exec(compile(code, "README.md:operators", "exec"), scope)  # noqa: S102 - our own README
    assert scope["same"].config.n_layer == 4 and scope["small"].config.n_embd == 128
