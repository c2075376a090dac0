"""eval.zeroshot: windows, request construction, metric definitions on hand-computed values, bad input,
CLI/JSON/W&B. Parity with lm-evaluation-harness itself is in test_zeroshot_harness.py."""

from __future__ import annotations

import json
import logging
import math
import re
import shutil

import pytest
import torch
from test_zeroshot_helpers import BigramLM, gpt2_tokenizer, make_tiny_gpt2, word_tokenizer

from eval import zeroshot
from eval.tasks import lm_data
from eval.tasks.scoring import Request, encode, lambada_request, rolling_requests, score_requests


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_gpt2(tmp_path_factory.mktemp("tiny_gpt2"), n_positions=80)


# ---------------------------------------------------------------- rolling windows


def test_rolling_windows_equal_harness_windows_and_score_each_token_once():
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    for max_length in (1, 2, 5, 8):
        for n in range(0, 3 * max_length + 3):
            tokens = list(range(100, 100 + n))
            ours = rolling_requests(tokens, prefix_id=7, max_length=max_length)
            theirs = [make_disjoint_window(w) for w in get_rolling_token_windows(tokens, 7, max_length, 1)]
            assert [(r.context, r.continuation) for r in ours] == [(list(a), list(b)) for a, b in theirs]
            # every token predicted exactly once, in order
            assert [t for r in ours for t in r.continuation] == tokens
            for k, r in enumerate(ours):
                inp = (r.context + r.continuation)[-(max_length + 1) :][:-1]
                assert len(inp) <= max_length and not r.truncated(max_length)
                # the model sees exactly the tokens that precede each predicted one
                start = sum(len(q.continuation) for q in ours[:k])
                expected = ([7] + tokens)[max(0, start + len(r.continuation) - max_length)
                                          : start + len(r.continuation)]
                assert inp == expected


def test_rolling_windows_full_windows_get_one_context_token_and_last_is_backfilled():
    reqs = rolling_requests(list(range(10)), prefix_id=99, max_length=4)
    assert [(r.context, r.continuation) for r in reqs] == [
        ([99], [0, 1, 2, 3]),
        ([3], [4, 5, 6, 7]),
        ([5, 6, 7], [8, 9]),  # backfilled: 4 - 2 + 1 context tokens, so the model reads 4 tokens
    ]


# ---------------------------------------------------------------- request construction


def test_lambada_request_scores_space_plus_last_word_as_continuation():
    tok = gpt2_tokenizer()
    text = "He picked up the guitar and played a song for Harlin"
    r = lambada_request(tok, text, prefix_id=50256)
    assert r.context == tok.encode("He picked up the guitar and played a song for")
    assert r.continuation == tok.encode(" Harlin") and len(r.continuation) > 1  # a multi-token word
    # a trailing space on the context moves to the target, as in the harness's _encode_pair
    r2 = lambada_request(tok, "said  nothing", prefix_id=50256)
    assert r2.context == tok.encode("said") and r2.continuation == tok.encode("  nothing")


def test_encode_adds_no_second_prefix_token_when_text_starts_with_it():
    tok = gpt2_tokenizer()
    assert encode(tok, "<|endoftext|>Hello world", 50256) == [50256, 15496, 995]
    assert encode(tok, "Hello world", 50256) == [15496, 995]


# ---------------------------------------------------------------- metric definitions (hand-computed)


def _bigram(vocab: int, seed: int = 0) -> BigramLM:
    return BigramLM(torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed)) * 2)


def test_document_metrics_equal_hand_computed_bigram_loglikelihood():
    words = ["a", "b", "c"]
    tok = word_tokenizer(words)  # no BOS: the prefix token is EOS (id 0), the harness's fallback
    model = _bigram(4)
    logp = torch.log_softmax(model.table, -1)
    docs = ["a b c a b", "c c b"]
    ll = 0.0
    for d in docs:
        ids = [0] + [words.index(w) + 1 for w in d.split()]
        ll += sum(logp[p, t].item() for p, t in zip(ids[:-1], ids[1:]))

    def counts(d):
        return len(d.split()), len(d.encode())

    n_words, n_bytes = 8, len(docs[0]) + len(docs[1])
    # a bigram model only needs the previous token, which every window keeps: any max_length gives the same
    for max_length in (1, 2, 3, 64):
        m = zeroshot.evaluate_documents(model, tok, docs, max_length, counts, batch_size=2)
        assert m["loglikelihood"] == pytest.approx(ll, rel=1e-6)
        assert m["word_perplexity"] == pytest.approx(math.exp(-ll / n_words), rel=1e-6)
        assert m["byte_perplexity"] == pytest.approx(math.exp(-ll / n_bytes), rel=1e-6)
        assert m["bits_per_byte"] == pytest.approx(-ll / n_bytes / math.log(2), rel=1e-6)
        assert (m["n_tokens"], m["n_words"], m["n_windows"]) == (8, 8, sum(math.ceil(n / max_length) for n in (5, 3)))


