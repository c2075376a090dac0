"""Malformed text sources are refused at the boundary: one line (exit 2, no traceback) naming the file and line (or
the dataset and split) and the field, before anything is tokenized; a null text is no document, in every source."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from common.cli import run_cli
from progressive.config import DataConfig
from progressive.data import build_tokenizer, load_token_blocks
from progressive.data.sources import source_identity
from progressive.data.text import cached_stream

GOOD = [{"text": f"document {i} says hello to the world."} for i in range(3000)]


@pytest.fixture(scope="module")
def gpt2():
    return build_tokenizer(DataConfig(tokenizer="gpt2"))


def _stream(cfg: DataConfig, tok) -> np.ndarray:
    return np.asarray(cached_stream(cfg, tok, "train", cfg.max_tokens, source_identity(cfg)))


def _refused(capsys, work) -> str:
    """The one line that ``run_cli`` prints for ``work()``'s failure (exit code 2, no traceback)."""
    capsys.readouterr()
    assert run_cli(lambda argv: work(), []) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def _jsonl(path, rows: list, last: str | None = None):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + (last + "\n" if last is not None else ""))
    return path


def _saved(tmp_path, splits: dict, features=None) -> str:
    import datasets

    dd = datasets.DatasetDict({k: datasets.Dataset.from_dict(v, features=features) for k, v in splits.items()})
    dd.save_to_disk(str(tmp_path / "saved"))
    return f"hf:{tmp_path / 'saved'}"


# ------------------------------------------------------------------------------------------ null and non-string text


def _null_source(kind: str, tmp_path) -> str:
    texts = ["alpha beta", None, "gamma delta", None]
    if kind == "jsonl":
        return str(_jsonl(tmp_path / "x.jsonl", [{"text": t} for t in texts]))
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": pa.array(texts, type=pa.string())}), tmp_path / "x.parquet")
        return str(tmp_path / "x.parquet")
    return _saved(tmp_path, {"train": {"text": texts}})


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "save_to_disk"])
def test_a_null_text_is_no_document_in_every_source_alike(gpt2, tmp_path, kind):
    """A JSONL row ``{"text": null}`` was trained on as the text "None" (str(None)) while a saved dataset and a
    parquet file skip a null: each source now gives the same stream, the two documents and nothing else."""
    cfg = DataConfig(dataset=_null_source(kind, tmp_path), cache_dir=str(tmp_path / "c"))
    want = gpt2("alpha beta")["input_ids"] + [50256] + gpt2("gamma delta")["input_ids"] + [50256]
    assert _stream(cfg, gpt2).tolist() == want


@pytest.mark.parametrize("value, said", [
    (5, "a number"), (True, "true or false"), (["a b"], "an array"), ({"en": "a b"}, "an object"),
])
def test_a_jsonl_text_that_is_not_a_string_is_refused_naming_the_file_line_and_field(gpt2, tmp_path, capsys,
                                                                                      value, said):
    """``{"text": 5}`` was trained on as the text "5": a value that is not a string (nor null) is refused."""
    path = _jsonl(tmp_path / "x.jsonl", GOOD + [{"text": value}])
    cfg = DataConfig(dataset=str(path), cache_dir=str(tmp_path / "c"))
    line = _refused(capsys, lambda: load_token_blocks(cfg, gpt2))
    assert line == (f"error: {path}:3001: field 'text' (text_field) is {said}, not a string (a null is skipped); "
                    "give every row's text as a JSON string")


