"""A run folder says what the run was: the precision it trained in and who chose it (a launcher's bf16 left
config.yaml saying `mixed_precision: null`), and the size of its corpus (tokens, blocks, epochs) on screen, in
summary.json and in the dry run when the data is cached."""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import pytest

from progressive.config import load_config, to_dict
from progressive.data import build_tokenizer, load_token_blocks
from progressive.report.dryrun import dry_run
from progressive.run.accelerator import precision_comment, precision_note, precision_record
from progressive.run.trainer import Trainer
from tests.procs import run_tree
from tests.train_utils import ROOT, tiny_cfg


def _acc(used: str) -> SimpleNamespace:
    return SimpleNamespace(mixed_precision=used, device=SimpleNamespace(type="cpu"))


def test_the_precision_record_names_what_accelerate_used_and_who_chose_it(tmp_path, monkeypatch):
    cfg = tiny_cfg(tmp_path)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # as accelerate launch --mixed_precision bf16 sets it
    assert precision_record(_acc("bf16"), cfg) == {"mixed_precision": "bf16", "precision_chosen_by": "launcher"}
    assert precision_comment(_acc("bf16"), cfg) == (
        "# precision used: bf16 autocast, from the launcher (accelerate launch / its config file) "
        "(train.mixed_precision above is the recipe's; null: the launcher or the device chose)\n")
    recipe = tiny_cfg(tmp_path, train__mixed_precision="no")
    assert precision_record(_acc("no"), recipe) == {"mixed_precision": "no", "precision_chosen_by": "recipe"}
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION")
    assert precision_record(_acc("bf16"), cfg)["precision_chosen_by"] == "gpu default"
    assert precision_record(_acc("no"), cfg)["precision_chosen_by"] == "default"
    assert precision_note(_acc("no"), cfg).startswith("fp32 (no mixed precision), from the default")


def _blocks(cfg):
    return load_token_blocks(cfg.data, build_tokenizer(cfg.data))


def _sizes(cfg, blocks, steps: int) -> dict:
    return {"tokens": blocks.n_tokens, "block_tokens": cfg.data.seq_len, "train_blocks": len(blocks.train),
            "val_blocks": len(blocks.val), "test_blocks": 0 if blocks.test is None else len(blocks.test),
            "planned_steps": steps, "batch_size": cfg.train.batch_size,
            "epochs": round(steps * cfg.train.batch_size / len(blocks.train), 4)}


def test_a_run_says_its_corpus_size_at_the_start_and_summary_json_keeps_it_with_its_precision(tmp_path, capfd):
    cfg = tiny_cfg(tmp_path, method="baseline", train__steps=4, data__test_fraction=0.1)
    summary = Trainer(cfg).run()
    blocks = _blocks(cfg)
    assert summary["data"] == _sizes(cfg, blocks, 4)
    saved = json.loads((cfg.run_dir / "summary.json").read_text())
    assert saved["data"] == summary["data"] and saved["data"]["test_blocks"] > 0
    assert (saved["mixed_precision"], saved["precision_chosen_by"]) == ("no", "default")
    d = summary["data"]
    line = (f"data: {d['tokens']:,} tokens in blocks of 32: {d['train_blocks']:,} train / {d['val_blocks']:,} val / "
            f"{d['test_blocks']:,} test; the plan's 4 steps of 8 blocks read {d['epochs']:.3g} epochs of the "
            "training blocks")
    assert line in capfd.readouterr().err


def test_the_dry_run_reads_the_corpus_size_when_it_is_cached_and_says_it_cannot_know_when_not(tmp_path, capsys):
    cfg = tiny_cfg(tmp_path, method="vcycle")
    blocks = _blocks(cfg)  # the shared test cache holds these blocks
    capsys.readouterr()
    plan = dry_run(cfg)
    steps = sum(r["steps"] for r in plan["phases"])
    assert plan["data"] == _sizes(cfg, blocks, steps)
    out = capsys.readouterr().out
    assert (f"data (cached in {blocks.path}): {blocks.n_tokens:,} tokens in blocks of 32: "
            f"{len(blocks.train):,} train / {len(blocks.val):,} val / 0 test; the plan's {steps} steps") in out

    empty = tmp_path / "no_cache"
    fresh = tiny_cfg(tmp_path, method="vcycle", data__cache_dir=str(empty))
    assert dry_run(fresh)["data"] is None
    assert ("data: not known before a run prepares it (the source's files were never hashed with this "
            f"data.cache_dir, {empty}): the dry run reads neither the data nor a tokenizer it would have to train"
            ) in capsys.readouterr().out
    assert not empty.exists()  # nothing was built or hashed to find out
    other = tiny_cfg(tmp_path, method="vcycle", data__seq_len=24)  # the same source and tokenizer, other blocks
    assert dry_run(other)["data"] is None
    assert "data: not known before a run prepares it (no cache entry for these blocks in " in capsys.readouterr().out


@pytest.mark.slow
def test_a_launchers_bf16_is_recorded_in_summary_json_and_beside_the_saved_config_which_reads_back_unchanged(
        tmp_path):
    """accelerate launch --mixed_precision bf16 (or launch/accelerate/1gpu.yaml) sets ACCELERATE_MIXED_PRECISION; the
    recipe leaves train.mixed_precision unset: the run trains in bf16 and says so in its folder."""
    from progressive.config import dump_yaml

    cfg = tiny_cfg(tmp_path, method="baseline", train__steps=2, train__cpu=True)
    path = tmp_path / "c.yaml"
    path.write_text(dump_yaml(cfg))
    proc = run_tree([sys.executable, str(ROOT / "train.py"), "--config", str(path)], timeout=300, cwd=ROOT,
                    env={**os.environ, "ACCELERATE_MIXED_PRECISION": "bf16"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((cfg.run_dir / "summary.json").read_text())
    assert (summary["mixed_precision"], summary["precision_chosen_by"]) == ("bf16", "launcher")
    text = (cfg.run_dir / "config.yaml").read_text()
    assert "  mixed_precision: null\n" in text
    assert text.endswith("# precision used: bf16 autocast, from the launcher (accelerate launch / its config file) "
                         "(train.mixed_precision above is the recipe's; null: the launcher or the device chose)\n")
    assert to_dict(load_config(cfg.run_dir / "config.yaml")) == to_dict(cfg)  # what a resume reads is unchanged
