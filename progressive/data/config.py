"""Where the training data comes from and how it is cut: ``DataConfig`` (the ``data:`` section of a recipe)."""

from __future__ import annotations

from dataclasses import dataclass

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

    dataset: str = "bundled"
    text_field: str = "text"
    text_pair_field: str | None = None
    label_field: str = "label"
    tokenizer: str = "gpt2"
    vocab_size: int = 8192
    seq_len: int = 128
    val_fraction: float = 0.02
    test_fraction: float = 0.0
    seed: int = 0
    cache_dir: str = ".cache/data"
    max_tokens: int | None = None
    image_size: int = 32
    max_images: int | None = None
    num_proc: int = 1
