"""The run configuration: the schema (typed dataclasses, YAML recipes, overrides, validation, resume diffs:
``schema.py``), what each field affects (its mark: ``fields.py``), the ``data:`` section (``data.py``), the
methods' option sections (``methods.py``), and the generic conversion between dataclasses and nested dicts
(``tree.py``). Importing it imports no method, nor numpy, torch or transformers.

Everything is importable from here: ``from progressive.config import RunConfig, load_config``.
"""

from progressive.config.schema import *  # noqa: F403  (the public names, see schema.__all__)
from progressive.config.schema import __all__  # noqa: F401
