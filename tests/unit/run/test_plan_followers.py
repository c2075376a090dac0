"""A resume under several processes is planned by the main process alone, under the run's lock: the others take
its plan (methods, decision, saved config) through the launch's store and never read the run folder themselves,
whose checkpoints a live run may be pruning until the main process holds the lock (progressive/run/start.py,
progressive/run/told.py).

The fast tests play the main process and a follower one after the other in this process, the launch's store an
in-process one; the slow test launches both under torchrun and watches what each process opens (Python's audit
hooks, as tests/integration/test_two_nodes.py does).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from progressive.cli import DEFAULT_CONFIG
from progressive.config import load_config
from progressive.run import checkpoint as ckpt
from progressive.run import rundir, told
from progressive.run.rundir import RunLock
from progressive.run.start import Start, plan_run
from progressive.run.trainer import Trainer
from tests.procs import run_tree
from tests.train_utils import ROOT, rows, tiny_cfg


def _stopped_run(tmp_path: Path):
    """A tiny run that died after its last checkpoint (step 4 of 6): what --resume continues."""
    cfg = tiny_cfg(tmp_path, method="baseline", train__cpu=True, train__steps=4, train__checkpoint_every=2)
    Trainer(cfg).run()
    (cfg.run_dir / "summary.json").unlink()
    shutil.rmtree(cfg.run_dir / "final")
    return cfg


@pytest.fixture
def launch(monkeypatch):
    """Two processes of a torchrun launch played in turn: ``be(rank)`` makes this process that rank (its store the
    launch's one, shared; its count of values told reset, as a process of its own starts with none)."""
    import torch.distributed as dist

    store = dist.HashStore()
    monkeypatch.setattr(told, "open_store", lambda env=None: store)

    def be(rank: int) -> None:  # (from here on: this process's own run above trained as one process)
        for key, value in {"WORLD_SIZE": "2", "RANK": str(rank), "TORCHELASTIC_RUN_ID": "test",
                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setattr(told, "_COUNT", [0])

    return be


def _no_folder_reads(monkeypatch) -> list:
    """Make every read of a run folder's checkpoints or record fail, noting it (the reads a follower made)."""
    seen: list = []

    def read(name):
        def refuse(*args, **kwargs):
            seen.append((name, args))
            raise AssertionError(f"a follower read the run folder: {name}{args}")
        return refuse

    for name in ("list_checkpoints", "latest_good", "resume_point", "read_state"):
        monkeypatch.setattr(ckpt, name, read(name))
    monkeypatch.setattr(rundir, "look", read("look"))  # the record's one read (a comparison's methods)
    return seen


def test_a_follower_takes_the_main_processs_plan_and_never_reads_the_run_folder(tmp_path, monkeypatch, launch):
    """``--resume`` without ``--config``: the follower read the newest checkpoint for its config before the main
    process held the run's lock (a live run pruning it made that a "No such file ... state.json")."""
    cfg = _stopped_run(tmp_path)
    overrides = {"name": cfg.name, "output_dir": str(cfg.output_dir)}  # what the command line gives
    recipe = load_config(DEFAULT_CONFIG, overrides)  # the default recipe: not the run's (a 4x128 V-cycle)
    launch(0)
    main = plan_run(recipe, overrides, True, False, None, False)
    main.release()
    assert main.start.how == "resume" and main.cfg.method.name == "baseline" and main.base is not None
    launch(1)
    seen = _no_folder_reads(monkeypatch)
    follower = plan_run(recipe, overrides, True, False, None, False)
    assert seen == []
    assert follower.cfg == main.cfg and follower.base == main.base and follower.lock is None
    assert (follower.methods, follower.resume, follower.overwrite) == (main.methods, True, False)
    assert follower.start == Start("follow")  # its checkpoint: the main process's, told to every process (agree)


def test_a_follower_leaves_quietly_when_the_main_process_refuses_to_plan(tmp_path, monkeypatch, launch):
    """A live run holds the folder: the main process says so in its one line; the follower reads nothing and ends
    with no message of its own (it read the checkpoints, and then waited for a process group that never came)."""
    cfg = _stopped_run(tmp_path)
    overrides = {"name": cfg.name, "output_dir": str(cfg.output_dir)}
    recipe = load_config(DEFAULT_CONFIG, overrides)
    with RunLock(cfg.run_dir):  # the live run
        launch(0)
        with pytest.raises(FileExistsError, match="is in use by another run"):
            plan_run(recipe, overrides, True, False, None, False)
        launch(1)
        seen = _no_folder_reads(monkeypatch)
        with pytest.raises(FileExistsError) as refused:
            plan_run(recipe, overrides, "auto", False, None, False)
        assert str(refused.value) == "" and seen == []


def test_plans_told_one_after_the_other_are_read_in_the_same_order(launch):
    """A process that plans several runs (a launch of tests/train_many.py) reads each plan under its own key."""
    import torch.distributed as dist

    store = dist.HashStore()
    launch(0)
    told.publish(store, {"run": 1})
    told.publish(store, {"run": 2})
    launch(1)
    assert [told.wait(store, 5, None), told.wait(store, 5, None)] == [{"run": 1}, {"run": 2}]


_AUDIT = textwrap.dedent("""
    import os, sys
    _root, _log = os.environ["GROWTRAIN_AUDIT_ROOT"], os.environ["GROWTRAIN_AUDIT_LOG"]
    _busy = []

    def _hook(event, args):
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)) and not _busy:
            path = os.path.abspath(os.fsdecode(args[0]))
            if path.startswith(_root):
                _busy.append(1)  # the log's own open is an event too
                with open(f"{_log}.{os.getpid()}", "a") as f:
                    f.write(f"{os.environ.get('RANK', '-')}\\t{path}\\n")
                _busy.clear()

    sys.addaudithook(_hook)
""")


def _opened(tmp_path: Path, log: str) -> set[tuple[str, str]]:
    """(rank, path) of every file opened under the audited folder by the processes of the launch ``log``."""
    return {tuple(line.split("\t")) for p in tmp_path.glob(f"{log}.*") for line in p.read_text().splitlines()}


@pytest.mark.slow
def test_under_torchrun_no_process_reads_the_checkpoints_of_a_live_run(tmp_path):
    """``torchrun ... train.py --resume --name X`` (no --config) while run X trains: rank 1 opened X's checkpoints
    before its main process was refused; now no process opens one, the launch says which run holds the folder in
    one line (rank 1, waiting in a barrier for it, once printed gloo's "Connection reset by peer" traceback), and the
    same launch once the folder is free resumes on both processes from the main one's plan."""
    cfg = _stopped_run(tmp_path)
    hook = tmp_path / "audit"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_AUDIT)
    checkpoints = (cfg.run_dir / "checkpoints").resolve()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), str(ROOT)]),
           "GROWTRAIN_AUDIT_ROOT": str(checkpoints)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "train.py"), "--resume", "--name", cfg.name, "--output_dir", str(cfg.output_dir)]
    with RunLock(cfg.run_dir):  # the live run
        proc = run_tree(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                        env={**env, "GROWTRAIN_AUDIT_LOG": str(tmp_path / "live")})
    assert proc.returncode != 0
    errors = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and f"is in use by another run (pid {os.getpid()} on " in errors[0], proc.stderr[-3000:]
    workers = proc.stderr.split("Traceback (most recent call last):\n  File \"<frozen runpy>\"")[0]  # not torchrun's
    assert "Traceback" not in workers, proc.stderr[-3000:]
    assert "[rank1]" not in proc.stderr and "Connection reset" not in proc.stderr, proc.stderr[-3000:]
    assert "state.json" not in proc.stderr and "resuming" not in proc.stderr, proc.stderr[-3000:]
    assert _opened(tmp_path, "live") == set()  # no process read a checkpoint of the live run
    proc = run_tree(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                    env={**env, "GROWTRAIN_AUDIT_LOG": str(tmp_path / "free")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {rank for rank, _ in _opened(tmp_path, "free")} == {"0", "1"}  # both resumed from the checkpoint
    assert json.loads((cfg.run_dir / "summary.json").read_text())["world_size"] == 2
    assert [r["step"] for r in rows(cfg.run_dir, "train")] == [1, 2, 3, 4]