def test_a_parquet_text_column_that_is_not_strings_is_refused_naming_the_file_and_column(gpt2, tmp_path, capsys):
    """A parquet column of numbers was trained on as their decimal texts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": list(range(300))}), tmp_path / "x.parquet")
    cfg = DataConfig(dataset=str(tmp_path / "x.parquet"), cache_dir=str(tmp_path / "c"))
    line = _refused(capsys, lambda: load_token_blocks(cfg, gpt2))
    assert line == f"error: {tmp_path / 'x.parquet'}: column 'text' (text_field) holds int64, not strings"


@pytest.mark.parametrize("max_tokens", [None, 1000])  # through Dataset.map, and through the document stream
def test_a_saved_dataset_text_column_that_is_not_strings_is_refused_naming_the_split(gpt2, tmp_path, capsys,
                                                                                       max_tokens):
    """A saved dataset whose text column holds numbers died in the tokenizer ("object of type 'int' has no len()")."""
    dataset = _saved(tmp_path, {"train": {"text": list(range(300))}})
    cfg = DataConfig(dataset=dataset, cache_dir=str(tmp_path / "c"), max_tokens=max_tokens)
    line = _refused(capsys, lambda: load_token_blocks(cfg, gpt2))
    assert line == f"error: dataset={dataset!r} split 'train': column 'text' (text_field) holds int64, not strings"


# ------------------------------------------------------------------------------------------ lines that are not rows


def test_an_invalid_jsonl_line_is_named_by_its_line_in_the_file_and_its_column(gpt2, tmp_path, capsys):
    """JSON's own message said "line 1 column 14" for the file's line 3001 (each line is parsed alone)."""
    path = _jsonl(tmp_path / "x.jsonl", GOOD, last='{"text": "a",}')
    cfg = DataConfig(dataset=str(path), cache_dir=str(tmp_path / "c"))
    line = _refused(capsys, lambda: load_token_blocks(cfg, gpt2))
    assert line == (f"error: {path}:3001: not valid JSON (column 14: Expecting property name enclosed in double "
                    "quotes); each line of a .jsonl file is one JSON object")


@pytest.mark.parametrize("last, said", [("5", "a number"), ("[1]", "an array"), ('"x"', "a string"),
                                        ('"my text"', "a string"), ("null", "null")])
def test_a_jsonl_line_that_is_not_an_object_is_refused_naming_the_file_and_line(gpt2, tmp_path, capsys, last, said):
    """``5`` was a TypeError traceback, ``"my text"`` another ("text" in "my text" is a substring test), ``[1]``
    said "has no field 'text'; fields: [1]"."""
    path = _jsonl(tmp_path / "x.jsonl", GOOD, last=last)
    cfg = DataConfig(dataset=str(path), cache_dir=str(tmp_path / "c"))
    line = _refused(capsys, lambda: load_token_blocks(cfg, gpt2))
    assert line == (f"error: {path}:3001: the line is {said}, not a JSON object; each line of a .jsonl file is one "
                    "object with a 'text' field (text_field)")


def test_a_jsonl_file_that_starts_with_a_byte_order_mark_is_read(gpt2, tmp_path):
    """An editor's UTF-8 byte order mark made the first line "Unexpected UTF-8 BOM": it is not part of the JSON."""
    path = tmp_path / "x.jsonl"
    path.write_text('{"text": "alpha beta"}\n', encoding="utf-8-sig")
    cfg = DataConfig(dataset=str(path), cache_dir=str(tmp_path / "c"))
    assert _stream(cfg, gpt2).tolist() == gpt2("alpha beta")["input_ids"] + [50256]


# ------------------------------------------------------------------------------------------ damaged files


@pytest.mark.parametrize("name", ["x.txt.gz", "x.jsonl.gz"])
@pytest.mark.parametrize("damage", ["not gzip", "truncated"])
def test_a_damaged_gzip_file_is_refused_naming_it(gpt2, tmp_path, capsys, name, damage):
    """A .gz that is not gzip (BadGzipFile) or is cut short (EOFError) was a traceback."""
    body = "".join(json.dumps(r) + "\n" for r in GOOD).encode()
    data = body if damage == "not gzip" else gzip.compress(body)[:2000]
    (tmp_path / name).write_bytes(data)
    cfg = DataConfig(dataset=str(tmp_path / name), cache_dir=str(tmp_path / "c"))
    line = _refused(capsys, lambda: load_token_blocks(cfg, gpt2))
    why = ("Not a gzipped file (b'{\"')" if damage == "not gzip"
           else "Compressed file ended before the end-of-stream marker was reached")
    assert line == f"error: {tmp_path / name}: not a whole gzip file ({why}); replace it or remove it from the data"


@pytest.mark.parametrize("data, why", [
    (b"", "Parquet file size is 0 bytes"),
    (b"not parquet at all " * 8, "Parquet magic bytes not found in footer. Either the file is corrupted or this is "
                                 "not a parquet file."),
], ids=["empty", "not parquet"])
def test_a_damaged_parquet_file_is_refused_naming_it(gpt2, tmp_path, capsys, data, why):
    """pyarrow's message named no file."""
    (tmp_path / "x.parquet").write_bytes(data)
    cfg = DataConfig(dataset=str(tmp_path / "x.parquet"), cache_dir=str(tmp_path / "c"))
    line = _refused(capsys, lambda: load_token_blocks(cfg, gpt2))
    assert line == f"error: {tmp_path / 'x.parquet'}: not a readable parquet file ({why})"


