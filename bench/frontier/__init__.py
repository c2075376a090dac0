"""Every method on one compute-optimal frontier: ``python -m bench.frontier`` (see run.py)."""
