"""Nothing lost, nothing run: run names and --overwrite, one writer per run folder, verified checkpoints
with fallback, no pickle on load, data fingerprints, stale temporaries, group-readable outputs, NaN stops."""

import errno
import json
import os
import pickle
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from progressive.config import ConfigError, validate
from progressive.methods import Method
from progressive.run import checkpoint as ckpt
from progressive.run.rundir import MARKER, RunLock
from progressive.run.start import Start, decide
from progressive.run.trainer import NonFiniteLoss, Trainer
from tests.train_utils import rows, tiny_cfg

KEYS = ("kind", "step", "phase", "tokens", "flops", "loss", "lr", "val_loss")


def _trajectory(run_dir):
    return [[r.get(k) for k in KEYS] for r in rows(run_dir)]


def _unfinish(run_dir):
    """Make a completed run look like one that died after its last checkpoint (a real SIGKILL is tested in
    test_train_resume.py; here the subject is what --resume does with the checkpoints it finds)."""
    (run_dir / "summary.json").unlink()
    shutil.rmtree(run_dir / "final")


@pytest.mark.parametrize("name", ["..", ".", "a/b", "/tmp", ""])
def test_run_names_are_single_folder_names(tmp_path, name):
    with pytest.raises(ConfigError, match=r"^name: (a run name is one folder name|expected a string)"):
        validate(tiny_cfg(tmp_path, name=name))


def test_overwrite_empties_only_folders_train_py_created(tmp_path):
    foreign = tmp_path / "gpt2-baseline"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("years of work")
    cfg = tiny_cfg(tmp_path, method="baseline", train__steps=2)
    with pytest.raises(FileExistsError, match="not created by train.py"):
        Trainer(cfg, Start("fresh", overwrite=True))
    assert (foreign / "thesis.tex").read_text() == "years of work"
    (foreign / "thesis.tex").unlink()
    Trainer(cfg).run()  # an empty folder is fine; the run marks it as its own
    assert (cfg.run_dir / MARKER).is_file()
    listed = {ln[len("made: "):] for ln in (cfg.run_dir / MARKER).read_text().splitlines() if ln.startswith("made: ")}
    assert {p.name for p in cfg.run_dir.iterdir()} - {MARKER, ".lock"} <= listed  # all it made, on record
    (cfg.run_dir / "notes.txt").write_text("x")  # a user's file left in a finished run: never deleted with it
    with pytest.raises(FileExistsError, match=r"notes.txt was not made by train.py"):
        Trainer(cfg, Start("fresh", overwrite=True))
    assert (cfg.run_dir / "notes.txt").read_text() == "x" and (cfg.run_dir / "summary.json").is_file()
    (cfg.run_dir / "notes.txt").unlink()
    Trainer(cfg, Start("fresh", overwrite=True)).run()
    assert (cfg.run_dir / "final").is_dir()


def test_a_final_folder_that_is_a_link_is_replaced_and_what_it_points_to_kept(tmp_path):
    cfg = tiny_cfg(tmp_path, method="baseline", train__steps=4, train__checkpoint_every=2)
    Trainer(cfg).run()
    _unfinish(cfg.run_dir)
    mine = tmp_path / "my-model"
    mine.mkdir()
    (mine / "weights.bin").write_text("mine")
    (cfg.run_dir / "final").symlink_to(mine)
    Trainer(cfg, decide(cfg.run_dir, True)).run()
    assert (cfg.run_dir / "final").is_dir() and not (cfg.run_dir / "final").is_symlink()
    assert (mine / "weights.bin").read_text() == "mine" and not (cfg.run_dir / ".final.old").exists()


def test_a_second_writer_is_refused_with_the_holders_pid(tmp_path):
    cfg = tiny_cfg(tmp_path, method="baseline", train__steps=2)
    with RunLock(cfg.run_dir):
        with pytest.raises(FileExistsError, match=f"in use by another run \\(pid {os.getpid()} on "):
            Trainer(cfg).run()
    Trainer(cfg, Start("fresh", overwrite=True)).run()  # released: the folder is usable again


