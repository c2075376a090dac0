"""What drives the trainer from above: method comparisons (``compare.py``) and dry-run plans (``dryrun.py``)."""
