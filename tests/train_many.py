"""``python tests/train_many.py a.yaml b.yaml ...``: what ``train.py --config X`` does for each config in turn,
in one launch (under torchrun: one process group for all of them, as ``train.py --compare`` has). The tests
compare many tiny distributed runs, and starting the processes (imports, gloo) took most of each one's time."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if __name__ == "__main__":
    from common.cli import run_cli
    from common.quiet import quiet_transformers
    from progressive.cli import _main

    quiet_transformers()
    sys.exit(run_cli(lambda paths: max(_main(["--config", p]) for p in paths)))
