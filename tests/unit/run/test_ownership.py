"""A run owns only what it made: the record in a run folder's marker lists the entries the run itself created, as
it creates them, across resumes; ``--overwrite`` (train.py's and the operators') deletes only those and refuses,
in one line naming the entry, a folder holding anything else. Bench output folders name what they write."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

import progressive.run.loop
import progressive.run.trainer
from common.ownership import OUTPUT, mark
from operators.cli import main as operators_cli
from progressive.run.rundir import MARKER
from progressive.run.start import Start, decide
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
        Trainer(cfg, Start("fresh", overwrite=True))
    assert "\n" not in str(e.value)
    assert {p.name for p in cfg.run_dir.iterdir()} == before


def test_a_users_file_put_into_a_stopped_run_is_never_recorded_by_the_resume_nor_deleted(tmp_path, monkeypatch):
    cfg = _stopped(tmp_path, monkeypatch)
    (cfg.run_dir / "notes.md").write_text("my notes")
    Trainer(cfg, decide(cfg.run_dir, True)).run()  # the resume once took the folder's listing as its record
    assert "notes.md" not in (cfg.run_dir / MARKER).read_text()
    _refused(cfg, "notes.md")
    assert (cfg.run_dir / "notes.md").read_text() == "my notes"
    (cfg.run_dir / "notes.md").unlink()
    Trainer(cfg, Start("fresh", overwrite=True)).run()  # what the run made, and only that, is deleted


def test_a_file_written_into_the_folder_while_the_run_trains_is_never_recorded(tmp_path, monkeypatch):

    def user_writes(step, rank, **kw):
        if step == 1:  # before the first checkpoint (step 2), which once recorded the folder's listing
            (cfg.run_dir / "draft.txt").write_text("mine")

    # the trainer's after-step seam (progressive.run.faults.armed), here for a user's write instead of a fault
    monkeypatch.setattr(progressive.run.loop, "armed", lambda: SimpleNamespace(after_step=user_writes))
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
            Trainer(cfg, decide(cfg.run_dir, True)).run()
    else:  # the resume cleans only leftovers of its own writes
        Trainer(cfg, decide(cfg.run_dir, True)).run()
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
        Trainer(cfg, Start("fresh", overwrite=True))
    assert (cfg.run_dir / "config.yaml").is_file()


def test_stale_temporaries_are_never_cleaned_through_a_link(tmp_path, monkeypatch):
    """A checkpoints/ moved to another disk and linked back had that disk's ``.backup.old`` removed at resume."""
    cfg = _stopped(tmp_path, monkeypatch)
    disk = tmp_path / "big-disk"
    shutil.move(str(cfg.run_dir / "checkpoints"), disk)
    (cfg.run_dir / "checkpoints").symlink_to(disk)
    (disk / ".backup.old").write_text("mine")
    (disk / ".step00000009-phase00.x1y2z3w4.tmp").mkdir()  # even one that looks like a torn checkpoint
    Trainer(cfg, decide(cfg.run_dir, True)).run()
    assert (disk / ".backup.old").read_text() == "mine" and (disk / ".step00000009-phase00.x1y2z3w4.tmp").is_dir()
    Trainer(cfg, Start("fresh", overwrite=True)).run()  # the link is the run's entry: it goes, what it points to stays
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
    Trainer(cfg, decide(cfg.run_dir, True)).run()
    lines = (cfg.run_dir / MARKER).read_text().splitlines()
    assert lines[:len(first)] == first  # appended to, never rewritten
    made = {ln.removeprefix("made: ") for ln in lines if ln.startswith("made: ")}
    assert {m for m in made if "/" not in m} == {"config.yaml", "checkpoints", "metrics.jsonl", "final", "summary.json"}
    assert {m for m in made if "/" in m} == {f"final/{p.name}" for p in (cfg.run_dir / "final").iterdir()}


# ---------------------------------------------------------------------------------------------------------------
# At every depth: final/ is written whole and its files recorded; a checkpoint's files are its manifest's; a
# comparison's method runs keep records of their own. Nothing inside a recorded folder that the run did not write
# is deleted or replaced.

def _finished(tmp_path, **extra):
    cfg = tiny_cfg(tmp_path, **{**OVER, **extra})
    Trainer(cfg).run()
    return cfg


