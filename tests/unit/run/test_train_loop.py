"""End-to-end training runs of every family (tiny sizes), outputs, FLOPs accounting and numerics."""

import json
import math
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer, GPT2LMHeadModel

from progressive.config import ConfigError, dump_yaml
from progressive.methods import LRSchedule
from progressive.model.build import get_family, step_flops
from progressive.run.start import decide
from progressive.run.trainer import Trainer
from tests.train_utils import ROOT, rows, tiny_cfg, train_here


def test_gpt2_vcycle_end_to_end_writes_metrics_checkpoint_plots_and_counts_flops(tmp_path):
    cfg = tiny_cfg(tmp_path, train__plots=True)
    summary = Trainer(cfg).run()
    run = cfg.run_dir
    train = rows(run, "train")
    assert [p["phase"] for p in summary["phases"]] == ["L0-down", "L1", "L0-up"]
    for r in train:
        assert {"step", "phase", "tokens", "flops", "wall", "loss", "lr"} <= r.keys()
    assert [r["step"] for r in train] == list(range(1, len(train) + 1))
    # per-step FLOPs are those of the model that ran: the small level costs less than the large one
    fam = get_family("gpt2")
    deltas = {b["phase_name"]: b["flops"] - a["flops"] for a, b in zip(train, train[1:]) if a["phase"] == b["phase"]}
    large = GPT2LMHeadModel.from_pretrained(run / "final").config
    assert deltas["L0-up"] == step_flops(cfg, fam, large)
    assert deltas["L1"] < deltas["L0-up"] / 3
    budget = cfg.train.steps * step_flops(cfg, fam, large)
    assert budget - deltas["L0-up"] < summary["flops"] <= budget  # the last phase fills the FLOPs budget
    assert summary["tokens"] == len(train) * cfg.train.batch_size * cfg.data.seq_len
    assert all(b["wall"] >= a["wall"] for a, b in zip(train, train[1:]))
    # final Hugging Face checkpoint loads with no code of ours
    model = AutoModelForCausalLM.from_pretrained(run / "final")
    tok = AutoTokenizer.from_pretrained(run / "final")
    assert model.config.n_layer == 2 and len(tok) <= model.config.vocab_size
    assert (run / "loss_vs_flops.png").stat().st_size > 1000 and (run / "loss_vs_wallclock.png").is_file()
    val = rows(run, "val")
    assert val[0]["step"] == 0 and val[-1]["val_loss"] < val[0]["val_loss"]
    assert summary["world_size"] == 1 and len(summary["transitions"]) == 2
    from progressive.run.checkpoint import list_checkpoints, read_state

    kept = [read_state(p) for p in list_checkpoints(run)]
    assert len(kept) == cfg.train.keep_checkpoints and kept[-1]["step"] == (len(train) // 5) * 5


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_text_families_train_with_a_vcycle(tmp_path, family):
    cfg = tiny_cfg(tmp_path, family)
    summary = Trainer(cfg).run()
    val = rows(cfg.run_dir, "val")
    assert math.isfinite(summary["final_val_loss"]) and val[-1]["val_loss"] < val[0]["val_loss"]
    loader = AutoModelForMaskedLM if family == "bert" else AutoModelForCausalLM
    assert loader.from_pretrained(cfg.run_dir / "final").config.num_hidden_layers == 2


def test_bert_batches_mask_15_percent_with_fixed_seed(tmp_path):
    cfg = tiny_cfg(tmp_path, "bert", "baseline")

    from progressive.model.build import get_family
    from progressive.run.inputs import RunData

    data = RunData.load(cfg, get_family("bert"))
    idx = np.arange(64)
    a, b = data.batch(data.train, idx, seed=5), data.batch(data.train, idx, seed=5)
    assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
    frac = (a["labels"] != -100).float().mean().item()
    assert 0.10 < frac < 0.17  # 15% of the non-special tokens ([CLS]/[SEP] are never chosen)


@pytest.mark.parametrize("family, method", [("vit", "baseline"), ("deit", "vcycle")])
def test_vision_families_train_on_bundled_cifar10(tmp_path, family, method):
    cfg = tiny_cfg(tmp_path, family, method)
    summary = Trainer(cfg).run()
    assert math.isfinite(summary["final_val_loss"])
    assert (cfg.run_dir / "final" / "preprocessor_config.json").is_file()
    train = rows(cfg.run_dir, "train")
    patches = (16 // 4) ** 2 + (1 if family == "vit" else 2)
    assert train[0]["tokens"] == cfg.train.batch_size * patches


def test_grad_accumulation_matches_the_full_batch_to_fp32_rounding(tmp_path):
    a = tiny_cfg(tmp_path / "a", method="baseline", train__steps=4, train__eval_every=100)
    b = tiny_cfg(tmp_path / "b", method="baseline", train__steps=4, train__eval_every=100, train__grad_accum=2)
    Trainer(a).run()
    Trainer(b).run()
    la = [r["loss"] for r in rows(a.run_dir, "train")]
    lb = [r["loss"] for r in rows(b.run_dir, "train")]
    assert np.allclose(la, lb, rtol=0, atol=2e-5), (la, lb)


@pytest.mark.slow
def test_cli_runs_a_yaml_with_overrides_in_bf16_on_cpu(tmp_path):
    # A subprocess: Accelerate's precision is fixed per process (AcceleratorState is a singleton).
    cfg = tiny_cfg(tmp_path, method="baseline", train__steps=3)
    (tmp_path / "c.yaml").write_text(dump_yaml(cfg))
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "--config", str(tmp_path / "c.yaml"),
                           "--train.mixed_precision", "bf16", "--train.cpu", "true", "--name", "bf16"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "final val loss" in proc.stdout and "| phase |" in proc.stdout
    summary = json.loads((tmp_path / "bf16" / "summary.json").read_text())
    assert math.isfinite(summary["final_train_loss"])
    saved = (tmp_path / "bf16" / "config.yaml").read_text()
    assert "mixed_precision: bf16" in saved


def test_cli_bad_input_exits_2_with_the_field_named(tmp_path):
    # train.py's main in this process (an exception it did not turn into its one line would fail here too)
    proc = train_here(None, "--model.family", "resnet", "--output_dir", tmp_path)
    assert proc.returncode == 2 and "model.family" in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_nan_loss_stops_with_a_clear_message_and_the_last_checkpoint_intact(tmp_path):
    from progressive.run.checkpoint import list_checkpoints, load_checkpoint
    from progressive.run.trainer import NonFiniteLoss

    cfg = tiny_cfg(tmp_path, method="baseline", train__lr=1e30, train__warmup=0.0, train__max_grad_norm=0.0,
                   train__checkpoint_every=1, train__steps=6)
    with pytest.raises(NonFiniteLoss, match=r"loss became (nan|inf).*last good checkpoint is .*step0000000"):
        Trainer(cfg).run()
    last = list_checkpoints(cfg.run_dir)[-1]
    state, parts = load_checkpoint(last)
    assert all(torch.isfinite(t).all() for t in parts["model"].values())
    losses = [r["loss"] for r in rows(cfg.run_dir, "train")]
    assert all(math.isfinite(v) for v in losses) and state["step"] == len(losses)


def test_bad_configs_are_rejected_before_any_data_loads(tmp_path):
    missing = str(tmp_path / "nope.txt")  # would fail if data were read first
    cases = [
        ({"model__num_heads": 2, "model__hidden_size": 32,
          "method__vcycle__levels": [{"alpha": 0.5, "down": {"steps": 1}, "up": {}},
                                     {"width": 4, "depth": 1, "down": {"steps": 1}}]}, r"levels\[1\]"),
        ({"method__vcycle__levels": [{"alpha": 0.5, "down": {"fraction": 1.0}, "up": {"fraction": 1.0}},
                                     {"width": 2, "depth": 2, "down": {"fraction": 0.5}}]}, "budget"),
        ({"model__family": "mamba"}, "model.family"),
        ({"method__name": "apollo9"}, "method.name"),
    ]
    for over, field in cases:
        with pytest.raises(ConfigError, match=field):
            Trainer(tiny_cfg(tmp_path, data__dataset=missing, **over))


def test_missing_data_path_is_named(tmp_path):
    missing = tmp_path / "corpus" / "missing.txt"
    with pytest.raises((FileNotFoundError, ValueError), match="missing.txt"):
        Trainer(tiny_cfg(tmp_path, method="baseline", data__dataset=str(missing))).run()


def test_resume_refuses_changes_that_alter_the_run_allows_lr_with_a_warning_and_knows_a_finished_run(
        tmp_path, capsys):
    from progressive.run.trainer import RunFinished

    cfg = tiny_cfg(tmp_path, method="baseline", train__steps=5, train__checkpoint_every=2)
    Trainer(cfg).run()
    with pytest.raises(RunFinished, match="finished run"):
        Trainer(cfg, decide(cfg.run_dir, True))
    with pytest.raises(FileExistsError, match="--resume"):
        Trainer(cfg)  # a finished run is not silently overwritten
    for p in (cfg.run_dir / "summary.json", cfg.run_dir / "final"):  # as if it had died after step 4's checkpoint
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    changed = tiny_cfg(tmp_path, method="baseline", train__steps=5, train__lr=1e-2, model__dropout=0.1)
    with pytest.raises(ConfigError, match=r"model\.dropout: 0\.0 -> 0\.1") as err:
        Trainer(changed, decide(changed.run_dir, True))
    assert "train.lr" not in str(err.value)
    lower = tiny_cfg(tmp_path, method="baseline", train__steps=5, train__lr=1e-3, train__checkpoint_every=2)
    Trainer(lower, decide(lower.run_dir, True)).run()
    out = capsys.readouterr().err
    assert "resuming with a changed setting: train.lr: 0.003 -> 0.001" in out
    assert "resuming gpt2-baseline from step 4 (phase 0: train)" in out
    assert rows(cfg.run_dir, "train")[-1]["lr"] == pytest.approx(1e-3 * LRSchedule(5, 0.05, "cosine", 0.1)(4))