def _remake_manifest(folder):
    """What a hand edit followed by a re-hash does: a manifest that vouches for the edited files."""

    files = {n: ckpt._sha256(folder / n) for n in ckpt._files(folder) if n != ckpt.MANIFEST}
    (folder / ckpt.MANIFEST).write_text(json.dumps({"format": ckpt.FORMAT, "sha256": files}))


def _finished_twice_then_unfinished(tmp_path, over):
    """(an uninterrupted reference run, the same run made to look killed after its last checkpoint, that newest
    checkpoint): the setting of the damaged-checkpoint tests."""
    ref = tiny_cfg(tmp_path / "ref", **over)
    Trainer(ref).run()
    cfg = tiny_cfg(tmp_path / "run", **over)
    Trainer(cfg).run()
    _unfinish(cfg.run_dir)
    return ref, cfg, ckpt.list_checkpoints(cfg.run_dir)[-1]


@pytest.mark.parametrize("damage", ["flip_a_byte", "truncate", "torn_state", "extra_file", "flip_a_byte_and_rehash",
                                    "edit_step_and_rehash", "edit_config_and_rehash"])
def test_a_damaged_checkpoint_is_reported_and_the_previous_good_one_resumes_the_same_run(tmp_path, damage, capsys):
    over = dict(method="baseline", train__steps=6, train__checkpoint_every=2, train__keep_checkpoints=2,
                train__eval_every=2)
    ref, cfg, newest = _finished_twice_then_unfinished(tmp_path, over)
    weights = newest / "model.safetensors"
    if damage == "flip_a_byte":
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0x40
        weights.write_bytes(bytes(data))
    elif damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:100])
    elif damage == "torn_state":
        (newest / "state.json").write_text('{"step": 6, "ph')
    elif damage == "flip_a_byte_and_rehash":  # (as an FSDP shard was: it loaded silently)
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0x40
        weights.write_bytes(bytes(data))
        _remake_manifest(newest)
    elif damage == "edit_step_and_rehash":  # it resumed at the wrong step, 3 steps skipped
        import json

        state = json.loads((newest / "state.json").read_text())
        (newest / "state.json").write_text(json.dumps({**state, "step": state["step"] + 3}))
        _remake_manifest(newest)
    elif damage == "edit_config_and_rehash":  # the resume's base config: a size-mismatch traceback, no fallback
        import json

        state = json.loads((newest / "state.json").read_text())
        state["config"]["model"]["hidden_size"] *= 2
        (newest / "state.json").write_text(json.dumps(state))
        _remake_manifest(newest)
    else:
        (newest / "notes.pt").write_bytes(b"not in the manifest")
    if damage == "edit_config_and_rehash":  # as --resume alone does: the base config is the checkpoint's
        from progressive import cli as train_cli

        assert train_cli.main(["--resume", "--name", cfg.name, "--output_dir", cfg.output_dir]) == 0
    else:
        Trainer(cfg, decide(cfg.run_dir, True)).run()
    err = capsys.readouterr().err
    assert f"warning: skipping checkpoint: {newest}" in err
    assert "resuming gpt2-baseline from step 4" in err
    assert _trajectory(ref.run_dir) == _trajectory(cfg.run_dir)  # bit for bit


@pytest.mark.parametrize("note", ['{"note": "the LR looked high here"}', '[1, 2]', '"a line of text"',
                                  '{"kind": "val", "step": "four"}'])
