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

__all__ = ["RunData", "DATA_IDENTITY", "block_sizes", "sizes_line"]

DATA_IDENTITY = "content:"  # prefix of data fingerprints made from file contents (earlier ones: paths + mtimes)


@dataclass
class RunData:
    """The splits (``test`` only for text pre-training with ``data.test_fraction > 0``), their sizes, what the
    model needs to know of them (``info``: vocabulary, special tokens, labels), the tokenizer or image
    processor, the fingerprint of their content, and the blocks' cache entry (text pre-training: its tokens)."""

    family: Family
    train: Any
    val: Any
    test: Any
    info: DataInfo
    processor: Any
    fingerprint: str
    blocks: Any = None  # progressive.data.TokenBlocks of a text pre-training run, else None

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
            out = cls(family, blocks.train, blocks.val, blocks.test, info, tok, DATA_IDENTITY + blocks.path.name,
                      blocks)
        else:
            proc = image_processor(cfg)
            train = pdata.load_image_split(d, "train", proc)
            val = pdata.load_image_split(d, "validation", proc)
            info = DataInfo(num_labels=train.num_labels, image_size=d.image_size)
            out = cls(family, train, val, None, info, proc, f"{DATA_IDENTITY}{train.path.name}+{val.path.name}")
        if out.n_train < cfg.train.batch_size:
            raise ConfigError(f"train.batch_size: {cfg.train.batch_size} > the {out.n_train} training samples")
        return out

    def sizes(self, steps: int, batch_size: int) -> dict[str, Any]:
        """What the run trains on and how often the plan reads it (summary.json's ``data``; ``sizes_line``): for
        text pre-training the corpus's tokens and its train / val / test blocks (``block_sizes``), else the train
        and val examples; and the epochs that ``steps`` optimizer steps of ``batch_size`` samples make."""
        if self.blocks is not None:
            return block_sizes(self.blocks, steps, batch_size)
        return {"train_examples": self.n_train, "val_examples": self.n_val, "planned_steps": steps,
                "batch_size": batch_size, "epochs": round(steps * batch_size / self.n_train, 4)}

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


def block_sizes(blocks: Any, steps: int, batch_size: int) -> dict[str, Any]:
    """The corpus's size as ``blocks`` (progressive.data.TokenBlocks) holds it: the tokens it was cut from, the
    tokens a block holds, its train / val / test blocks, and the epochs of the training blocks that ``steps``
    optimizer steps of ``batch_size`` blocks read."""
    train = len(blocks.train)
    return {"tokens": int(blocks.n_tokens), "block_tokens": int(blocks.seq_len), "train_blocks": train,
            "val_blocks": len(blocks.val), "test_blocks": 0 if blocks.test is None else len(blocks.test),
            "planned_steps": steps, "batch_size": batch_size, "epochs": round(steps * batch_size / train, 4)}


def sizes_line(sizes: dict[str, Any]) -> str:
    """One line of ``RunData.sizes`` (or ``block_sizes``): "40,000 tokens in blocks of 32: 1,100 train / 121 val /
    0 test; the plan's 300 steps of 8 blocks read 2.18 epochs of the training blocks"."""
    s = sizes
    plan = f"the plan's {s['planned_steps']:,} steps of {s['batch_size']:,}"
    if "tokens" in s:
        return (f"{s['tokens']:,} tokens in blocks of {s['block_tokens']}: {s['train_blocks']:,} train / "
                f"{s['val_blocks']:,} val / {s['test_blocks']:,} test; {plan} blocks read {s['epochs']:.3g} epochs "
                "of the training blocks")
    return (f"{s['train_examples']:,} train / {s['val_examples']:,} val examples; {plan} read {s['epochs']:.3g} "
            "epochs of the training examples")


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
