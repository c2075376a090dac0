"""The methods' recipe sections, ``method.<name>:``: each method's options dataclass, listed once in
``METHOD_OPTIONS``, read from the method folders (progressive/methods/<name>/options.py, through
progressive/config/registry.py: light modules both, so reading a recipe imports no method, nor numpy, torch or
transformers). A method defined outside the package registers its options with ``register_method_options``.
"""

from __future__ import annotations

from dataclasses import is_dataclass

from progressive.config import registry as method_folders
from progressive.config.phase import PhaseSpec

__all__ = ["PhaseSpec", "METHOD_OPTIONS", "register_method_options"]

# method name (``method.name: <name>``) -> its options dataclass, the recipe section ``method.<name>:``: every method
# folder's (progressive/config/registry.py); progressive.methods checks that each method it registers holds the same
# class ("baseline" has no options)
METHOD_OPTIONS: dict[str, type] = method_folders.options()


def register_method_options(name: str, options: type) -> None:
    """Make ``method.<name>:`` a recipe section parsed into the dataclass ``options``, for a method defined
    outside progressive/methods/ (progressive.methods.register_method calls this).

    Raises:
        TypeError: ``options`` is not a dataclass.
    """
    if not is_dataclass(options):
        raise TypeError(f"options of method {name!r} must be a dataclass, got {options!r}")
    METHOD_OPTIONS[name] = options