def test_lambada_acc_needs_every_target_token_greedy_and_perplexity_is_per_word():
    table = torch.full((5, 5), -5.0)
    table[1, 2] = table[2, 3] = table[3, 1] = 5.0  # greedy chain a -> b -> c -> a; d never greedy
    model = BigramLM(table)
    tok = word_tokenizer(["a", "b", "c", "d"])
    logp = torch.log_softmax(table, -1)
    m = zeroshot.evaluate_lambada(model, tok, ["a b", "a b c d", "c a"], max_length=16, batch_size=2)
    assert m["acc"] == pytest.approx(2 / 3)  # "d" after "c" is not the argmax
    mean_ll = (logp[1, 2] + logp[3, 4] + logp[3, 1]).item() / 3
    assert m["perplexity"] == pytest.approx(math.exp(-mean_ll), rel=1e-6)
    # a two-token target is greedy only if both tokens are
    both, second_wrong = score_requests(model, [Request([1], [2, 3]), Request([1], [2, 4])], max_length=8)
    assert both[1] is True and second_wrong[1] is False
    assert both[0] == pytest.approx((logp[1, 2] + logp[2, 3]).item(), rel=1e-6)


def test_batched_scores_equal_one_by_one_torch_loglikelihood(tiny):
    model, tok = zeroshot.load_causal_lm(tiny)
    texts = lm_data.load_lambada(limit=6)
    reqs = [lambada_request(tok, t, 50256) for t in texts] + rolling_requests(list(range(1000, 1150)), 50256, 80)
    got = score_requests(model, reqs, max_length=80, batch_size=5)
    with torch.no_grad():
        for r, (ll, greedy) in zip(reqs, got):
            inp = torch.tensor([(r.context + r.continuation)[-81:][:-1]])
            lp = torch.log_softmax(model(inp).logits[0, -len(r.continuation) :], -1)
            cont = torch.tensor(r.continuation)
            assert ll == pytest.approx(lp[torch.arange(len(cont)), cont].sum().item(), rel=1e-5)
            assert greedy == bool((lp.argmax(-1) == cont).all())


# ---------------------------------------------------------------- data


def test_wikitext_pages_start_at_level1_headings_only():
    text = " \n = Alpha = \n \n x @-@ y \n = = Sub = = \n z \n = Beta = \n w \n"
    assert lm_data.split_wikitext_pages(text) == [
        " = Alpha = \n \n x @-@ y \n = = Sub = = \n z ",
        " = Beta = \n w \n",
    ]
    pages2 = lm_data.load_wikitext("wikitext2")
    pages103 = lm_data.load_wikitext("wikitext103")
    assert len(pages2) == len(pages103) == 62
    assert pages2[0].startswith(" = Robert <unk> = \n") and "<unk>" in pages2[0]
    for p in pages2:
        level1 = [ln for ln in p.split("\n") if re.fullmatch(r" = [^=].* = ", ln)]
        assert level1 == [p.split("\n")[0]]


def test_word_and_byte_counts_equal_harness_process_results_and_ptb_token_count():
    from lm_eval.tasks.wikitext.preprocess_wikitext import process_results

    for page in lm_data.load_wikitext("wikitext2", limit=3):
        got = process_results({"page": page}, [-1.0])
        assert lm_data.wikitext_counts(page) == (got["word_perplexity"][1], got["byte_perplexity"][1])
    (ptb,) = lm_data.load_ptb()
    assert lm_data.ptb_counts(ptb)[0] == 82430  # PTB test: 78,669 words + 3,761 <eos>
    assert lm_data.ptb_counts(lm_data.load_ptb(limit=2)[0])[0] == len(ptb.split("\n")[0].split()) + len(
        ptb.split("\n")[1].split()) + 2


# ---------------------------------------------------------------- bad input


def test_masked_lm_checkpoint_is_rejected_naming_its_class(tmp_path):
    from transformers import BertConfig, BertForMaskedLM

    BertForMaskedLM(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=64)).save_pretrained(tmp_path)
    with pytest.raises(zeroshot.CheckpointError, match="BertForMaskedLM.*causal LM"):
        zeroshot.run(zeroshot.ZeroShotConfig(checkpoint=str(tmp_path), tasks=("lambada",)))


