"""Parity: our scorer and lm-evaluation-harness (its own lambada_openai / wikitext task configs, on the
bundled files) give the same numbers on the same tiny checkpoint and data."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch
from test_zeroshot_helpers import make_tiny_gpt2

from eval import zeroshot
from eval.tasks import lm_data
from eval.tasks.harness import run_harness

SHANE = 24379  # " Shane": the one-token target of LAMBADA passage 1 (67 tokens, fits in 80 positions)


def _rig_greedy(ckpt, token_id: int) -> None:
    """Make `token_id` the argmax at every position (final LayerNorm outputs ~ its embedding), so that
    LAMBADA acc is not trivially 0 and the greedy test is exercised on both sides."""
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(ckpt)
    with torch.no_grad():
        model.transformer.wte.weight[token_id] *= 3
        model.transformer.ln_f.weight.mul_(0.01)
        model.transformer.ln_f.bias.copy_(model.transformer.wte.weight[token_id] * 20)
    model.save_pretrained(ckpt)


def _mini_data(root: Path) -> Path:
    """A data/ look-alike with small slices of the real files, so both engines run in seconds: LAMBADA
    passages 0-3, two WikiText pages (the first with sub-headings), the first 30 PTB sentences."""
    picks = {
        "lambada": lambda lines: lines[:4],
        "wikitext2": lambda lines: lines[:12] + lines[32:37],  # page "Robert <unk>" (cut), page "Du Fu" (cut)
        "wikitext103": lambda lines: lines[:12] + lines[32:37],
        "ptb": lambda lines: lines[:30],
    }
    for task, pick in picks.items():
        lines = gzip.open(lm_data.data_file(task), "rt", encoding="utf-8").read().split("\n")
        out = root / lm_data.TASK_FILES[task]
        out.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(out, "wt", encoding="utf-8") as f:
            f.write("\n".join(pick(lines)) + "\n")
    return root


def test_ours_equals_lm_eval_harness_on_bundled_lambada_wikitext_ptb(tmp_path):
    ckpt = make_tiny_gpt2(tmp_path / "ckpt", n_positions=80)  # LAMBADA 0 and 2 exceed 80 tokens: truncated
    _rig_greedy(ckpt, SHANE)
    data_dir = _mini_data(tmp_path / "data")
    tasks = ("lambada", "wikitext2", "wikitext103", "ptb")
    theirs = run_harness(ckpt, tasks, batch_size=8, max_length=80, data_dir=data_dir)
    model, tok = zeroshot.load_causal_lm(ckpt)
    for task in tasks:
        ours = zeroshot.evaluate_task(task, model, tok, 80, batch_size=8, data_dir=data_dir)
        assert ours.get("n_docs", ours.get("n_examples")) == theirs[task]["n_examples"]
        metrics = (("acc", "perplexity") if task == "lambada"
                   else ("word_perplexity", "byte_perplexity", "bits_per_byte"))
        for m in metrics:
            assert ours[m] == pytest.approx(theirs[task][m], rel=1e-4, abs=0), (task, m, ours[m], theirs[task][m])
    assert theirs["lambada"]["acc"] == 0.25  # exactly passage 1 is greedy-correct
    assert theirs["wikitext2"]["n_examples"] == 2 and theirs["ptb"]["n_examples"] == 1