def test_overwrite_keeps_a_model_card_and_an_eval_result_the_run_did_not_write_inside_final(tmp_path):
    """``final`` was on the record, so --overwrite removed it whole: a model card and the JSON that
    ``python -m eval.zeroshot <run>/final`` writes there by default went with it."""
    cfg = _finished(tmp_path)
    (cfg.run_dir / "final" / "README.md").write_text("my model card")
    (cfg.run_dir / "final" / "eval_zeroshot.json").write_text("{}")
    before = sorted(p.relative_to(cfg.run_dir).as_posix() for p in cfg.run_dir.rglob("*"))
    with pytest.raises(FileExistsError, match=rf"^{cfg.run_dir / 'final' / 'README.md'} \(and 1 more: "
                                              r"final/eval_zeroshot.json\) was not made by train.py") as e:
        Trainer(cfg, Start("fresh", overwrite=True))
    assert "\n" not in str(e.value)
    assert sorted(p.relative_to(cfg.run_dir).as_posix() for p in cfg.run_dir.rglob("*")) == before
    assert (cfg.run_dir / "final" / "README.md").read_text() == "my model card"
    (cfg.run_dir / "final" / "README.md").unlink()
    (cfg.run_dir / "final" / "eval_zeroshot.json").unlink()
    Trainer(cfg, Start("fresh", overwrite=True)).run()  # final/ holds only what the run wrote: replaced
    assert sorted(p.name for p in (cfg.run_dir / "final").iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


def test_the_files_of_final_are_recorded_as_the_run_writes_them_and_once(tmp_path, monkeypatch):
    cfg = _stopped(tmp_path, monkeypatch)
    Trainer(cfg, decide(cfg.run_dir, True)).run()
    lines = (cfg.run_dir / MARKER).read_text().splitlines()
    inside = sorted(ln.removeprefix("made: final/") for ln in lines if ln.startswith("made: final/"))
    assert inside == sorted(p.name for p in (cfg.run_dir / "final").iterdir())
    (cfg.run_dir / "summary.json").unlink()  # the same final/ written again by a resume: not recorded twice
    Trainer(cfg, decide(cfg.run_dir, True)).run()
    assert (cfg.run_dir / MARKER).read_text().splitlines() == lines


@pytest.mark.parametrize("where, named", [
    ("checkpoints/{ckpt}/eval_zeroshot.json", "checkpoints/{ckpt}/eval_zeroshot.json"),
    ("checkpoints/notes.txt", "checkpoints/notes.txt"),
    ("checkpoints/{ckpt}/sharded/extra.bin", "checkpoints/{ckpt}/sharded"),  # a folder the manifest leads nowhere
    ("checkpoints/.backup/notes.txt", "checkpoints/.backup"),
    ("checkpoints/step00000099-phase00/model.safetensors", "checkpoints/step00000099-phase00")])
def test_overwrite_keeps_what_the_run_did_not_write_inside_its_checkpoints(tmp_path, monkeypatch, where, named):
    """A checkpoint's files are the ones its manifest lists; a folder with a checkpoint's name but no manifest
    was not written by this version of the run (it renames a checkpoint into place only once its manifest is
    written), so which of its files are the run's is not known."""
    cfg = _stopped(tmp_path, monkeypatch)
    entry = cfg.run_dir / where.format(ckpt="step00000003-phase00")
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.write_text("mine")
    if "99" in named:
        with pytest.raises(FileExistsError, match=rf"^{cfg.run_dir / named} holds files train.py has no record of"):
            Trainer(cfg, Start("fresh", overwrite=True))
    else:
        _refused(cfg, named.format(ckpt="step00000003-phase00"))
    assert entry.read_text() == "mine"


def test_overwrite_deletes_only_the_recorded_files_even_past_its_check(tmp_path, monkeypatch):
    """The check refuses a folder holding anything else; the deletion itself removes only recorded files (and
    the folders they leave empty), so a file that arrives between the two is kept, with its folder."""
    import progressive.run.rundir as rd

    cfg = _finished(tmp_path)
    monkeypatch.setattr(rd, "check_can_start", lambda *a, **k: None)  # as if the files came after the check
    (cfg.run_dir / "final" / "README.md").write_text("my model card")
    ckpt = next((cfg.run_dir / "checkpoints").iterdir())
    (ckpt / "eval.json").write_text("{}")
    rd.start_fresh(cfg.run_dir)
    left = sorted(p.relative_to(cfg.run_dir).as_posix() for p in cfg.run_dir.rglob("*"))
    assert left == [".growtrain-run", ".lock", "checkpoints", f"checkpoints/{ckpt.name}",
                    f"checkpoints/{ckpt.name}/eval.json", "final", "final/README.md"]
    assert (cfg.run_dir / MARKER).read_text().count("made: ") == 0  # a new record: what is left is not the run's


def test_a_resume_never_replaces_a_final_folder_holding_a_file_it_did_not_write(tmp_path):
    cfg = _finished(tmp_path)
    (cfg.run_dir / "summary.json").unlink()  # a run that died after writing final/, before its summary
    (cfg.run_dir / "final" / "README.md").write_text("my model card")
    with pytest.raises(FileExistsError, match=rf"^{cfg.run_dir / 'final' / 'README.md'} was not made by this run"):
        Trainer(cfg, decide(cfg.run_dir, True)).run()
    assert (cfg.run_dir / "final" / "README.md").read_text() == "my model card"


def test_the_final_outputs_are_not_written_over_a_file_put_into_final_while_the_run_trains(tmp_path, monkeypatch):
    cfg = _finished(tmp_path, train__checkpoint_every=4)  # the resume trains steps 5 and 6
    (cfg.run_dir / "summary.json").unlink()

    def user_writes(step, rank, **kw):
        if step == 5:
            (cfg.run_dir / "final" / "README.md").write_text("my model card")

    monkeypatch.setattr(progressive.run.loop, "armed", lambda: SimpleNamespace(after_step=user_writes))
    with pytest.raises(FileExistsError, match=rf"^{cfg.run_dir / 'final' / 'README.md'} was not made by this run"):
        Trainer(cfg, decide(cfg.run_dir, True)).run()
    assert (cfg.run_dir / "final" / "README.md").read_text() == "my model card"
    assert (cfg.run_dir / "final" / "model.safetensors").is_file()


def test_a_final_folder_whose_files_were_never_recorded_is_refused_not_deleted_whole(tmp_path):
    """A run folder written before records listed final/'s files (its record names ``final`` alone)."""
    cfg = _finished(tmp_path)
    marker = cfg.run_dir / MARKER
    marker.write_text("".join(ln + "\n" for ln in marker.read_text().splitlines() if "made: final/" not in ln))
    with pytest.raises(FileExistsError, match=rf"^{cfg.run_dir / 'final'} holds files train.py has no record of"):
        Trainer(cfg, Start("fresh", overwrite=True))
    assert (cfg.run_dir / "final" / "model.safetensors").is_file()


def test_a_comparisons_overwrite_keeps_a_file_inside_one_of_its_method_runs(tmp_path):
    """A comparison's method folders are run folders with records of their own, checked at every depth too."""
    from common.ownership import RUN
    from progressive.run import rundir

    root = tmp_path / "cmp"
    mark(root, RUN, "train.py --compare baseline,vcycle", made=["config.yaml", "baseline"])
    (root / "config.yaml").write_text("x")
    mark(root / "baseline", RUN, "train.py", made=["final", "final/config.json"])
    (root / "baseline" / "final").mkdir()
    (root / "baseline" / "final" / "config.json").write_text("{}")
    rundir.check_can_start(root, overwrite=True)  # all of it the comparison's
    (root / "baseline" / "final" / "README.md").write_text("my model card")
    with pytest.raises(FileExistsError, match=rf"^{root / 'baseline' / 'final' / 'README.md'} was not made by "):
        rundir.check_can_start(root, overwrite=True)


def test_a_folders_predicates_come_from_one_read_of_its_marker(tmp_path, monkeypatch):
    """``rundir.look`` reads the marker once and answers every predicate from that read (a comparison's resume read it
    three times, planning twice more); a resume of a comparison plans from one read and checks it from one more,
    under the lock."""
    from common import ownership
    from progressive.report import compare as compare_module
    from progressive.run import rundir
    from progressive.run.start import _comparison

    root = tmp_path / "both"
    rundir.mark_comparison(root, ["baseline", "vcycle"])
    ownership.record_made(root, MARKER, "baseline")
    reads = []
    real = ownership._lines
    monkeypatch.setattr(ownership, "_lines", lambda *a: reads.append(a) or real(*a))
    folder = rundir.look(root)
    assert (folder.is_run, folder.is_comparison, folder.methods, folder.made) == (
        True, True, ["baseline", "vcycle"], frozenset({"baseline"}))
    assert folder.resumed_methods() == ["baseline", "vcycle"] and len(reads) == 1
    cfg = tiny_cfg(tmp_path, name="both", method="vcycle", train__with_baseline=True)
    reads.clear()
    assert _comparison(cfg, resume=True) == ["baseline", "vcycle"] and len(reads) == 1
    reads.clear()
    compare_module.check_resumable(root, cfg, ["baseline", "vcycle"], folder)
    assert reads == []  # the caller's read, not another
    assert not rundir.look(tmp_path / "nothing").is_run and rundir.look(tmp_path / "nothing").methods is None
