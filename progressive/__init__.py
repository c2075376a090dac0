"""The methods and the training machinery they share (see docs/architecture.md).

Importing the package imports nothing else: a recipe's ``method.<name>:`` sections are the method folders' light
options modules (progressive/config/registry.py), so reading a config loads no method (nor numpy, torch or
transformers).
"""
