"""A run owns only what it made: the record in a run folder's marker lists the entries the run itself created, as
it creates them, across resumes; ``--overwrite`` (train.py's and the operators') deletes only those and refuses,
in one line naming the entry, a folder holding anything else. Bench output folders name what they write."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

import progressive.run.trainer
from common.ownership import OUTPUT, mark
from operators.cli import main as operators_cli
from progressive.run.rundir import MARKER
from progressive.run.stop import Stopped
from progressive.run.trainer import SIGNAL_ENV, Trainer
from tests.train_utils import ROOT, tiny_cfg

OVER = dict(method="baseline", train__steps=6, train__checkpoint_every=2, train__eval_every=3)


def _stopped(tmp_path, monkeypatch, **extra):
    """A run stopped by a signal after step 3 (checkpoint at step 3): the setting of the audit's probes."""
    cfg = tiny_cfg(tmp_path, **{**OVER, **extra})
    monkeypatch.setenv(SIGNAL_ENV, "3:SIGINT")
    with pytest.raises(Stopped):
        Trainer(cfg).run()
    monkeypatch.delenv(SIGNAL_ENV)
    return cfg


def _refused(cfg, entry: str) -> None:
    """--overwrite is refused in one line naming ``entry``, and leaves it where it was."""
    before = {p.name for p in cfg.run_dir.iterdir()}
    with pytest.raises(FileExistsError, match=rf"^{cfg.run_dir / entry}.* was not made by train.py") as e:
        Trainer(cfg, overwrite=True)
    assert "\n" not in str(e.value)
    assert {p.name for p in cfg.run_dir.iterdir()} == before


def test_a_users_file_put_into_a_stopped_run_is_never_recorded_by_the_resume_nor_deleted(tmp_path, monkeypatch):
    cfg = _stopped(tmp_path, monkeypatch)
    (cfg.run_dir / "notes.md").write_text("my notes")
    Trainer(cfg, resume=True).run()  # the resume once took the folder's listing as its record
    assert "notes.md" not in (cfg.run_dir / MARKER).read_text()
    _refused(cfg, "notes.md")
    assert (cfg.run_dir / "notes.md").read_text() == "my notes"
    (cfg.run_dir / "notes.md").unlink()
    Trainer(cfg, overwrite=True).run()  # what the run made, and only that, is deleted


def test_a_file_written_into_the_folder_while_the_run_trains_is_never_recorded(tmp_path, monkeypatch):

    def user_writes(step, rank, **kw):
        if step == 1:  # before the first checkpoint (step 2), which once recorded the folder's listing
            (cfg.run_dir / "draft.txt").write_text("mine")

    # the trainer's after-step seam (progressive.run.faults.armed), here for a user's write instead of a fault
    monkeypatch.setattr(progressive.run.trainer, "armed", lambda: SimpleNamespace(after_step=user_writes))
    cfg = tiny_cfg(tmp_path, **OVER)
    Trainer(cfg).run()
    _refused(cfg, "draft.txt")
    assert (cfg.run_dir / "draft.txt").read_text() == "mine"


@pytest.mark.parametrize("name", ["final", ".draft.tmp", "loss_vs_flops.png"])
def test_an_entry_with_the_runs_own_kind_of_name_that_the_record_does_not_list_is_kept(tmp_path, monkeypatch,
                                                                                       name):
    """Names the run writes (final/, the plots) or looks like a leftover of (``.*.tmp``) were deleted by
    --overwrite, and replaced or removed by a resume."""
    cfg = _stopped(tmp_path, monkeypatch, train__plots=name.endswith(".png"))
    entry = cfg.run_dir / name
    if name == "final":
        entry.mkdir()
        (entry / "notes.txt").write_text("mine")
    else:
        entry.write_text("mine")
    _refused(cfg, name)
    if name in ("final", "loss_vs_flops.png"):  # the resume would replace it at its end
        with pytest.raises(FileExistsError, match=rf"^{entry} was not made by this run"):
            Trainer(cfg, resume=True).run()
    else:  # the resume cleans only leftovers of its own writes
        Trainer(cfg, resume=True).run()
    assert (entry / "notes.txt" if name == "final" else entry).read_text() == "mine"


def test_a_run_that_died_before_its_first_checkpoint_keeps_a_record_and_a_folder_without_one_is_refused(
        tmp_path, monkeypatch):
    """A run killed while its data loaded had recorded nothing, and --overwrite emptied its folder whole."""
    def killed(*a, **k):
        raise RuntimeError("killed while loading data")

    monkeypatch.setattr(progressive.run.trainer.RunData, "load", killed)
    cfg = tiny_cfg(tmp_path, **OVER)
    with pytest.raises(RuntimeError, match="killed"):
        Trainer(cfg).run()
    monkeypatch.undo()
    (cfg.run_dir / "notes.md").write_text("mine")
    _refused(cfg, "notes.md")
    (cfg.run_dir / "notes.md").unlink()
    (cfg.run_dir / MARKER).write_text("created by train.py\n")  # a marker without a record (an older version's)
    with pytest.raises(FileExistsError, match=r"and no record of what train.py made there"):
        Trainer(cfg, overwrite=True)
    assert (cfg.run_dir / "config.yaml").is_file()


