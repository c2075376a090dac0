"""What a run says while it trains: the plan in the budget's terms, and progress readable in a log file."""

import contextlib
import io
import re

import pytest

from progressive.config import load_config
from progressive.methods import get_method
from progressive.model.build import get_family, guess_data_info, step_flops
from progressive.run.tracking import Progress, budget_plan
from progressive.run.trainer import Trainer
from tests.train_utils import ROOT, rows, tiny_cfg


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def _plan(path, **over):
    cfg = load_config(ROOT / path, over)
    family = get_family(cfg.model.family, cfg.model.task)
    base = family.config_for(cfg.model, guess_data_info(cfg), cfg.data.seq_len)
    flops = lambda c, n=None: step_flops(cfg, family, c, n)  # noqa: E731
    return budget_plan(get_method(cfg, family).plan(base, flops), flops, cfg.train.steps, base)


def test_the_plan_line_says_the_budget_and_which_phase_adds_the_extra_steps():
    line, label, budget = _plan("configs/default.yaml")
    assert line == ("budget: 300 full-model steps of FLOPs = 5.3e+12; the plan runs 518 optimizer steps: "
                    "L0-down 30, L1 300 (a step costs 0.27x), L0-up 188")
    assert label == "budget 300 full-model steps" and budget == pytest.approx(5.315e12, rel=1e-3)
    line, _, _ = _plan("configs/baseline.yaml")
    assert line.endswith("the plan runs 300 optimizer steps: train 300")  # every step a full one: no cost note
    line, _, _ = _plan("configs/apollo.yaml")  # shallow stages with shared layers: planned FLOPs, not shapes
    assert "stage0-1L 15 (a step costs 0.39x)" in line and line.endswith("stage3-12L 256")


def test_on_a_terminal_the_bar_is_labelled_with_the_budget_and_counts_optimizer_steps():
    term = Terminal()
    bar = Progress(518, 0, 1000.0, True, "budget 300 full-model steps", budget_flops=1000.0, stream=term)
    for i in range(1, 6):
        bar.update(1, "L1", 4.0, 1e-3, wall=float(i), tokens=100 * i, flops=10.0 * i)
    bar.close()
    out = term.getvalue()
    assert "budget 300 full-model steps" in out and "5/518 optimizer steps" in out and "budget=5%" in out
    assert not re.search(r"^step \d", out, re.M)  # no plain lines on a terminal


def test_in_a_log_file_progress_is_at_most_one_plain_line_per_2_percent():
    log = io.StringIO()
    bar = Progress(1000, 0, 1000.0, True, "budget 300 full-model steps", stream=log)
    for i in range(1, 1001):
        bar.update(1, "L1", 4.0, 1e-3, wall=float(i), tokens=100 * i, flops=float(i), extra={"stage": 2})
    bar.close()
    lines = log.getvalue().split("\n")[:-1]
    assert len(lines) == 51 and "\r" not in log.getvalue()  # the first update, then every 20 steps
    assert lines[0].startswith("step 1/1000 (0%), 0% of the FLOPs budget spent: phase=L1 stage=2 loss=4.0000")
    assert lines[-1].startswith("step 1000/1000 (100%), 100% of the FLOPs budget spent:")
    assert lines[-1].endswith("eta=00:00 train_time=16:40")  # done: no time left, whatever FLOPs were planned


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
    """A V-cycle run with its bar on and stderr a file-like stream that is no terminal (as in a SLURM log):
    (the run folder, what it wrote on stderr)."""
    cfg = tiny_cfg(tmp_path_factory.mktemp("log"), train__steps=60, train__progress=True, train__log_every=1,
                   train__eval_every=30, train__checkpoint_every=100)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        Trainer(cfg).run()
    return cfg.run_dir, err.getvalue()


def test_a_run_prints_its_plan_in_the_budgets_terms_once_at_the_start(logged_run):
    run_dir, err = logged_run
    plan = [line for line in err.split("\n") if line.startswith("budget: ")]
    assert len(plan) == 1
    m = re.fullmatch(r"budget: 60 full-model steps of FLOPs = \S+; the plan runs (\d+) optimizer steps: (.*)", plan[0])
    train = rows(run_dir, "train")
    assert m and int(m.group(1)) == train[-1]["step"] == 78
    said = re.findall(r"(\S+) (\d+)(?: \(a step costs ([\d.]+)x\))?", m.group(2))
    ran = {name: sum(1 for r in train if r["phase_name"] == name) for name, _, _ in said}
    assert [(n, int(s)) for n, s, _ in said] == list(ran.items())  # log_every 1: one row per step
    assert [c for _, _, c in said] == ["", "0.25", ""]  # the coarse level is the cheap one


def test_a_run_logged_to_a_file_writes_few_short_lines_not_one_line_of_redraws(logged_run):
    _, err = logged_run
    lines = err.split("\n")
    progress = [line for line in lines if line.startswith("step ")]
    assert 20 <= len(progress) <= Progress.PLAIN_LINES + 1  # 78 steps: not one line per step
    assert progress[-1].startswith("step 78/78 (100%), 100% of the FLOPs budget spent: phase=L0-up")
    assert max(len(line) for line in lines) < 300  # a tqdm bar here: every redraw on one line, ~12 KB
    assert "Writing model shards" not in err  # transformers' bar over save_pretrained: a line per save in a log


def test_saving_a_model_draws_no_bar_inside_no_save_bar_and_the_switch_is_restored(tmp_path, capfd):
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    from common.quiet import no_save_bar

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=8))
    was_on = hf_logging.is_progress_bar_enabled()  # the eval CLIs switch it off for their process (eval.finetune)
    hf_logging.enable_progress_bar()
    try:
        model.save_pretrained(tmp_path / "a")
        assert "Writing model shards" in capfd.readouterr().err  # what a log kept at every save
        with no_save_bar():
            model.save_pretrained(tmp_path / "b")
        assert "Writing model shards" not in capfd.readouterr().err and hf_logging.is_progress_bar_enabled()
    finally:
        if not was_on:
            hf_logging.disable_progress_bar()
