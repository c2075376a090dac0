"""``python tests/train_many.py [--resume [auto]] a.yaml b.yaml ...``: what ``train.py --config X`` (with the
same flags) does for each config in turn, in one launch (under torchrun: one process group for all of them, as
``train.py --compare`` has). The tests compare many tiny distributed runs, and starting the processes (imports,
gloo) took most of each one's time. The main process writes ``MARK`` and the config's path on stderr before each
run (tests.train_utils.stderr_of). ``LAST_ENV`` (a JSON object of environment variables) is set for the last config
only: a kill or a stop of its run (progressive/run/faults.py) then ends a launch whose other runs have finished."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MARK = "==> train_many: "
LAST_ENV = "TRAIN_MANY_LAST_ENV"


def _each(args: list[str]) -> int:
    """Each config of ``args`` (its .yaml files) in turn, with the other arguments added to every one."""
    from progressive.cli import _main

    flags = [a for a in args if not a.endswith(".yaml")]
    paths = [a for a in args if a.endswith(".yaml")]
    last = json.loads(os.environ.pop(LAST_ENV, "{}"))
    code = 0
    for i, path in enumerate(paths):
        if i == len(paths) - 1:
            os.environ.update(last)
        if os.environ.get("RANK", "0") == "0":
            print(f"{MARK}{path}", file=sys.stderr, flush=True)
        code = max(code, _main(["--config", path, *flags]))
    return code


if __name__ == "__main__":
    from common.cli import run_cli
    from common.quiet import quiet_transformers

    quiet_transformers()
    sys.exit(run_cli(_each))
