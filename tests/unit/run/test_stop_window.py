"""The window a launcher really gives a stop: torchrun (what accelerate launch runs for several processes) forwards
SIGTERM and kills its workers shutdown_timeout seconds later, 30 s unless raised; a SIGTERM to the launcher while
the run trains ends every rank at one step boundary with a checkpoint and exit 75 inside that window, and a
train.stop_timeout that cannot fit in it is said at the start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from progressive.config import dump_yaml
from progressive.run import checkpoint as ckpt
from progressive.run.grace import DEFAULT_S, StopWindow, launcher_window, misfit
from tests.train_utils import ROOT, rows, tiny_cfg

TORCHRUN = {"TORCHELASTIC_RUN_ID": "none"}  # what torchrun's agent puts in its workers' environment


def test_the_default_window_is_the_installed_torchruns_and_the_environment_or_its_flag_widen_it(monkeypatch):
    from torch.distributed.launcher.api import LaunchConfig
    from torch.distributed.run import get_args_parser

    for name in ("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "PET_SHUTDOWN_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    assert get_args_parser().parse_args(["train.py"]).shutdown_timeout is None  # no flag: LaunchConfig decides
    assert LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1).shutdown_timeout == DEFAULT_S == 30
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "270")  # what accelerate launch (no such flag) passes on
    assert LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1).shutdown_timeout == 270

    assert launcher_window({}, []) is None  # no launcher (or one whose window is not known here)
    assert launcher_window(TORCHRUN, ["torchrun", "train.py"]) == (30.0, "torchrun's default shutdown_timeout")
    assert launcher_window({**TORCHRUN, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "270"}, []) == \
        (270.0, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
    assert launcher_window({**TORCHRUN, "PET_SHUTDOWN_TIMEOUT": "90", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "270"}, []) \
        == (90.0, "PET_SHUTDOWN_TIMEOUT")
    for command in (["torchrun", "--shutdown_timeout", "120", "train.py"], ["torchrun", "--shutdown-timeout=120"]):
        assert launcher_window({**TORCHRUN, "PET_SHUTDOWN_TIMEOUT": "90"}, command) == \
            (120.0, "torchrun --shutdown_timeout")


def test_a_stop_that_cannot_fit_in_the_window_is_said_once_at_the_start_or_after_the_first_timed_write():
    window = (30.0, "torchrun's default shutdown_timeout")
    assert misfit(20, window) is None and misfit(20, window, 9.5) is None and misfit(20, None, 60) is None
    assert misfit(20, window, 12.5) == (
        "warning: train.stop_timeout (20 s) plus a checkpoint write (12.5 s) does not fit in the 30 s between the "
        "launcher's SIGTERM and its SIGKILL (torchrun's default shutdown_timeout): a stop may be killed before its "
        "checkpoint is written; widen the window (torchrun --shutdown_timeout N, or TORCH_ELASTIC_SHUTDOWN_TIMEOUT=N "
        "for accelerate launch) or lower train.stop_timeout")
    assert misfit(0, window).startswith("warning: train.stop_timeout 0 (a stop waits for the step however long) does")
    said: list[str] = []
    fits = StopWindow(20, said.append, window)
    fits.start()
    fits.wrote(1.0)
    fits.wrote(60.0)  # only the first write is timed against the window
    assert said == []
    late = StopWindow(20, said.append, window)
    late.start()
    late.wrote(15.0)
    late.wrote(15.0)
    assert said == [misfit(20, window, 15.0)]
    StopWindow(40, None, window).start()  # the other processes say nothing
    assert len(said) == 1


@pytest.mark.slow
def test_a_sigterm_to_torchrun_while_training_checkpoints_and_every_rank_exits_75_inside_its_window(tmp_path):
    """As SLURM's warning reaches a run (srun -> the launcher): torchrun forwards the SIGTERM to both ranks, which
    agree on one step boundary, write the checkpoint and exit 75 before torchrun's SIGKILL (30 s later)."""
    cfg = tiny_cfg(tmp_path, method="baseline", train__cpu=True, train__steps=5000, train__checkpoint_every=10_000,
                   train__eval_every=10_000, train__stop_timeout=40)
    path = tmp_path / "run.yaml"
    path.write_text(dump_yaml(cfg))
    codes = tmp_path / "codes"
    codes.mkdir()
    # each rank under a shell that records its exit code (the launcher itself reports a stop as a failure)
    wrapper = 'trap : TERM; "$0" "$@"; echo $? > "$CODES/rank$RANK"'
    env = {**os.environ, "CODES": str(codes)}
    for name in ("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "PET_SHUTDOWN_TIMEOUT"):
        env.pop(name, None)  # the default window
    launcher = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                                 "--no-python", "sh", "-c", wrapper, sys.executable, str(ROOT / "train.py"), "--config",
                                 str(path)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and launcher.poll() is None:
            if (cfg.run_dir / "metrics.jsonl").is_file() and len(rows(cfg.run_dir, "train")) >= 3:
                break
            time.sleep(0.2)
        assert launcher.poll() is None, launcher.communicate()[1][-3000:]
        launcher.send_signal(signal.SIGTERM)  # to the launcher only, as srun passes the batch script's on
        sent = time.monotonic()
        _, err = launcher.communicate(timeout=120)
        took = time.monotonic() - sent
    finally:
        try:
            os.killpg(launcher.pid, signal.SIGKILL)  # whatever of the launch is left
        except ProcessLookupError:
            pass
    assert "forcefully exiting" not in err and took < DEFAULT_S, (took, err[-3000:])  # no SIGKILL was needed
    assert sorted(p.read_text().strip() for p in codes.iterdir()) == ["75", "75"], err[-3000:]
    assert ("warning: train.stop_timeout (40 s) does not fit in the 30 s between the launcher's SIGTERM and its "
            "SIGKILL (torchrun's default shutdown_timeout)") in err
    (only,) = ckpt.list_checkpoints(cfg.run_dir)  # the stop's, written by both ranks together
    state = ckpt.verify(only)
    assert state["world_size"] == 2 and f"stopped by SIGTERM after step {state['step']} (phase " in err


def test_the_slurm_script_gives_the_stop_its_warnings_lead_less_a_margin_not_torchruns_30_s():
    import re

    text = (ROOT / "launch" / "slurm.sh").read_text()
    lead = int(re.search(r"^#SBATCH --signal=B:TERM@(\d+)$", text, re.M).group(1))
    window = int(re.search(r"^export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=\$\{TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-(\d+)\}$", text,
                           re.M).group(1))
    assert (lead, window) == (300, 270) and DEFAULT_S < window < lead
    assert misfit(20, (window, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"), 200) is None  # a 200 s checkpoint write fits
