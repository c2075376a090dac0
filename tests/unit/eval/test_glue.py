"""eval.glue: quick end-to-end runs on a tiny random BERT, W&B offline, data/encoding rules, bad input."""

import gzip
import json
import logging
import os
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertTokenizerFast,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
)

from eval import glue
from eval.glue_data import DATA_DIR, TASKS, OfflineSkip, encode, load_task, load_tokenizer, read_tsv
from tests.procs import run_tree

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROOT = Path(__file__).resolve().parents[3]


def _wordpiece(vocab_size=300):
    """A tiny WordPiece model trained on a few hundred bundled GLUE sentences."""
    with gzip.open(DATA_DIR / "RTE" / "train.tsv.gz", "rt", encoding="utf-8") as f:
        lines = [" ".join(line.split("\t")[1:3]) for line in f.read().split("\n")[1:300]]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(lines, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIALS))
    return tok


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bert_tiny")
    tok = BertTokenizerFast(tokenizer_object=_wordpiece())
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)  # as our trainer saves BERT (no dropout in pre-training)
    BertForMaskedLM(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def quick_run(bert_dir, tmp_path_factory, monkeypatch_module):
    """One --quick CLI run on RTE + STS-B (+ QNLI, which must be skipped offline), logged to W&B offline."""
    monkeypatch_module.setenv("WANDB_MODE", "offline")
    out = tmp_path_factory.mktemp("out")
    results = glue.main(["--checkpoint", str(bert_dir), "--quick", "--tasks", "rte,STS-B,qnli", "--max_train_samples",
                         "40", "--max_eval_samples", "21", "--batch_size", "8", "--output", str(out / "glue.json"),
                         "--report_to", "wandb", "--logging_dir", str(out / "logs"), "--cpu"])
    return results, out


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_quick_glue_writes_metrics_json_and_glue_average(quick_run):
    results, out = quick_run
    saved = json.loads((out / "glue.json").read_text())
    assert set(saved["tasks"]) == {"rte", "stsb"}
    rte, stsb = saved["tasks"]["rte"], saved["tasks"]["stsb"]
    assert rte["n_train"] == 40 and rte["n_eval"] == {"rte": 21} and rte["best_lr"] == 5e-5 and rte["seeds"] == [0]
    assert 0.0 <= rte["mean"]["rte"]["accuracy"] <= 1.0
    assert set(stsb["mean"]["stsb"]) == {"pearson", "spearmanr"}
    expect = 100 * (rte["mean"]["rte"]["accuracy"] + sum(stsb["mean"]["stsb"].values()) / 2) / 2
    assert saved["glue_average"] == pytest.approx(expect)
    assert saved["glue_average_sets"] == ["rte", "stsb"]


def test_qnli_train_is_skipped_offline_with_a_reason(quick_run):
    results, _ = quick_run
    assert "offline" in results["skipped"]["qnli"] and "QNLI/train.tsv" in results["skipped"]["qnli"]


def test_wandb_offline_run_contains_glue_metric_keys(quick_run):
    _, out = quick_run
    runs = list((out / "logs").rglob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    blob = runs[0].read_bytes()
    for key in (b"glue/rte/accuracy", b"glue/stsb/spearmanr", b"glue/average"):
        assert key in blob


def test_mnli_from_local_tsvs_reports_matched_and_mismatched(bert_dir, tmp_path):
    hdr = "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t" \
          "sentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n"
    row = "{i}\t0\t0\tfic\t-\t-\t-\t-\tA man is {w}.\tA person is {w}.\t{y}\t{y}\n"
    labels = ["entailment", "neutral", "contradiction"]
    (tmp_path / "MNLI").mkdir()
    for stem, n in (("train", 12), ("dev_matched", 5), ("dev_mismatched", 7)):
        rows = "".join(row.format(i=i, w=f"walking {i}", y=labels[i % 3]) for i in range(n))
        (tmp_path / "MNLI" / f"{stem}.tsv").write_text(hdr + rows)
    cfg = glue.GlueConfig(str(bert_dir), tasks=("mnli",), lrs=(1e-4,), seeds=(0, 1), epochs=1, batch_size=4,
                          data_dir=str(tmp_path), cpu=True)
    res = glue.run_glue(cfg)
    t = res["tasks"]["mnli"]
    assert t["n_eval"] == {"mnli_m": 5, "mnli_mm": 7} and len(t["runs"]) == 2
    assert res["glue_average_sets"] == ["mnli_m", "mnli_mm"]
    assert t["std"]["mnli_m"]["accuracy"] >= 0.0


def test_summarize_picks_lr_by_median_over_seeds_and_reports_sample_std():
    def run(lr, seed, acc):
        return {"lr": lr, "seed": seed, "score": acc, "metrics": {"rte": {"accuracy": acc}}}
    # lr 1e-5 has the best mean (outlier 0.9) but lr 2e-5 the best median
    runs = [run(1e-5, 0, 0.5), run(1e-5, 1, 0.5), run(1e-5, 2, 0.9),
            run(2e-5, 0, 0.6), run(2e-5, 1, 0.6), run(2e-5, 2, 0.7)]
    s = glue.summarize(runs)
    assert s["best_lr"] == 2e-5
    assert s["mean"]["rte"]["accuracy"] == pytest.approx(1.9 / 3)
    assert s["std"]["rte"]["accuracy"] == pytest.approx((2 * (0.1 / 3) ** 2 + (0.2 / 3) ** 2) ** 0.5 / 2 ** 0.5)


def test_bundled_tsvs_parse_with_glue_counts():
    counts = {"cola": (8551, 1043), "sst2": (67349, 872), "mrpc": (3668, 408), "stsb": (5749, 1500),
              "rte": (2490, 277), "wnli": (635, 71)}
    for name, (n_train, n_dev) in counts.items():
        task = TASKS[name]
        texts, labels = read_tsv(DATA_DIR / task.dirname / "train.tsv.gz", task)
        assert len(labels) == n_train and len(texts[0]) == len(task.text)
        assert len(read_tsv(DATA_DIR / task.dirname / "dev.tsv.gz", task)[1]) == n_dev
    _, y = read_tsv(DATA_DIR / "RTE" / "train.tsv.gz", TASKS["rte"])
    assert y.count(0) == 1249  # entailment = 0, as in HF glue
    texts, y = read_tsv(DATA_DIR / "MRPC" / "dev.tsv.gz", TASKS["mrpc"])
    assert sum(y) == 279 and texts[0][0].startswith("He said the foodservice")  # BOM header handled


def test_pairs_encode_as_cls_a_sep_b_sep_and_truncate_longest_first(bert_dir):
    tok = load_tokenizer(str(bert_dir))
    long_a, short_b = " ".join(["the man"] * 20), "a dog"
    ds, n_trunc = encode(tok, ([(long_a, short_b), ("a man", "a dog")], [0, 1]), 12, regression=False)
    ids, types = ds[0]["input_ids"], ds[0]["token_type_ids"]
    b_ids = tok(short_b, add_special_tokens=False)["input_ids"]
    assert n_trunc == 1 and len(ids) == 12
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id and ids.count(tok.sep_token_id) == 2
    assert ids[-1 - len(b_ids):-1] == b_ids  # the short text survives whole: the longer one was cut
    assert types == [0] * (12 - len(b_ids) - 1) + [1] * (len(b_ids) + 1)


def test_tokenizer_saved_without_pair_template_gets_berts(tmp_path):
    bare = PreTrainedTokenizerFast(tokenizer_object=_wordpiece(), cls_token="[CLS]", sep_token="[SEP]",
                                   pad_token="[PAD]", unk_token="[UNK]", mask_token="[MASK]")
    bare.save_pretrained(tmp_path)
    tok = load_tokenizer(str(tmp_path))
    enc = tok("a man", "a dog")
    assert enc["input_ids"][0] == tok.cls_token_id and enc["input_ids"].count(tok.sep_token_id) == 2
    assert enc["token_type_ids"][-1] == 1


def test_gpt2_checkpoint_is_rejected_naming_eval_zeroshot(tmp_path):
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, bos_token_id=0,
                               eos_token_id=0)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="'gpt2' checkpoint.*eval.zeroshot"):
        glue.run_glue(glue.GlueConfig(str(tmp_path), tasks=("rte",)))


