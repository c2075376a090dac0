"""A run's inputs: the training and validation splits of its data, the tokenizer or image processor, and the
batch of any step (the trainer's part; the data itself is progressive/data/).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from progressive.config import ConfigError
from progressive.data import batch_indices
from progressive.model.build import make_batch
from progressive.run.state import DATA_IDENTITY

__all__ = ["RunInputs"]


class RunInputs:
    """Loading the run's data (a mixin: it uses the trainer's cfg, family, acc)."""

    def _load_data(self) -> None:
        from progressive import data as pdata
        from progressive.model.build import DataInfo, image_processor

        d, m = self.cfg.data, self.cfg.model
        self.test_data = None  # text pre-training with data.test_fraction > 0 only
        if d.test_fraction and not (self.family.is_text and self.family.objective != "seqcls"):
            raise ConfigError("data.test_fraction: a test split is built for text pre-training (token blocks) only; "
                              "set it to 0 for image and classification runs")
        with self.acc.main_process_first():  # caches are built once, then read by the other ranks
            if self.family.objective == "seqcls":
                self.processor = self._tokenizer()
                self.train_data = pdata.load_classify_split(d, "train", self.processor)
                self.val_data = pdata.load_classify_split(d, "validation", self.processor)
                tok = self.processor
                self.info = DataInfo(m.vocab_size or len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id,
                                     num_labels=self.train_data.num_labels)
                self.data_fingerprint = f"{DATA_IDENTITY}{self.train_data.path.name}+{self.val_data.path.name}"
            elif self.family.is_text:
                self.processor = self._tokenizer()
                blocks = pdata.load_token_blocks(d, self.processor)
                self.train_data, self.val_data, self.test_data = blocks.train, blocks.val, blocks.test
                vocab = m.vocab_size or len(self.processor)
                if vocab < len(self.processor):
                    raise ConfigError(f"model.vocab_size: {vocab} < the tokenizer's {len(self.processor)} tokens")
                tok = self.processor
                self.info = DataInfo(vocab, tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
                # the blocks' cache key covers the source's identity, the tokenizer's content and the cut
                self.data_fingerprint = DATA_IDENTITY + blocks.path.name
            else:
                self.processor = image_processor(self.cfg)
                self.train_data = pdata.load_image_split(d, "train", self.processor)
                self.val_data = pdata.load_image_split(d, "validation", self.processor)
                self.info = DataInfo(num_labels=self.train_data.num_labels, image_size=d.image_size)
                self.data_fingerprint = f"{DATA_IDENTITY}{self.train_data.path.name}+{self.val_data.path.name}"
        size = (lambda x: len(x) if isinstance(x, np.ndarray) else len(x.labels))  # noqa: E731
        self.n_train, self.n_val = size(self.train_data), size(self.val_data)
        if self.n_train < self.cfg.train.batch_size:
            raise ConfigError(f"train.batch_size: {self.cfg.train.batch_size} > the {self.n_train} training samples")

    def _tokenizer(self) -> Any:
        """data.tokenizer's, or the checkpoint's own when starting from model.init_from (its vocabulary).
        A tokenizer trained here ("bpe", "wordpiece") learns from the bundled corpus when the dataset is a
        classification task (labelled pairs are no corpus)."""
        from dataclasses import replace

        from progressive import data as pdata

        d = self.cfg.data
        if self.cfg.model.init_from is not None:
            return pdata.build_tokenizer(replace(d, tokenizer=self.cfg.model.init_from))
        if self.family.objective == "seqcls" and d.tokenizer in pdata.TRAINED_TOKENIZERS:
            return pdata.build_tokenizer(replace(d, dataset="bundled"))
        return pdata.build_tokenizer(d)

    def _batch(self, source: Any, idx: np.ndarray, seed: int, rows: slice | None = None) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed) if self.family.objective == "mlm" else None
        return make_batch(self.family, source, idx, self.processor, gen, rows=rows)

    def _rank_batch(self, step: int) -> tuple[np.ndarray, dict[str, torch.Tensor]]:
        """(the global batch's sample indices, this process's rows of it) for training step ``step``: a pure
        function of (seed, step), whatever the world size (progressive.run.feed builds it ahead)."""
        t = self.cfg.train
        ids = batch_indices(self.n_train, t.batch_size, t.seed, step)
        share = t.batch_size // self.acc.num_processes
        rows = slice(self.acc.process_index * share, (self.acc.process_index + 1) * share)
        return ids, self._batch(self.train_data, ids, seed=t.seed * 1_000_003 + step, rows=rows)
