"""GLUE data for eval.glue: tokenization and batching (the task table, TSV reading and the Hub fallback
are common.glue, shared with train.py's text classification; re-exported here). A task whose train split
needs the network when there is none raises ``OfflineSkip``, logged by eval.glue as a skipped task.

Encoding: ``[CLS] a [SEP] b [SEP]`` with token types 0/1, truncated longest-first to ``max_seq_len``
(one token at a time from the longer text, GLUE standard practice); truncations are counted.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from common.glue import ALIASES, DATA_DIR, HF_GLUE_REPO, TASKS, OfflineSkip, Task, load_task, read_tsv

__all__ = ["ALIASES", "DATA_DIR", "HF_GLUE_REPO", "TASKS", "OfflineSkip", "Task", "load_task", "read_tsv",
           "subsample", "Encoded", "encode", "collate_fn", "load_tokenizer"]
log = logging.getLogger("eval.glue")

def subsample(data: tuple, n: int | None, seed: int = 0) -> tuple:
    """A fixed random subset of ``n`` examples (files are sorted by source, so not the first n)."""
    texts, labels = data
    if n is None or n >= len(labels):
        return data
    keep = np.sort(np.random.default_rng(seed).choice(len(labels), size=n, replace=False))
    return [texts[i] for i in keep], [labels[i] for i in keep]


class Encoded(torch.utils.data.Dataset):
    """Tokenized examples: dicts of input_ids / token_type_ids / attention_mask / labels."""

    def __init__(self, items: list[dict]):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


def encode(tokenizer, data: tuple, max_seq_len: int, regression: bool) -> tuple[Encoded, int]:
    """Tokenize ``(texts, labels)``; truncate longest-first to ``max_seq_len``.

    Returns:
        The dataset and how many examples were truncated.
    """
    texts, labels = data
    cols = list(zip(*texts))
    full = tokenizer(*cols, truncation=False)["input_ids"]
    n_trunc = sum(len(ids) > max_seq_len for ids in full)
    enc = tokenizer(*cols, truncation="longest_first", max_length=max_seq_len)
    keys = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in enc]
    items = [{**{k: enc[k][i] for k in keys}, "labels": float(y) if regression else int(y)}
             for i, y in enumerate(labels)]
    return Encoded(items), n_trunc


def collate_fn(pad_id: int):
    """Pad a batch to its longest example (dynamic padding; pad id for inputs, 0 for types and mask)."""
    def collate(items: list[dict]) -> dict:
        L = max(len(it["input_ids"]) for it in items)
        out = {k: torch.tensor([it[k] + [pad_id if k == "input_ids" else 0] * (L - len(it[k])) for it in items])
               for k in items[0] if k != "labels"}
        out["labels"] = torch.tensor([it["labels"] for it in items])
        return out
    return collate


def load_tokenizer(checkpoint: str, tokenizer: str | None = None):
    """The checkpoint's tokenizer, checked to encode pairs as ``[CLS] a [SEP] b [SEP]`` with token types.

    A fast tokenizer saved without that template (e.g. a bare ``PreTrainedTokenizerFast``) gets BERT's.

    Raises:
        FileNotFoundError: no tokenizer files in the folder.
        ValueError: the tokenizer has no [CLS]/[SEP]/[PAD] tokens.
    """
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    src = tokenizer or checkpoint
    try:
        tok = AutoTokenizer.from_pretrained(src)
    except (OSError, ValueError) as e:
        raise FileNotFoundError(f"no usable tokenizer in {src} ({e}); save one with the checkpoint "
                                "or pass --tokenizer") from e
    if tok.cls_token_id is None or tok.sep_token_id is None or tok.pad_token_id is None:
        raise ValueError(f"tokenizer in {src} lacks [CLS]/[SEP]/[PAD] tokens; GLUE needs a BERT-style tokenizer")
    ids = tok("a", "b")
    if (ids["input_ids"][0] != tok.cls_token_id or ids["input_ids"].count(tok.sep_token_id) != 2
            or "token_type_ids" not in ids):
        cls, sep = tok.cls_token, tok.sep_token
        tok._tokenizer.post_processor = TemplateProcessing(
            single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
            special_tokens=[(cls, tok.cls_token_id), (sep, tok.sep_token_id)])
        tok.model_input_names = ["input_ids", "token_type_ids", "attention_mask"]
        log.info("tokenizer in %s had no [CLS] a [SEP] b [SEP] template; using BERT's", src)
    return tok