def test_missing_checkpoint_and_missing_file_errors_name_the_path(bert_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="no such folder .*nowhere"):
        glue.run_glue(glue.GlueConfig(str(tmp_path / "nowhere"), tasks=("rte",)))
    (tmp_path / "RTE").mkdir()
    with pytest.raises(FileNotFoundError, match=r"RTE/train\.tsv"):
        glue.run_glue(glue.GlueConfig(str(bert_dir), tasks=("rte",), data_dir=str(tmp_path), cpu=True))


def test_label_outside_task_set_names_file_and_line(tmp_path):
    p = tmp_path / "train.tsv"
    p.write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\ta\tb\tmaybe\n")
    with pytest.raises(ValueError, match=r"train\.tsv:3: label 'maybe' not in rte's label set"):
        read_tsv(p, TASKS["rte"])
    p.write_text("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
                 "0\tg\tf\ty\t0\tn\tn\ta\tb\t7.5\n")
    with pytest.raises(ValueError, match=r"train\.tsv:2: STS-B score '7.5'"):
        read_tsv(p, TASKS["stsb"])


def test_max_seq_len_beyond_position_embeddings_is_rejected(bert_dir):
    with pytest.raises(ValueError, match="max_position_embeddings 128"):
        glue.run_glue(glue.GlueConfig(str(bert_dir), tasks=("rte",), max_seq_len=512))


