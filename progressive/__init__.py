"""The methods and the training machinery they share (see docs/architecture.md).

Importing the package registers every method in progressive/methods/, so a recipe's ``method.<name>:``
section parses wherever a config is loaded.
"""

import progressive.methods  # noqa: F401  (registers the methods and their config sections)