def test_a_line_that_is_not_a_metrics_row_is_skipped_with_a_warning_and_the_run_resumes(tmp_path, capsys, note):
    """A JSON line without ``step`` in metrics.jsonl (a user's note) was ``KeyError: 'step'``, and the run could not
    resume."""
    from progressive.run.tracking import read_metrics

    over = dict(method="baseline", train__steps=6, train__checkpoint_every=2, train__eval_every=2)
    ref, cfg, _ = _finished_twice_then_unfinished(tmp_path, over)
    with open(cfg.run_dir / "metrics.jsonl", "a") as f:
        f.write(note + "\n")
    line = len((cfg.run_dir / "metrics.jsonl").read_text().splitlines())
    Trainer(cfg, decide(cfg.run_dir, True)).run()
    err = capsys.readouterr().err
    assert f"warning: {cfg.run_dir / 'metrics.jsonl'}, line {line}: not a metrics row of this project" in err
    assert note in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()  # the note is kept, never a row
    strip = [[r.get(k) for k in KEYS] for r in read_metrics(cfg.run_dir / "metrics.jsonl")]
    assert strip == _trajectory(ref.run_dir)  # the resumed run is the uninterrupted one


def test_weights_that_do_not_fit_an_older_state_json_are_one_line_naming_the_checkpoint(tmp_path, capsys):
    """A state.json written before it carried a digest of itself, its config edited and the manifest re-made:
    nothing can tell the edit before the weights are loaded; that is one line, not a traceback."""

    from progressive import cli as train_cli

    cfg = tiny_cfg(tmp_path, method="baseline", train__steps=4, train__checkpoint_every=2)
    Trainer(cfg).run()
    _unfinish(cfg.run_dir)
    newest = ckpt.list_checkpoints(cfg.run_dir)[-1]
    state = json.loads((newest / "state.json").read_text())
    state.pop("digest", None)
    state["config"]["model"]["hidden_size"] *= 2
    (newest / "state.json").write_text(json.dumps(state))
    _remake_manifest(newest)
    capsys.readouterr()
    assert train_cli.main(["--resume", "--name", cfg.name, "--output_dir", cfg.output_dir]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: {newest}: its weights do not fit the model that the config in its state.json "
                              "describes (size mismatch for ") and "Traceback" not in "\n".join(err)


@pytest.mark.parametrize("damage", ["missing", "truncated", "pickled"])
def test_a_damaged_fsdp_shard_falls_back_to_the_previous_checkpoint(tmp_path, damage, capsys):
    """A sharded (FSDP2) checkpoint whose shard file is missing, cut short or replaced by a pickle is named and
    skipped (its manifest covers the shards), and the previous one resumes the same run, bit for bit. One
    process: a sharded run under plain python is a group of one."""
    over = dict(method="baseline", train__steps=6, train__checkpoint_every=2, train__keep_checkpoints=2,
                train__eval_every=2, train__fsdp=True)
    ref, cfg, newest = _finished_twice_then_unfinished(tmp_path, over)
    shard = next((newest / "sharded").glob("*.safetensors"))
    if damage == "missing":
        shard.unlink()
    elif damage == "truncated":
        shard.write_bytes(shard.read_bytes()[:64])
    else:
        shard.write_bytes(pickle.dumps({"model": "not tensors"}))
    if damage == "edit_config_and_rehash":  # as --resume alone does: the base config is the checkpoint's
        from progressive import cli as train_cli

        assert train_cli.main(["--resume", "--name", cfg.name, "--output_dir", cfg.output_dir]) == 0
    else:
        Trainer(cfg, decide(cfg.run_dir, True)).run()
    err = capsys.readouterr().err
    assert f"warning: skipping checkpoint: {newest}" in err and "resuming gpt2-baseline from step 4" in err
    assert _trajectory(ref.run_dir) == _trajectory(cfg.run_dir)


