"""The model side: each family's models, objectives and batches (``build.py``) and their FLOPs (``flops.py``)."""