def test_bidirectional_model_behind_causal_head_fails_the_causality_probe(tmp_path):
    from transformers import BertConfig, BertLMHeadModel

    BertLMHeadModel(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=64, is_decoder=False)).save_pretrained(tmp_path)
    word_tokenizer(["a"]).save_pretrained(tmp_path)
    with pytest.raises(zeroshot.CheckpointError, match="not causal"):
        zeroshot.load_causal_lm(tmp_path)


def test_missing_data_file_and_checkpoint_errors_name_the_path(tmp_path, tiny):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "ptb" / "ptb.test.txt.gz"))):
        zeroshot.run(zeroshot.ZeroShotConfig(checkpoint=str(tiny), tasks=("ptb",), data_dir=str(tmp_path)))
    with pytest.raises(FileNotFoundError, match="no such folder"):
        zeroshot.run(zeroshot.ZeroShotConfig(checkpoint=str(tmp_path / "nope"), tasks=("ptb",)))
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        zeroshot.run(zeroshot.ZeroShotConfig(checkpoint=str(tmp_path), tasks=("ptb",)))
    with pytest.raises(ValueError, match="--tasks"):
        zeroshot.run(zeroshot.ZeroShotConfig(checkpoint=str(tiny), tasks=("lambada_typo",)))
    with pytest.raises(ValueError, match="exceeds the model's 80 positions"):
        zeroshot.run(zeroshot.ZeroShotConfig(checkpoint=str(tiny), tasks=("ptb",), max_length=81))


def _without_tokenizer(tiny, folder):
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny / name, folder / name)
    return folder


def test_a_checkpoint_without_a_tokenizer_is_one_line_saying_how_to_name_one(tiny, tmp_path, capsys):
    """config.json and model.safetensors copied alone: transformers made an empty tokenizer of one token, every
    text encoded to nothing, and the run exited 0 with word perplexity 1.0 and 0.0 bits per byte."""
    bare = _without_tokenizer(tiny, tmp_path / "bare")
    for engine in ("ours", "harness"):
        argv = [str(bare), "--tasks", "ptb", "--engine", engine, "--output", str(tmp_path / "r.json")]
        assert zeroshot.cli(argv) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines == [f"error: {bare} has no tokenizer files (tokenizer.json, tokenizer_config.json, vocab.json, "
                         "...): pass --tokenizer FOLDER or a Hub name (the tokenizer the model was trained with, e.g. "
                         "the run's final/)"], lines
    assert not (tmp_path / "r.json").exists()
    res = zeroshot.main([str(bare), "--tasks", "ptb", "--limit", "2", "--tokenizer", str(tiny),
                         "--output", str(tmp_path / "r.json")])["results"]
    assert res["ptb"]["n_tokens"] > 0 and res["ptb"]["word_perplexity"] > 1