def test_rotation_never_deletes_the_newest_good_checkpoint_and_a_nan_stop_names_a_finite_one(
        tmp_path, registered_method):
    class PoisonAfterStep2(Method):
        """Weights become NaN right after step 2's update (its loss was still finite)."""

        name = "poison"

        def after_step(self, step, model):
            if step == 1:
                with torch.no_grad():
                    model.transformer.wte.weight.fill_(float("nan"))

    registered_method("poison", PoisonAfterStep2)
    cfg = tiny_cfg(tmp_path, method="poison", train__steps=6, train__checkpoint_every=1,
                   train__keep_checkpoints=1)
    with pytest.raises(NonFiniteLoss, match=r"last good checkpoint is .*step00000001-phase00 \(verified"):
        Trainer(cfg).run()
    found = ckpt.list_checkpoints(cfg.run_dir)
    assert [p.name for p in found] == ["step00000001-phase00", "step00000002-phase00"]
    assert ckpt.read_state(found[1])["finite"] is False and ckpt.is_good(found[0])


class _Evil:
    """Unpickling this would create ``path``."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_planted_pickle_is_never_unpickled(tmp_path, capsys):
    cfg = tiny_cfg(tmp_path, method="baseline", train__steps=4, train__checkpoint_every=2)
    Trainer(cfg).run()
    _unfinish(cfg.run_dir)
    pwned = tmp_path / "pwned"
    for good in ckpt.list_checkpoints(cfg.run_dir):  # planted beside every good checkpoint
        (good / "optimizer.pt").write_bytes(pickle.dumps(_Evil(pwned)))
    legacy = ckpt.checkpoint_dir(cfg.run_dir) / "step00000009-phase00"  # a newer, format-1 checkpoint
    legacy.mkdir()
    (legacy / "model.pt").write_bytes(pickle.dumps(_Evil(pwned)))
    (legacy / "state.json").write_text('{"step": 9, "phase": 0}')
    with pytest.raises(ckpt.CheckpointError, match="no usable checkpoint"):
        Trainer(cfg, decide(cfg.run_dir, True))
    err = capsys.readouterr().err
    assert "checkpoint format 1 (pickled *.pt files)" in err and "optimizer.pt is not in the manifest" in err
    assert not pwned.exists()


def test_resume_refuses_a_dataset_that_changed_since_the_run_started(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    over = dict(method="baseline", train__steps=4, train__checkpoint_every=2, data__dataset=str(corpus),
                data__max_tokens=None, data__vocab_size=300, data__cache_dir=str(tmp_path / "cache"))
    cfg = tiny_cfg(tmp_path, **over)
    Trainer(cfg).run()
    _unfinish(cfg.run_dir)
    corpus.write_text("a different corpus altogether, with other words in it. " * 400)
    with pytest.raises(ConfigError, match="training data or the tokenizer changed since this run started"):
        Trainer(cfg, decide(cfg.run_dir, True)).run()


def test_stale_temporaries_are_removed_at_start_and_outputs_follow_the_umask(tmp_path, capsys):
    old = os.umask(0o022)
    try:
        cfg = tiny_cfg(tmp_path, method="baseline", train__steps=4, train__checkpoint_every=2)
        Trainer(cfg).run()
        _unfinish(cfg.run_dir)
        stale = ckpt.checkpoint_dir(cfg.run_dir) / ".step00000006-phase00.k2j3.tmp"
        stale.mkdir()
        (stale / "model.safetensors").write_bytes(b"half written")
        Trainer(cfg, decide(cfg.run_dir, True)).run()
        assert not stale.exists() and f"removed {stale}" in capsys.readouterr().err
        for p in [cfg.run_dir / "final", *ckpt.list_checkpoints(cfg.run_dir)]:
            assert stat.S_IMODE(p.stat().st_mode) == 0o755, p
            for f in p.iterdir():
                assert stat.S_IMODE(f.stat().st_mode) == 0o644, f
    finally:
        os.umask(old)


def test_resume_takes_its_config_from_the_checkpoint_it_resumes_not_a_damaged_newer_one(tmp_path, capsys):
    """A state.json edited without re-hashing was skipped, but its config was still the base of ``--resume``,
    which then refused a config diff nobody made."""

    from progressive import cli as train_cli

    cfg = tiny_cfg(tmp_path, method="baseline", train__steps=6, train__checkpoint_every=2, train__keep_checkpoints=2)
    Trainer(cfg).run()
    _unfinish(cfg.run_dir)
    newest = ckpt.list_checkpoints(cfg.run_dir)[-1]
    state = json.loads((newest / "state.json").read_text())
    state["config"]["train"]["batch_size"] = 4  # a setting a resume may not change
    (newest / "state.json").write_text(json.dumps(state))
    code = train_cli.main(["--resume", "--name", cfg.name, "--output_dir", cfg.output_dir])
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"warning: skipping checkpoint: {newest}" in err and "resuming gpt2-baseline from step 4" in err


def test_without_flock_the_lock_is_an_exclusive_file_and_a_dead_holders_is_taken_over(tmp_path, monkeypatch, capsys):
    """On a file system without flock (flock raises ENOLCK), the run lock is ``.lock.held``, created
    exclusively: a second writer is refused naming the holder, release removes it, and one left by a process
    of this host that no longer runs is taken over. Said in one line which lock is in use."""

    import progressive.run.rundir as rd

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(rd.fcntl, "flock", no_flock)
    run = tmp_path / "run"
    first = rd.RunLock(run).acquire()
    held = run / rd.HELD
    assert held.read_text().strip() == f"pid {os.getpid()} on {socket.gethostname()}"
    assert "does not support flock" in capsys.readouterr().err
    with pytest.raises(FileExistsError, match=f"in use by another run \\(pid {os.getpid()} on "):
        rd.RunLock(run).acquire()
    first.release()
    assert not held.exists()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    held.write_text(f"pid {int(dead.stdout)} on {socket.gethostname()}\n")  # a holder killed before releasing
    with rd.RunLock(run):
        assert held.read_text().startswith(f"pid {os.getpid()} ")
    held.write_text("pid 1 on another-host\n")  # cannot be checked from here: refused, with the way out
    with pytest.raises(FileExistsError, match=r"if that run is gone, remove .*\.lock\.held"):
        rd.RunLock(run).acquire()


# ---------------------------------------------------------------------------------------------------------------
# One writer per folder, from the decision to the end: the command takes the run's lock before it reads the run
# folder to decide how it starts, and a comparison holds its folder's lock for its whole life.

def _recipe(cfg):
    from progressive.config import dump_yaml

    path = Path(cfg.output_dir) / f"{cfg.name}.yaml"
    path.write_text(dump_yaml(cfg))
    return path


def _in_use(err: str, run_dir) -> None:
    """The command said, in one line and nothing else, that ``run_dir`` is in use by this test's process."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: {run_dir} is in use by another run (pid {os.getpid()} on "), err