@pytest.mark.parametrize("what", ["an empty .txt", "an empty .jsonl", "blank lines and nulls"])
def test_a_source_with_no_text_is_refused_saying_so(gpt2, tmp_path, capsys, what):
    """An empty file said "too little data: 0 tokens make 0 blocks ...; raise max_tokens or lower seq_len": no
    setting helps a source that holds no text, so the message says what it is."""
    path = tmp_path / ("x.txt" if what == "an empty .txt" else "x.jsonl")
    path.write_text('\n{"text": null}\n\n{"text": ""}\n' if what == "blank lines and nulls" else "")
    cfg = DataConfig(dataset=str(path), cache_dir=str(tmp_path / "c"))
    line = _refused(capsys, lambda: load_token_blocks(cfg, gpt2))
    assert line == f"error: dataset={str(path)!r} holds no text (0 tokens): every document is empty"


# ------------------------------------------------------------------------------------------ saved datasets


@pytest.mark.parametrize("empty", ["train", "validation"])
def test_a_saved_dataset_with_a_split_of_0_rows_is_refused_naming_the_dataset_and_split(gpt2, tmp_path, capsys,
                                                                                          empty):
    """datasets.load_from_disk died of an IndexError in concat_tables on a saved split without rows."""
    import datasets

    features = datasets.Features({"text": datasets.Value("string")})
    rows = {"text": [d["text"] for d in GOOD[:300]]}
    dataset = _saved(tmp_path, {"train": rows if empty != "train" else {"text": []},
                                "validation": rows if empty != "validation" else {"text": []}}, features)
    cfg = DataConfig(dataset=dataset, cache_dir=str(tmp_path / "c"))
    line = _refused(capsys, lambda: load_token_blocks(cfg, gpt2))
    assert line == (f"error: dataset={dataset!r} split {empty!r} has 0 rows; give it rows, or remove that split "
                    f"from the saved dataset ({tmp_path / 'saved' / empty})")


def test_a_loaded_dataset_whose_train_split_has_0_rows_is_refused_naming_it(gpt2, tmp_path, capsys, monkeypatch):
    """A 0-row train split from the Hub (the load seam) said "too little data ...; raise max_tokens"."""
    import datasets

    import progressive.data.sources as sources

    empty = datasets.Dataset.from_dict({"text": []}, features=datasets.Features({"text": datasets.Value("string")}))
    monkeypatch.setattr(sources, "load_hf_dataset", lambda name, config: datasets.DatasetDict({"train": empty}))
    cfg = DataConfig(dataset="hf:someone/corpus", cache_dir=str(tmp_path / "c"))
    line = _refused(capsys, lambda: load_token_blocks(cfg, gpt2))
    assert line == "error: dataset='hf:someone/corpus' split 'train' has 0 rows"


def test_a_damaged_saved_dataset_is_refused_naming_the_folder(gpt2, tmp_path, capsys):
    """A save_to_disk folder whose state.json is cut short gave json's "Expecting value" naming nothing."""
    dataset = _saved(tmp_path, {"train": {"text": [d["text"] for d in GOOD[:300]]}})
    state = tmp_path / "saved" / "train" / "state.json"
    state.write_text(state.read_text()[:20])
    cfg = DataConfig(dataset=dataset, cache_dir=str(tmp_path / "c"))
    line = _refused(capsys, lambda: load_token_blocks(cfg, gpt2))
    assert line.startswith(f"error: dataset={dataset!r}: the saved dataset {tmp_path / 'saved'} cannot be read "
                           f"({state}: not valid JSON")


@pytest.mark.parametrize("name", ["nltk_inaugural.tar.gz", "tinyshakespeare.txt.gz"])
def test_a_damaged_bundled_corpus_file_is_refused_naming_it(gpt2, tmp_path, capsys, monkeypatch, name):
    """A bundled archive cut short (a broken copy of the checkout) was an EOFError or ReadError traceback."""
    import progressive.data.sources as sources

    data = (sources.BUNDLED_CORPUS / name).read_bytes()
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / name).write_bytes(data[:4000])
    monkeypatch.setattr(sources, "BUNDLED_CORPUS", tmp_path / "corpus")
    line = _refused(capsys, lambda: load_token_blocks(DataConfig(cache_dir=str(tmp_path / "c")), gpt2))
    assert line.startswith(f"error: bundled corpus file {tmp_path / 'corpus' / name} is damaged (")
    assert line.endswith(f"); restore it from the repository (data/corpus/{name})")
