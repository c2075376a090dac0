"""How exact the operators are, per model class: ``python -m bench.exactness.<name>`` (surgery, depth)."""