def test_a_lock_handed_on_is_taken_over_once_by_this_process_and_never_otherwise(tmp_path):
    """The command's plan decides under the lock and hands it on; the trainer (or comparison) that carries the plan
    out takes it over, with no moment between when another writer could take it. Nothing else shares it."""
    import fcntl

    run = tmp_path / "run"
    planned = RunLock(run).acquire()
    with pytest.raises(FileExistsError, match="in use by another run"):
        RunLock(run).acquire()  # not handed on: a second writer, even in this process
    planned.hand_on()
    (tmp_path / "alias").symlink_to(tmp_path)
    trainer = RunLock(tmp_path / "alias" / "run").acquire()  # the same folder, however it is named
    assert trainer.held and not planned.held
    with open(run / ".lock") as f, pytest.raises(BlockingIOError):
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # still held, by the one that took it over
    with pytest.raises(FileExistsError, match="in use by another run"):
        RunLock(run).acquire()  # handed on once
    planned.release()  # the command's end: a no-op, the trainer holds it
    assert trainer.held
    trainer.release()
    planned.hand_on()  # released: nothing to hand on
    RunLock(run).acquire().release()
    late = RunLock(run).acquire()
    late.hand_on()
    late.release()  # let go before anyone took it over: handed on no more
    other = RunLock(run).acquire()
    assert other.held and not late.held
    other.release()


