"""Where the training data comes from and how it is cut: ``DataConfig`` (the ``data:`` section of a recipe)."""

from __future__ import annotations

from dataclasses import dataclass

from progressive.config.fields import check_choices, check_ranges, setting
from progressive.config.reader import ConfigError

__all__ = ["DataConfig"]


@dataclass
class DataConfig:
    """Where the data comes from and how it is cut.

    dataset: "bundled" (data/corpus) | path to a .txt/.jsonl/.parquet file or folder (.gz allowed) |
        "hf:<name>[:<config>]" (datasets.load_dataset, or a datasets.save_to_disk folder);
        images: "cifar10" (bundled JPEGs) | "hf:<name>[:<config>]" | local image folder (class subfolders).
        text classification (model.task classify): "glue:<task>" (bundled GLUE TSVs) | "hf:<name>[:<config>]".
    text_field: the text column of .jsonl files and Hugging Face datasets.
    text_pair_field: text classification: the second text column of a Hugging Face dataset (pairs), or None.
    label_field: text classification: the class column of a Hugging Face dataset.
    tokenizer: "gpt2" (bundled BPE files) | "bpe" | "wordpiece" (trained on the corpus, cached) |
        a Hugging Face tokenizer name or local folder.
    vocab_size: target vocabulary of trained tokenizers ("bpe", "wordpiece"); ignored otherwise.
    seq_len: tokens per block (for WordPiece/BERT blocks this includes [CLS] and [SEP]).
    val_fraction: share of blocks (or images, for image folders without a split) held out, chosen by seed.
    test_fraction: text pre-training only: a further share of blocks held out as a test split that nothing is
        tuned on (0: none). The validation blocks are the same as without it (the same seeded permutation).
    seed: the split and the sub-sampling seed.
    cache_dir: where tokenizers, token streams, blocks and decoded images are cached.
    max_tokens: cap on corpus tokens (laptop/CI runs); also caps the text a tokenizer is trained on.
    image_size: side of the images the image processor should produce (the trainer passes it to the processor).
    max_images: cap on images per split, sub-sampled deterministically and stratified by class.
    num_proc: processes that tokenize a corpus (1: this one; the Rust tokenizer may still use its threads).
        The token stream is the same for any value.
    """

    dataset: str = setting("bundled", "tuning", path=True)
    text_field: str = setting("text", "numbers")
    text_pair_field: str | None = setting(None, "numbers")
    label_field: str = setting("label", "numbers")
    tokenizer: str = setting("gpt2", "tuning", path=True)
    vocab_size: int = setting(8192, "numbers", at_least=1)
    seq_len: int = setting(128, "numbers", at_least=2, at_most=1 << 20)
    val_fraction: float = setting(0.02, "numbers")
    test_fraction: float = setting(0.0, "numbers")
    seed: int = setting(0, "numbers", limits="a seed in 0 .. 2**32 - 1", at_least=0, at_most=2**32 - 1)
    cache_dir: str = setting(".cache/data", "records", path=True)
    max_tokens: int | None = setting(None, "numbers", at_least=1)
    image_size: int = setting(32, "numbers", at_least=1)
    max_images: int | None = setting(None, "numbers", at_least=1)
    num_proc: int = setting(1, "speed", at_least=1, at_most=1_024)

    def validate(self, where: str = "data") -> None:
        """Raise ConfigError naming ``where.<field>`` for a value that cannot work (needs no data)."""
        check_choices(self, where)
        check_ranges(self, where)
        if not 0 < self.val_fraction < 1:
            raise ConfigError(f"{where}.val_fraction: must be in (0, 1): validation losses need held-out data, got "
                              f"{self.val_fraction}")
        if not (0 <= self.test_fraction < 1 and self.val_fraction + self.test_fraction < 1):
            raise ConfigError(f"{where}.test_fraction: in [0, 1) with val_fraction + test_fraction < 1, got "
                              f"{self.test_fraction}")
