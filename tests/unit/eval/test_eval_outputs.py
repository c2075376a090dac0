"""Where the eval CLIs write by default: never into a folder a command of this project owns (a run folder, its
final/, a comparison's folder, an operators' or a bench's output), whose later ``--overwrite`` replaces what that
command made and refuses what it did not. The results go beside the outermost such folder instead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_zeroshot_helpers import make_tiny_gpt2

from common.ownership import OUTPUT, RUN, WRITTEN_BY, mark
from eval import deit_transfer, glue, zeroshot
from eval.report import default_output


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_gpt2(tmp_path_factory.mktemp("tiny"), n_positions=64)


def _listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"" for p in sorted(folder.rglob("*"))}


def _run_folder(root: Path, tiny: Path, *names: str) -> Path:
    """``root/names[0]/.../final``, each level marked as train.py's (a run, or a comparison holding runs)."""
    folder = root
    for name in names:
        folder = folder / name
        mark(folder, RUN, "train.py", made=["final"] if name == names[-1] else [names[names.index(name) + 1]])
    final = folder / "final"
    final.mkdir()
    for f in tiny.iterdir():
        (final / f.name).write_bytes(f.read_bytes())
    return final


@pytest.mark.parametrize("names, expected", [
    (("run1",), "run1.final.eval_zeroshot.json"),
    (("cmp", "vcycle"), "cmp.vcycle.final.eval_zeroshot.json"),
])
def test_zeroshot_writes_its_results_beside_the_run_never_inside_final_or_the_run(tmp_path, tiny, capsys, names,
                                                                                  expected):
    """``python -m eval.zeroshot <run>/final`` wrote ``final/eval_zeroshot.json``, which the run's next
    ``--overwrite`` then deleted with final/ (or refused, once the record is checked at every depth)."""
    outputs = tmp_path / "outputs"
    final = _run_folder(outputs, tiny, *names)
    top = outputs / names[0]
    before = _listing(top)
    zeroshot.main([str(final), "--tasks", "ptb", "--limit", "2"])
    assert _listing(top) == before  # nothing added anywhere inside the run (or the comparison)
    results = outputs / expected
    saved = json.loads(results.read_text())
    assert saved[WRITTEN_BY] == "growtrain eval.zeroshot" and saved["results"]["ptb"]["n_tokens"] > 0
    assert f"results: {results}" in capsys.readouterr().out
    assert sorted(p.name for p in outputs.iterdir()) == sorted([names[0], expected])


def test_an_explicit_output_is_still_written_where_it_is_given(tmp_path, tiny):
    final = _run_folder(tmp_path / "outputs", tiny, "run1")
    zeroshot.main([str(final), "--tasks", "ptb", "--limit", "1", "--output", str(final / "mine.json")])
    assert json.loads((final / "mine.json").read_text())[WRITTEN_BY] == "growtrain eval.zeroshot"


@pytest.mark.parametrize("layout, checkpoint, expected", [
    ({"out/run1": RUN}, "out/run1/final", "out/run1.final.x.json"),
    ({"out/cmp": RUN, "out/cmp/vcycle": RUN}, "out/cmp/vcycle/final", "out/cmp.vcycle.final.x.json"),
    ({"out/small": OUTPUT}, "out/small", "out/small.x.json"),  # an operators' output folder
    ({"bench": OUTPUT, "bench/k1": RUN}, "bench/k1/final", "bench.k1.final.x.json"),  # a bench's run
    ({}, "models/gpt2", "models/gpt2.x.json"),  # a folder of the user's: beside it too
])
def test_the_default_output_lies_beside_the_outermost_folder_this_project_owns(tmp_path, layout, checkpoint,
                                                                               expected):
    for folder, marker in layout.items():
        mark(tmp_path / folder, marker, "train.py" if marker == RUN else "python -m operators")
    (tmp_path / checkpoint).mkdir(parents=True, exist_ok=True)
    assert default_output(tmp_path / checkpoint, "x.json") == tmp_path / expected


def test_the_default_output_is_found_from_where_the_checkpoint_really_is(tmp_path):
    """A link to a run's final/ (or a working folder inside the run) still puts the results outside the run."""
    mark(tmp_path / "out/run1", RUN, "train.py")
    (tmp_path / "out/run1/final").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "out/run1/final")
    assert default_output(tmp_path / "link", "x.json") == tmp_path / "out/run1.final.x.json"


@pytest.mark.parametrize("cli, argv, expected", [
    ("glue", ["--tasks", "rte"], "run1.final.glue_results.json"),
    ("glue", ["--tasks", "rte", "--quick"], "run1.final.glue_results_quick.json"),
    ("deit", [], "run1.final.transfer_cifar10.json"),
    ("deit", ["--quick"], "run1.final.transfer_cifar10_quick.json"),
])
def test_glue_and_deit_transfer_write_their_results_and_tracker_files_beside_the_run(tmp_path, tiny, monkeypatch, cli,
                                                                                       argv, expected):
    """The work itself is replaced by a stub (the tests of each CLI run it): only where the outputs go is checked."""
    final = _run_folder(tmp_path / "outputs", tiny, "run1")
    before = _listing(tmp_path / "outputs" / "run1")
    logged = {}
    module = glue if cli == "glue" else deit_transfer
    if cli == "glue":
        monkeypatch.setattr(glue, "run_glue", lambda cfg, acc: {"config": {}, "tasks": {}})
        monkeypatch.setattr(glue, "table_rows", lambda results: [])
        monkeypatch.setattr(glue, "tracker_metrics", lambda results: {})
    else:
        monkeypatch.setattr(deit_transfer, "run_transfer", lambda cfg, acc: {
            "config": {}, "top1": 0.5, "image_size": 32, "n_train": 1, "n_eval": 1, "seconds": 0.0})
    monkeypatch.setattr(module, "log_results", lambda *a, **k: logged.update(dir=a[4]))
    module.main(["--checkpoint", str(final), "--cpu", *argv])
    assert _listing(tmp_path / "outputs" / "run1") == before
    saved = json.loads((tmp_path / "outputs" / expected).read_text())
    assert saved[WRITTEN_BY] == f"growtrain eval.{'glue' if cli == 'glue' else 'deit_transfer'}"
    assert Path(logged["dir"]) == tmp_path / "outputs" / "eval_logs"