def test_stale_temporaries_are_never_cleaned_through_a_link(tmp_path, monkeypatch):
    """A checkpoints/ moved to another disk and linked back had that disk's ``.backup.old`` removed at resume."""
    cfg = _stopped(tmp_path, monkeypatch)
    disk = tmp_path / "big-disk"
    shutil.move(str(cfg.run_dir / "checkpoints"), disk)
    (cfg.run_dir / "checkpoints").symlink_to(disk)
    (disk / ".backup.old").write_text("mine")
    (disk / ".step00000009-phase00.x1y2z3w4.tmp").mkdir()  # even one that looks like a torn checkpoint
    Trainer(cfg, resume=True).run()
    assert (disk / ".backup.old").read_text() == "mine" and (disk / ".step00000009-phase00.x1y2z3w4.tmp").is_dir()
    Trainer(cfg, overwrite=True).run()  # the link is the run's entry: it goes, what it points to stays
    assert (disk / ".backup.old").read_text() == "mine" and any(p.name.startswith("step") for p in disk.iterdir())


def test_the_lock_is_never_written_over_a_users_file_in_a_folder_that_is_not_a_runs(tmp_path):
    from progressive.run.rundir import RunLock

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / ".lock").write_text("my lock notes")
    cfg = tiny_cfg(tmp_path, **OVER, name="mine")
    with pytest.raises(FileExistsError, match=r"was not created by train.py .*it holds \.lock"):
        Trainer(cfg)
    with pytest.raises(FileExistsError, match=r"\.lock exists in a folder that train.py did not create"):
        RunLock(mine).acquire()  # created with O_EXCL there
    assert (mine / ".lock").read_text() == "my lock notes"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path_factory.mktemp("ckpt") / "base"
    GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=64, bos_token_id=0,
                               eos_token_id=0)).save_pretrained(folder)
    return folder


def test_a_bench_never_marks_a_folder_of_the_users_and_the_operators_never_replace_a_folder_they_did_not_write(
        tmp_path, capsys, checkpoint):
    """``bench.frontier --out FOLDER`` marked any folder as its own (it wrote ``*``), and the operators' --overwrite
    then deleted what the user kept there."""
    from bench.frontier import run as frontier

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    argv = ["--smoke", "--workers", "0", "--max_jobs", "0", "--results", str(tmp_path / "res")]
    with pytest.raises(SystemExit) as e:
        frontier.main([*argv, "--out", str(mine)])
    assert e.value.code == 2
    assert "mine exists and was not created by python -m bench.frontier" in capsys.readouterr().err
    assert sorted(p.name for p in mine.iterdir()) == ["thesis.tex"]
    mark(mine, OUTPUT, "python -m bench.frontier")  # a bench's folder (or one marked before this rule)
    assert operators_cli(["coalesce", str(checkpoint), str(mine), "--overwrite"]) == 2
    assert "was created by python -m bench.frontier, not by python -m operators" in capsys.readouterr().err
    assert (mine / "thesis.tex").read_text() == "years of work"


def test_the_operators_overwrite_only_what_their_record_lists(tmp_path, capsys, checkpoint):
    out = tmp_path / "small"
    assert operators_cli(["coalesce", str(checkpoint), str(out)]) == 0
    assert operators_cli(["coalesce", str(checkpoint), str(out), "--overwrite"]) == 0  # all of it its own
    (out / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert operators_cli(["coalesce", str(checkpoint), str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{out / 'notes.txt'} was not made by python -m operators" in err
    assert (out / "notes.txt").read_text() == "mine"
    (out / "notes.txt").unlink()
    (out / OUTPUT).write_text("created by python -m operators; ...\n")  # an output written before records
    assert operators_cli(["coalesce", str(checkpoint), str(out), "--overwrite"]) == 2
    assert "no record of what python -m operators made there" in capsys.readouterr().err


def test_benches_name_what_they_write():
    """No bench passes a pattern that matches any name (which made any folder look like its own)."""

    from common.ownership import prepare_output_folder

    with pytest.raises(ValueError, match="matches any name"):
        prepare_output_folder(Path("unused"), "a bench", ["*"])
    for path in (ROOT / "bench").rglob("*.py"):
        for call in re.findall(r"output_folder\([^)]*\)", path.read_text()):
            assert '"*"' not in call and "'*'" not in call, (path, call)


def test_a_resumed_run_records_only_what_it_makes_across_resumes(tmp_path, monkeypatch):
    cfg = _stopped(tmp_path, monkeypatch)
    first = (cfg.run_dir / MARKER).read_text().splitlines()
    Trainer(cfg, resume=True).run()
    lines = (cfg.run_dir / MARKER).read_text().splitlines()
    assert lines[:len(first)] == first  # appended to, never rewritten
    made = {ln.removeprefix("made: ") for ln in lines if ln.startswith("made: ")}
    assert made == {"config.yaml", "checkpoints", "metrics.jsonl", "final", "summary.json"}