def test_help_explains_recipe_and_truncation(capsys):
    with pytest.raises(SystemExit):
        glue.parse_args(["--help"])
    text = capsys.readouterr().out
    for phrase in ("5e-6,1e-5,2e-5,3e-5,5e-5", "median", "longest-first", "--quick", "offline", "WNLI excluded"):
        assert phrase in text


def test_quick_flag_defaults_yield_to_explicit_flags():
    cfg = glue.config_from_args(glue.parse_args(["--checkpoint", "x", "--quick", "--lrs", "1e-5,2e-5"]))
    assert cfg.lrs == (1e-5, 2e-5) and cfg.seeds == (0,) and cfg.epochs == 1.0 and cfg.max_train_samples == 1000
    full = glue.config_from_args(glue.parse_args(["--checkpoint", "x"]))
    assert full.lrs == glue.LR_GRID and full.seeds == (0, 1, 2) and full.epochs == 5.0 and full.batch_size == 32
    assert full.dropout == 0.1 and full.max_seq_len == 128
    assert glue.config_from_args(glue.parse_args(["--checkpoint", "x", "--dropout", "checkpoint"])).dropout is None


def test_fine_tuning_dropout_overrides_the_checkpoints_unless_kept(bert_dir):
    model = glue.build_model(str(bert_dir), TASKS["stsb"], dropout=0.1)
    assert model.config.hidden_dropout_prob == 0.1 and model.config.attention_probs_dropout_prob == 0.1
    assert model.config.problem_type == "regression" and model.num_labels == 1
    kept = glue.build_model(str(bert_dir), TASKS["mnli"], dropout=None)
    assert kept.config.hidden_dropout_prob == 0.0 and kept.num_labels == 3 and kept.config.id2label[1] == "neutral"


def test_logging_of_skips_is_a_warning(bert_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="eval.glue"):
        res = glue.run_glue(glue.GlueConfig(str(bert_dir), tasks=("qqp",), cpu=True))
    assert res["tasks"] == {} and res["glue_average"] is None
    assert any("skipping qqp" in r.message for r in caplog.records)


@pytest.mark.slow
def test_two_process_run_gathers_exactly_the_dev_set(bert_dir, tmp_path):
    # torchrun, not `accelerate launch --cpu`, which starts one process on CPU (docs/cluster.md)
    out = tmp_path / "mp.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "eval.glue",
           "--checkpoint", str(bert_dir), "--cpu", "--quick", "--tasks", "rte", "--max_train_samples", "16",
           "--max_eval_samples", "21", "--batch_size", "8", "--output", str(out)]
    r = run_tree(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["num_processes"] == 2
    assert res["tasks"]["rte"]["runs"][0]["n_scored"] == {"rte": 21}  # odd size: gather_for_metrics drops padding


def test_qnli_train_comes_from_the_hub_when_online(tmp_path, monkeypatch):
    import datasets

    def fake_load(repo, name):
        assert (repo, name) == ("nyu-mll/glue", "qnli")
        split = {"question": ["Who?", "What?"], "sentence": ["Him.", "That."], "label": [1, 0], "idx": [0, 1]}
        return datasets.DatasetDict({"train": datasets.Dataset.from_dict(split),
                                     "validation": datasets.Dataset.from_dict(split)})
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(var, "0")
    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    (texts, labels), devs = load_task(TASKS["qnli"], tmp_path)
    assert texts == [("Who?", "Him."), ("What?", "That.")] and labels == [1, 0] and set(devs) == {"qnli"}


def test_hub_failure_becomes_a_documented_skip_with_the_reason(tmp_path, monkeypatch):
    import datasets

    def no_network(*a, **k):
        raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub")
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(var, "0")
    monkeypatch.setattr(datasets, "load_dataset", no_network)
    with pytest.raises(OfflineSkip, match="MNLI/train.tsv.*ConnectionError: Couldn't reach"):
        load_task(TASKS["mnli"], tmp_path)
