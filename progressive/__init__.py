"""The methods and the training machinery they share (see docs/architecture.md).

Importing the package imports nothing else: a recipe's ``method.<name>:`` sections are listed in
progressive.config.methods, so reading a config loads no method (nor numpy, torch or transformers).
"""
