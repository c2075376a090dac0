"""Data at scale: parquet sources read a row group at a time, recipes name loadable datasets."""

import io
import json
from pathlib import Path

import pytest

from progressive.config import DataConfig
from progressive.data.sources import read_documents, source_identity

ROOT = Path(__file__).resolve().parents[3]


def _parquet(path, texts, column="text"):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({column: texts, "id": list(range(len(texts)))}), path, row_group_size=2)


def test_a_local_parquet_dump_reads_one_document_per_row_in_order(tmp_path):
    folder = tmp_path / "wiki"
    folder.mkdir()
    _parquet(folder / "train-00000-of-00002.parquet", ["Anarchism is a political philosophy.", "", "Albedo."])
    _parquet(folder / "train-00001-of-00002.parquet", ["A is the first letter.", "Alabama is a state."])
    cfg = DataConfig(dataset=str(folder), text_field="text")
    docs = list(read_documents(cfg))
    assert [t for _, t in docs] == ["Anarchism is a political philosophy.", "Albedo.", "A is the first letter.",
                                    "Alabama is a state."]  # the empty row is skipped, files in name order
    ident = source_identity(cfg)["files"]
    assert len(ident) == 2  # content digests of both files


def test_a_parquet_file_without_the_text_column_is_named(tmp_path):
    _parquet(tmp_path / "x.parquet", ["a"], column="body")
    with pytest.raises(ValueError, match=r"x.parquet has no column 'text' \(text_field\); columns: \['body', 'id'\]"):
        list(read_documents(DataConfig(dataset=str(tmp_path / "x.parquet"), text_field="text")))


def test_no_recipe_names_the_script_based_wikipedia_dataset():
    # datasets 5.x cannot load script datasets; wikimedia/wikipedia is the parquet dump on the Hub
    for recipe in (ROOT / "launch" / "recipes").glob("*.yaml"):
        text = recipe.read_text()
        assert "hf:wikipedia:" not in text, recipe


def test_token_ids_take_two_bytes_when_the_vocabulary_fits_and_four_when_not():
    import numpy as np

    from progressive.data.text import token_dtype

    class Tok:
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

    assert token_dtype(Tok(50257)) == np.uint16 and token_dtype(Tok(65536)) == np.uint16
    assert token_dtype(Tok(65537)) == np.uint32  # e.g. Llama 3's 128k vocabulary


def test_the_stream_is_written_as_it_is_tokenized_and_cut_exactly(tmp_path):

    import numpy as np

    from progressive.config import DataConfig as DC
    from progressive.data import build_tokenizer
    from progressive.data.text import tokenize_stream

    gpt2 = build_tokenizer(DC(tokenizer="gpt2"))
    docs = [(str(i), f"document {i} " * 50) for i in range(30)]
    whole = tokenize_stream(docs, gpt2, 50256, 1000, dtype=np.uint16)
    buf = io.BytesIO()
    n = tokenize_stream(docs, gpt2, 50256, 1000, out=buf, dtype=np.uint16)
    assert n == 1000 == len(whole)
    assert np.array_equal(np.frombuffer(buf.getvalue(), dtype=np.uint16), whole)


def test_blocks_are_filled_a_chunk_at_a_time_from_the_stream(monkeypatch):
    import numpy as np

    import progressive.data.text as dt

    class Tok:
        cls_token_id, sep_token_id = 1, 2

    monkeypatch.setattr(dt, "_BLOCK_CHUNK", 3)  # several chunks for 10 blocks
    stream = np.arange(100, 100 + 10 * 8 + 5, dtype=np.uint16)
    ids = np.array([0, 2, 3, 5, 6, 9, 1])
    causal = dt.pack_blocks(stream, 8, "causal", Tok(), ids)
    assert causal.dtype == np.uint16 and np.array_equal(causal, stream[:80].reshape(10, 8)[ids])
    bert = dt.pack_blocks(stream, 10, "bert", Tok(), ids)
    assert np.array_equal(bert[:, 1:-1], stream[:80].reshape(10, 8)[ids])
    assert (bert[:, 0] == 1).all() and (bert[:, -1] == 2).all()


@pytest.mark.slow
def test_two_tokenizing_processes_give_the_same_stream(tmp_path):
    import numpy as np

    from progressive.config import DataConfig as DC
    from progressive.data import build_tokenizer
    from progressive.data.text import tokenize_stream

    gpt2 = build_tokenizer(DC(tokenizer="gpt2"))
    docs = [(str(i), f"paragraph {i}: " + "the quick brown fox jumps over the lazy dog. " * 200) for i in range(60)]
    import progressive.data.text as dt

    old = dt._BATCH_CHARS
    dt._BATCH_CHARS = 20_000  # many batches, so both workers get several
    try:
        one = tokenize_stream(docs, gpt2, 50256, None, dtype=np.uint16)
        two = tokenize_stream(docs, gpt2, 50256, None, dtype=np.uint16, num_proc=2)
        cut = tokenize_stream(docs, gpt2, 50256, 5000, dtype=np.uint16, num_proc=2)
    finally:
        dt._BATCH_CHARS = old
    assert len(one) > 100_000 and np.array_equal(one, two) and np.array_equal(cut, one[:5000])


def test_a_test_split_is_held_out_beside_the_same_validation_blocks(tmp_path):
    import numpy as np

    from progressive.config import DataConfig as DC
    from progressive.data import build_tokenizer, load_token_blocks

    cache = str(ROOT / ".cache" / "data")
    tok = build_tokenizer(DC(cache_dir=cache))
    plain = load_token_blocks(DC(cache_dir=cache, max_tokens=60_000, seq_len=64), tok)
    split = load_token_blocks(DC(cache_dir=cache, max_tokens=60_000, seq_len=64, test_fraction=0.1), tok)
    assert plain.test is None  # no test split unless asked: caches and runs as before
    n = len(plain.train) + len(plain.val)
    assert len(split.test) == round(0.1 * n) and len(split.train) + len(split.test) == len(plain.train)
    assert np.array_equal(split.val_ids, plain.val_ids)  # validation blocks unchanged
    ids = [set(split.train_ids.tolist()), set(split.val_ids.tolist()), set(split.test_ids.tolist())]
    assert not (ids[0] & ids[2]) and not (ids[1] & ids[2]) and len(ids[0] | ids[1] | ids[2]) == n


def test_a_run_with_a_test_split_reports_its_loss_once_at_the_end(tmp_path):

    from progressive.run.trainer import Trainer
    from tests.train_utils import rows, tiny_cfg

    cfg = tiny_cfg(tmp_path, method="baseline", train__steps=4, data__test_fraction=0.05)
    Trainer(cfg).run()
    summary = json.loads((cfg.run_dir / "summary.json").read_text())
    assert summary["test_samples"] > 0 and summary["final_test_loss"] > 0
    assert summary["final_test_loss"] != summary["final_val_loss"]
    assert all(r["kind"] in ("train", "val") for r in rows(cfg.run_dir))  # never logged while training


def test_test_fraction_is_checked(tmp_path):
    from progressive.config import ConfigError, validate
    from tests.train_utils import tiny_cfg

    with pytest.raises(ConfigError, match="data.test_fraction"):
        validate(tiny_cfg(tmp_path, data__test_fraction=0.99))
