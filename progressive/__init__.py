"""The methods and the training machinery they share (see docs/architecture.md).

Importing the package imports progressive.methods, whose one list of methods registers each method's options
section, so a recipe's ``method.<name>:`` section parses wherever a config is loaded.
"""

import progressive.methods  # noqa: F401  (the list of methods registers their config sections)
