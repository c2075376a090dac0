"""Data at scale: parquet sources read a row group at a time, recipes name loadable datasets."""

from pathlib import Path

import pytest

from progressive.data.config import DataConfig
from progressive.data.sources import read_documents, source_identity

ROOT = Path(__file__).resolve().parents[1]


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