def test_a_second_resume_of_a_live_run_is_refused_before_it_reads_a_checkpoint(tmp_path, monkeypatch):
    """A second ``--resume`` of a run that trains read the checkpoints before the lock, and said "No such file
    ... state.json": the live run was pruning the one it had found."""
    from tests.train_utils import train_here

    cfg = tiny_cfg(tmp_path, method="baseline", train__steps=6, train__checkpoint_every=2)
    Trainer(cfg).run()
    _unfinish(cfg.run_dir)
    read = []
    listed = ckpt.list_checkpoints

    def pruned(path):  # the live run deleted it between its listing and this read
        read.append(path)
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(Path(path) / ckpt.STATE))

    monkeypatch.setattr(ckpt, "list_checkpoints", lambda run_dir: read.append(run_dir) or listed(run_dir))
    monkeypatch.setattr(ckpt, "read_state", pruned)
    with RunLock(cfg.run_dir):  # the live run
        proc = train_here(None, "--resume", "--name", cfg.name, "--output_dir", cfg.output_dir)
        assert proc.returncode == 2
        _in_use(proc.stderr, cfg.run_dir)
        assert read == []  # nothing of the folder was read before the lock
        proc = train_here(_recipe(cfg), "--resume", "auto")  # --resume auto decides from the checkpoints too
        assert proc.returncode == 2
        _in_use(proc.stderr, cfg.run_dir)
        assert read == []


def test_a_comparison_over_a_live_run_is_refused_and_leaves_its_marker_and_config(tmp_path):
    """``--name X --compare baseline,vcycle --overwrite`` while run X trained rewrote X's marker and config.yaml
    beside the live writer; X's own resume command then failed."""
    from progressive.report.compare import compare
    from tests.train_utils import train_here

    cfg = tiny_cfg(tmp_path, method="baseline", train__steps=4, train__checkpoint_every=2)
    Trainer(cfg).run()
    _unfinish(cfg.run_dir)
    before = {n: (cfg.run_dir / n).read_bytes() for n in (MARKER, "config.yaml")}
    with RunLock(cfg.run_dir):  # run X, training
        proc = train_here(_recipe(cfg), "--compare", "baseline,vcycle", "--overwrite")
        assert proc.returncode == 2
        _in_use(proc.stderr, cfg.run_dir)
        with pytest.raises(FileExistsError, match=f"^{cfg.run_dir} is in use by another run \\(pid {os.getpid()} "):
            compare(cfg, ["baseline", "vcycle"], overwrite=True)  # called as a library: its own lock
        with pytest.raises(FileExistsError, match=f"^{cfg.run_dir} is in use by another run"):
            compare(cfg, ["baseline", "vcycle"], resume=True)
    assert {n: (cfg.run_dir / n).read_bytes() for n in before} == before
    Trainer(cfg, decide(cfg.run_dir, True)).run()  # X's own resume still works


def test_a_comparison_holds_its_folders_lock_for_its_whole_life(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import progressive.run.loop
    from progressive.report.compare import compare

    cfg = tiny_cfg(tmp_path, method="baseline", name="cmp", train__steps=4, train__eval_every=2,
                   train__checkpoint_every=2)
    seen = []

    def another_writer(step, rank, **kw):  # after every step of both methods: is the comparison's folder free?
        try:
            RunLock(cfg.run_dir).acquire().release()
            seen.append("free")
        except FileExistsError as e:
            seen.append("in use" if "in use by another run" in str(e) else str(e))

    monkeypatch.setattr(progressive.run.loop, "armed", lambda: SimpleNamespace(after_step=another_writer))
    compare(cfg, ["baseline", "vcycle"])
    assert len(seen) >= 8 and set(seen) == {"in use"}, seen
    RunLock(cfg.run_dir).acquire().release()  # let go at the end
