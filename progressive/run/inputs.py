"""A run's inputs: the training, validation and test splits of its data, the tokenizer or image processor,
the content fingerprint a resume is checked against, and the batch of any step (the data itself is
progressive/data/). ``RunData.load`` builds them once; the trainer and the pipeline engine hold the result.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from progressive import data as pdata
from progressive.config import ConfigError, RunConfig
from progressive.data import batch_indices
from progressive.model.build import DataInfo, Family, image_processor, make_batch

__all__ = ["RunData", "DATA_IDENTITY"]

DATA_IDENTITY = "content:"  # prefix of data fingerprints made from file contents (earlier ones: paths + mtimes)


@dataclass
class RunData:
    """The splits (``test`` only for text pre-training with ``data.test_fraction > 0``), their sizes, what the
    model needs to know of them (``info``: vocabulary, special tokens, labels), the tokenizer or image
    processor, and the fingerprint of their content."""

    family: Family
    train: Any
    val: Any
    test: Any
    info: DataInfo
    processor: Any
    fingerprint: str

    @property
    def n_train(self) -> int:
        """Training samples."""
        return _size(self.train)

    @property
    def n_val(self) -> int:
        """Validation samples."""
        return _size(self.val)

    @classmethod
    def load(cls, cfg: RunConfig, family: Family) -> RunData:
        """Load the run's data (each cache entry built once, by whichever process needs it first; the others wait for
        it and read it: progressive.data.cache.building).

        Raises:
            ConfigError: a test split asked of a run that has none; a vocabulary smaller than the tokenizer's;
                a batch larger than the training split. Errors of progressive.data name the path.
        """

        d, m = cfg.data, cfg.model
        if d.test_fraction and not (family.is_text and family.objective != "seqcls"):
            raise ConfigError("data.test_fraction: a test split is built for text pre-training (token blocks) only; "
                              "set it to 0 for image and classification runs")
        # every process loads at once: a cache entry is built by whichever comes first, while the others wait on its
        # lock (progressive.data.cache.building), never at a collective whose timeout a long tokenization outlasts
        if family.objective == "seqcls":
            tok = _tokenizer(cfg, family)
            train = pdata.load_classify_split(d, "train", tok)
            val = pdata.load_classify_split(d, "validation", tok)
            info = DataInfo(m.vocab_size or len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id,
                            num_labels=train.num_labels)
            out = cls(family, train, val, None, info, tok, f"{DATA_IDENTITY}{train.path.name}+{val.path.name}")
        elif family.is_text:
            tok = _tokenizer(cfg, family)
            blocks = pdata.load_token_blocks(d, tok)
            vocab = m.vocab_size or len(tok)
            if vocab < len(tok):
                raise ConfigError(f"model.vocab_size: {vocab} < the tokenizer's {len(tok)} tokens")
            info = DataInfo(vocab, tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
            # the blocks' cache key covers the source's identity, the tokenizer's content and the cut
            out = cls(family, blocks.train, blocks.val, blocks.test, info, tok, DATA_IDENTITY + blocks.path.name)
        else:
            proc = image_processor(cfg)
            train = pdata.load_image_split(d, "train", proc)
            val = pdata.load_image_split(d, "validation", proc)
            info = DataInfo(num_labels=train.num_labels, image_size=d.image_size)
            out = cls(family, train, val, None, info, proc, f"{DATA_IDENTITY}{train.path.name}+{val.path.name}")
        if out.n_train < cfg.train.batch_size:
            raise ConfigError(f"train.batch_size: {cfg.train.batch_size} > the {out.n_train} training samples")
        return out

    def batch(self, source: Any, idx: np.ndarray, seed: int, rows: slice | None = None) -> dict[str, torch.Tensor]:
        """The batch of samples ``idx`` of ``source`` (``rows``: only those rows of it); BERT's masks are drawn
        from ``seed`` for the whole batch, so a slice is the same rows of the whole."""
        gen = torch.Generator().manual_seed(seed) if self.family.objective == "mlm" else None
        return make_batch(self.family, source, idx, self.processor, gen, rows=rows)

    def step_batch(self, cfg: RunConfig, step: int, rank: int,
                   world: int) -> tuple[np.ndarray, dict[str, torch.Tensor]]:
        """(the global batch's sample indices, process ``rank``'s rows of it) for training step ``step``: a pure
        function of (seed, step), whatever the world size (progressive.run.feed builds it ahead)."""
        t = cfg.train
        ids = batch_indices(self.n_train, t.batch_size, t.seed, step)
        share = t.batch_size // world
        return ids, self.batch(self.train, ids, seed=t.seed * 1_000_003 + step,
                               rows=slice(rank * share, (rank + 1) * share))


def _size(split: Any) -> int:
    return len(split) if isinstance(split, np.ndarray) else len(split.labels)


def _tokenizer(cfg: RunConfig, family: Family) -> Any:
    """data.tokenizer's, or the checkpoint's own when starting from model.init_from (its vocabulary). A
    tokenizer trained here ("bpe", "wordpiece") learns from the bundled corpus when the dataset is a
    classification task (labelled pairs are no corpus)."""

    d = cfg.data
    if cfg.model.init_from is not None:
        return pdata.build_tokenizer(replace(d, tokenizer=cfg.model.init_from))
    if family.objective == "seqcls" and d.tokenizer in pdata.TRAINED_TOKENIZERS:
        return pdata.build_tokenizer(replace(d, dataset="bundled"))
    return pdata.build_tokenizer(d)
