"""The run machinery: the training loop (``trainer.py``), checkpoints (``checkpoint.py``), the run folder
(``rundir.py``), metrics and trackers (``tracking.py``), Accelerate glue (``accelerator.py``), stopping on a
signal (``stop.py``) and a run's own outputs (``summary.py``: final checkpoint and summary; ``plots.py``)."""