def test_a_tokenizer_that_encodes_text_to_nothing_is_refused_naming_where_it_came_from(tiny, tmp_path, capsys):
    """A tokenizer_config.json alone (no vocabulary) loads as the same empty tokenizer."""
    bare = _without_tokenizer(tiny, tmp_path / "bare")
    (bare / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    assert zeroshot.cli([str(bare), "--tasks", "ptb", "--output", str(tmp_path / "r.json")]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"error: the tokenizer in {bare} encodes text to no tokens (a vocabulary of 1): ") \
        and "--tokenizer" in line, line


@pytest.mark.parametrize("task", zeroshot.TASKS)
def test_a_task_that_scores_nothing_is_an_error_naming_the_task(tiny, tmp_path, task):
    """Whatever the cause (here transformers' empty tokenizer, loaded past the CLI's check), a task that scored no
    token is an error, never a perfect score."""
    from transformers import AutoTokenizer

    empty = AutoTokenizer.from_pretrained(_without_tokenizer(tiny, tmp_path / "bare"))
    assert empty.encode("hello world") == []
    model, _ = zeroshot.load_causal_lm(tiny)
    with pytest.raises(ValueError, match=f"^{task}: 0 tokens to score in (2 passages|1 text|2 texts): the tokenizer "
                                         "encodes them to nothing"):
        zeroshot.evaluate_task(task, model, empty, max_length=64, limit=150)  # words: 2 passages, 2 pages or 1 stream


def test_lambada_context_longer_than_model_is_left_truncated_counted_and_warned(tiny, caplog):
    model, tok = zeroshot.load_causal_lm(tiny)
    texts = lm_data.load_lambada(limit=8)
    lengths = [len(r.context) + len(r.continuation) for r in (lambada_request(tok, t, 50256) for t in texts)]
    with caplog.at_level(logging.WARNING, logger="eval.zeroshot"):
        m = zeroshot.evaluate_lambada(model, tok, texts, max_length=80, batch_size=4)
    assert m["n_truncated"] == sum(n > 81 for n in lengths) and 0 < m["n_truncated"] < 8
    assert "cut from the left" in caplog.text


# ---------------------------------------------------------------- CLI, JSON, tracker


def test_cli_writes_json_beside_the_checkpoint_and_prints_table(tiny, capsys):
    out = zeroshot.main([str(tiny), "--tasks", "lambada,ptb", "--limit", "200", "--batch_size", "4"])
    saved = json.loads((tiny.parent / f"{tiny.name}.eval_zeroshot.json").read_text())
    assert not (tiny / "eval_zeroshot.json").exists()
    assert saved["results"]["lambada"]["n_examples"] == 3 and saved["max_length"] == 80  # 69 + 49 + 77 words
    assert saved["results"]["ptb"]["n_words"] == out["results"]["ptb"]["n_words"] > 0
    assert "| lambada |" in capsys.readouterr().out
    assert "--max_length" in zeroshot.build_parser().format_help()


def _largest_unit(task: str) -> int:
    """Words of the task's largest unit --limit keeps whole: a LAMBADA passage, a WikiText line, a PTB sentence."""
    if task == "lambada":
        return max(len(t.split()) for t in lm_data.load_lambada())
    if task == "ptb":
        return max(len(s.split()) + 1 for s in lm_data.load_ptb()[0].splitlines())
    return max(len(line.split()) + 2 for page in lm_data.load_wikitext(task) for line in page.split("\n"))


def test_limit_is_one_word_budget_that_every_task_scores_up_to_and_each_result_says_what_it_scored(tiny, tmp_path,
                                                                                                  caplog):
    """--limit N scores the first N words of every task alike (it was N examples: 20 scored 0.4% of LAMBADA's passages
    but 31% of WikiText's pages): whole LAMBADA passages and PTB sentences, WikiText pages cut at a line; no task
    passes N, each comes within one unit of it, the log says what is scored before scoring and the result keeps it.
    The words are each metric's own (a WikiText page's word perplexity divides by them)."""
    budget = 2500
    with caplog.at_level(logging.INFO, logger="eval.zeroshot"):
        res = zeroshot.run(zeroshot.ZeroShotConfig(checkpoint=str(tiny), limit=budget, batch_size=16,
                                                   output=str(tmp_path / "r.json")))["results"]
    assert set(res) == set(zeroshot.TASKS)
    for task in zeroshot.TASKS:
        assert budget - _largest_unit(task) < res[task]["words"] <= budget, (task, res[task]["words"])
        chosen = lm_data.select(task, words=budget)
        assert res[task]["scored"] == chosen.describe() and f"{task}: scoring {chosen.describe()}" in caplog.text
        assert res[task]["words_total"] == chosen.words_total
    assert res["lambada"]["n_examples"] == res["lambada"]["n_units"] < 100
    for task in ("wikitext2", "wikitext103", "ptb"):
        assert res[task]["n_words"] == res[task]["words"]  # the metric's words are the budget's
    wiki = res["wikitext2"]
    assert wiki["scored"].startswith("2 of 62 pages (the last cut after ")  # the first page holds 1,093 words
    assert wiki["scored"].endswith(f": {wiki['words']:,} of 241,335 words ({100 * wiki['words'] / 241335:.2g}%)")
    everything = lm_data.select("ptb")
    assert (everything.units, everything.words, everything.cut) == (3761, 82430, None)
    assert everything.describe() == "3761 of 3761 sentences: 82,430 words"


def test_a_limit_smaller_than_any_unit_still_scores_one_and_the_harness_tasks_refuse_a_limit():
    assert [lm_data.select(t, words=1).units for t in zeroshot.TASKS] == [1, 1, 1, 1]
    assert lm_data.select("wikitext2", words=1).cut == (1, len(lm_data.load_wikitext("wikitext2")[0].split("\n")))
    with pytest.raises(ValueError, match=r"--limit counts the words of the bundled tasks; the harness's own tasks "
                                         r"\(--harness_tasks lambada_openai\) are not read here"):
        zeroshot.ZeroShotConfig(checkpoint="x", tasks=(), harness_tasks=("lambada_openai",), limit=5).validate()


def test_wandb_offline_run_holds_the_metric_keys(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    zeroshot.main([str(tiny), "--tasks", "lambada", "--limit", "2", "--report_to", "wandb",
                   "--output", str(tmp_path / "r.json"), "--logging_dir", str(tmp_path / "logs")])
    runs = list((tmp_path / "logs").rglob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    assert b"zeroshot/lambada/acc" in runs[0].read_bytes()
