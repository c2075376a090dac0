"""Model families as data: how to build the Hugging Face config and model, which objective, what a batch is.

``FAMILIES`` lists the families that train; their classes are their rows of progressive.model.flops.ARCHITECTURES
(the one table of classes by model_type, with the heads the FLOPs count). The trainer asks a ``Family`` for a
model, a batch and the tokens per sample; the operators (operators/) know the parameter layouts. Objectives:
``clm`` (causal LM: labels = inputs, shifted inside the model), ``mlm`` (BERT masked LM, 15% masking,
80/10/10, no NSP), ``cls`` (image classification, cross-entropy on the label), ``seqcls`` (text
classification, ``model.task: classify``: BERT's pooled [CLS]; GPT-2 and Llama score the last non-pad
token). ``model.init_from`` starts from a Hugging Face checkpoint (a folder, or a Hub id online) instead
of a random initialisation: its config defines the shape, a new classification head is initialised when
the checkpoint has none or another label count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from transformers import (
    AutoConfig,
    BertConfig,
    DeiTConfig,
    GPT2Config,
    LlamaConfig,
    PretrainedConfig,
    ViTConfig,
)

from common.hf_folder import HEADS, CheckpointFolderError, check_checkpoint_folder, check_fits, load_weights
from common.hub import HubUnavailable, hub_call
from progressive.config import ConfigError, ModelConfig, RunConfig
from progressive.data.batches import mlm_mask
from progressive.data.images import make_image_processor
from progressive.model import loss
from progressive.model.attention import CAUSAL_SDPA
from progressive.model.flops import ARCHITECTURES, CLASSIFIES_TEXT, model_flops


@dataclass(frozen=True)
class DataInfo:
    """What a model config needs from the data: vocabulary and special ids (text) or labels (images)."""

    vocab_size: int = 0
    bos_id: int | None = None
    eos_id: int | None = None
    pad_id: int | None = None
    num_labels: int = 0
    image_size: int = 32


def _ffn(m: ModelConfig, ratio: float = 4.0, multiple: int = 1) -> int:
    if m.intermediate_size is not None:
        return m.intermediate_size
    return int(round(m.hidden_size * ratio / multiple)) * multiple


def _gpt2(m: ModelConfig, info: DataInfo, seq_len: int) -> PretrainedConfig:
    eos = info.eos_id if info.eos_id is not None else 0
    return GPT2Config(
        vocab_size=info.vocab_size, n_positions=m.max_position or seq_len, n_embd=m.hidden_size,
        n_layer=m.num_layers, n_head=m.num_heads, n_inner=_ffn(m), resid_pdrop=m.dropout,
        embd_pdrop=m.dropout, attn_pdrop=m.dropout, bos_token_id=info.bos_id if info.bos_id is not None else eos,
        eos_token_id=eos, tie_word_embeddings=m.tie_word_embeddings,
        # GPT-2's tanh GELU as one kernel: the same function as its "gelu_new" (eight element-wise kernels in eager
        # mode), to rounding (tests/unit/model/test_loss.py)
        activation_function="gelu_pytorch_tanh",
    )


def _llama(m: ModelConfig, info: DataInfo, seq_len: int) -> PretrainedConfig:
    return LlamaConfig(
        vocab_size=info.vocab_size, hidden_size=m.hidden_size, intermediate_size=_ffn(m, 8 / 3, 32),
        num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
        num_key_value_heads=m.num_kv_heads or m.num_heads, max_position_embeddings=m.max_position or seq_len,
        attention_dropout=m.dropout, tie_word_embeddings=m.tie_word_embeddings,
        bos_token_id=info.bos_id, eos_token_id=info.eos_id, pad_token_id=info.pad_id,
    )


def _bert(m: ModelConfig, info: DataInfo, seq_len: int) -> PretrainedConfig:
    return BertConfig(
        vocab_size=info.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads, intermediate_size=_ffn(m), hidden_dropout_prob=m.dropout,
        attention_probs_dropout_prob=m.dropout, max_position_embeddings=m.max_position or seq_len,
        pad_token_id=info.pad_id if info.pad_id is not None else 0, tie_word_embeddings=m.tie_word_embeddings,
    )


def _vision(config_cls: type) -> Callable[[ModelConfig, DataInfo, int], PretrainedConfig]:
    def build(m: ModelConfig, info: DataInfo, seq_len: int) -> PretrainedConfig:
        size = info.image_size
        if size % m.patch_size:
            raise ConfigError(f"model.patch_size: {m.patch_size} does not divide the image size {size}")
        return config_cls(
            hidden_size=m.hidden_size, num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
            intermediate_size=_ffn(m), hidden_dropout_prob=m.dropout, attention_probs_dropout_prob=m.dropout,
            image_size=size, patch_size=m.patch_size, num_channels=3, num_labels=info.num_labels,
            id2label={i: str(i) for i in range(info.num_labels)}, label2id={str(i): i for i in range(info.num_labels)},
        )
    return build


@dataclass(frozen=True)
class Family:
    """One model family for one task: config builder, model class, objective, the tokens one sample costs.

    ``classifier_cls``: the text family's sequence-classification class (``model.task: classify``);
    ``model_types``: the checkpoint model_types it loads with ``model.init_from``; ``token_types``: whether
    its inputs carry token type ids (BERT's segment embeddings)."""

    name: str
    objective: str  # "clm" | "mlm" | "cls" | "seqcls"
    build_config: Callable[[ModelConfig, DataInfo, int], PretrainedConfig]
    model_cls: type
    extra_tokens: int = 0  # vision: [CLS] (+ distillation) tokens on top of the patches
    classifier_cls: type | None = None
    model_types: tuple[str, ...] = ()
    token_types: bool = False
    # the linear layer over the vocabulary and what runs between the body and it (progressive.model.loss);
    # None: the loss is the model's own (classification heads)
    head: tuple[str, str | None] | None = None

    @property
    def is_text(self) -> bool:
        """True for text families (they need a tokenizer)."""
        return self.objective in ("clm", "mlm", "seqcls")

    def tokens_per_sample(self, config: PretrainedConfig, seq_len: int) -> int:
        """Sequence length the transformer runs on: text seq_len, or patches + extra tokens."""
        if self.is_text:
            return seq_len
        return (config.image_size // config.patch_size) ** 2 + self.extra_tokens

    def config_for(self, m: ModelConfig, info: DataInfo, seq_len: int) -> PretrainedConfig:
        """The full model's HF config: from ``m.init_from``'s config.json when set (its shape wins; the
        label count and pad id follow the data), else built from ``m``.

        Raises:
            ConfigError: init_from is missing, unreadable, or a checkpoint of another family.
        """
        if m.init_from is None:
            config = self.build_config(m, info, seq_len)
        else:
            config = load_init_config(m.init_from, self)
        if self.objective in ("seqcls", "cls") and info.num_labels:
            config.num_labels = info.num_labels
            config.id2label = {i: str(i) for i in range(info.num_labels)}
            config.label2id = {str(i): i for i in range(info.num_labels)}
        if self.objective == "seqcls" and info.pad_id is not None:
            config.pad_token_id = info.pad_id
        return config

    def build_model(self, config: PretrainedConfig, meta: bool = False,
                    init_from: str | None = None) -> torch.nn.Module:
        """A freshly initialised model (``meta=True``: on the meta device, no memory, for dry runs), or
        ``init_from``'s weights in this family's class for the task (a missing head is initialised)."""
        if self.objective == "clm" and config._attn_implementation in (None, "sdpa"):
            config._attn_implementation = CAUSAL_SDPA  # SDPA's flash kernel under torch.compile on torch 2.11 too
        if meta:
            with torch.device("meta"):
                return self.model_cls(config)
        if init_from is not None:
            def load() -> torch.nn.Module:  # strictly: only a task head may be new (a classifier on an MLM)

                return load_weights(self.model_cls, init_from, HEADS, what="model.init_from", config=config)[0]

            # a local folder needs no network: only a Hub id goes through the fail-fast probe
            return load() if Path(init_from).expanduser().is_dir() else hub_call(f"model.init_from={init_from!r}", load)
        return self.model_cls(config)

    def check_init_from(self, config: PretrainedConfig, init_from: str) -> None:
        """Before any work: refuse a local ``init_from`` folder whose weights do not fit a model of ``config``
        (only a task head may be new); a Hub id is checked when it loads.

        Raises:
            ValueError: naming the folder and the first tensor that does not fit.
        """

        if Path(init_from).expanduser().is_dir():
            check_fits(self.build_model(config, meta=True), init_from, HEADS, "model.init_from",
                       load=lambda: load_weights(self.model_cls, init_from, HEADS, "model.init_from", config=config))

    def for_task(self, task: str) -> Family:
        """This family for ``task``: "pretrain" (its own objective) or "classify" (text: sequence
        classification; vision families classify already)."""
        if task == "classify" and self.classifier_cls is not None:
            return replace(self, objective="seqcls", model_cls=self.classifier_cls, head=None)
        return self

    def chunked_loss(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` with its training loss computed by ``progressive.model.loss`` (the logits a chunk of rows at a
        time, never all at once); unchanged where the family's loss is not over a vocabulary."""
        if self.head is None:
            return model

        return loss.install(model, self.head[0], self.head[1], shift=self.objective == "clm")


def load_init_config(init_from: str, family: Family) -> PretrainedConfig:
    """The config of ``model.init_from`` (a local folder, or a Hub id when online), checked to be of ``family``.

    Raises:
        ConfigError: not found / not a checkpoint, or a checkpoint of another family.
    """
    path = Path(init_from).expanduser()
    local = path.exists() or init_from.startswith((".", "/", "~")) or init_from.count("/") > 1
    if local and not path.exists():  # a Hub id is "name" or "org/name"
        raise ConfigError(f"model.init_from: no such folder {path} (a checkpoint folder written by save_pretrained, "
                          "e.g. outputs/<run>/final: train that run first)")
    try:
        if local:
            try:  # config.json, and weights whole, before any work
                check_checkpoint_folder(path, "model.init_from")
            except (FileNotFoundError, CheckpointFolderError) as e:
                raise ConfigError(str(e)) from None
            config = AutoConfig.from_pretrained(str(path))
        else:
            config = hub_call(f"model.init_from={init_from!r}", lambda: AutoConfig.from_pretrained(init_from))
    except (ConfigError, HubUnavailable):
        raise
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.init_from: {init_from!r} is not a checkpoint folder or a loadable Hub id "
                          f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    if config.model_type not in family.model_types:
        raise ConfigError(f"model.init_from: {init_from} is a {config.model_type!r} checkpoint, but model.family is "
                          f"{family.name!r} (it loads {', '.join(family.model_types)}); set model.family to match")
    return config


def _family(name: str, objective: str, build_config: Callable[[ModelConfig, DataInfo, int], PretrainedConfig],
            **kw: Any) -> Family:
    """The family ``name`` that trains the classes of its row of progressive.model.flops.ARCHITECTURES (the one
    table of the families' classes): the first for its objective, the text classifier's for ``model.task:
    classify``."""
    classes = ARCHITECTURES[name].classes
    classifier = next((c for c, head in classes.items() if head in CLASSIFIES_TEXT), None)
    return Family(name, objective, build_config, getattr(transformers, ARCHITECTURES[name].default),
                  classifier_cls=classifier and getattr(transformers, classifier), model_types=(name,), **kw)


FAMILIES: dict[str, Family] = {
    "gpt2": _family("gpt2", "clm", _gpt2, head=("lm_head", None)),
    "llama": _family("llama", "clm", _llama, head=("lm_head", None)),
    "bert": _family("bert", "mlm", _bert, token_types=True,
                    head=("cls.predictions.decoder", "cls.predictions.transform")),
    "vit": _family("vit", "cls", _vision(ViTConfig), extra_tokens=1),
    "deit": _family("deit", "cls", _vision(DeiTConfig), extra_tokens=2),
}


def get_family(name: str, task: str = "pretrain") -> Family:
    """The family called ``name`` for ``task`` (model.task); raises ConfigError naming model.family otherwise."""
    if name not in FAMILIES:
        raise ConfigError(f"model.family: unknown family {name!r}; choose one of {', '.join(FAMILIES)}")
    return FAMILIES[name].for_task(task)


def step_flops(cfg: RunConfig, family: Family, config: PretrainedConfig, n_layers: int | None = None) -> int:
    """Training FLOPs of one optimizer step (the global batch) of a ``family`` model with ``config``."""
    seq = family.tokens_per_sample(config, cfg.data.seq_len)
    return model_flops(config, cfg.train.batch_size, seq, training=True, n_layers=n_layers,
                       arch=family.model_cls.__name__)


def guess_data_info(cfg: RunConfig) -> DataInfo:
    """DataInfo without loading data (dry runs, early validation): model.vocab_size if set, else the
    GPT-2 BPE's 50257 or data.vocab_size for trained tokenizers; 10 labels for images."""
    vocab = cfg.model.vocab_size or (50257 if cfg.data.tokenizer == "gpt2" else cfg.data.vocab_size)
    return DataInfo(vocab_size=vocab, bos_id=0, eos_id=0, pad_id=0, num_labels=10,
                    image_size=cfg.data.image_size)


def image_processor(cfg: RunConfig) -> Any:
    """The processor that turns images into pixel_values at data.image_size (saved with the final checkpoint);
    progressive.data's: mean/std 0.5 for ViT, ImageNet statistics for DeiT."""

    return make_image_processor(cfg.data, cfg.model.family)


def make_batch(family: Family, source: Any, idx: np.ndarray, tokenizer: Any = None,
               generator: torch.Generator | None = None, device: torch.device | str = "cpu",
               rows: slice | None = None) -> dict[str, torch.Tensor]:
    """The model inputs for sample indices ``idx`` of ``source`` (token blocks [N, T] or an ImageSplit).

    Args:
        family: the model family (decides the objective).
        source: np.ndarray of token blocks for text, an ImageSplit for images, a ClassifySplit for text
            classification.
        idx: sample indices (the whole batch).
        tokenizer: needed for ``mlm`` (mask token, special ids).
        generator: seeds the MLM masks, so a batch is a pure function of (seed, step).
        device: where the tensors go.
        rows: build only these rows of the batch (one process's share); MLM masks are still drawn for the
            whole batch, so the rows are exactly those of the whole batch's tensors.
    """
    whole = np.asarray(idx)
    rows = rows or slice(0, len(whole))
    sel = whole[rows]
    if family.objective == "seqcls":
        t = torch.as_tensor(sel)
        out = {"input_ids": source.input_ids[t], "attention_mask": source.attention_mask[t], "labels": source.labels[t]}
        if family.token_types and source.token_type_ids is not None:
            out["token_type_ids"] = source.token_type_ids[t]
        return {k: v.to(device) for k, v in out.items()}
    if family.objective == "cls":
        t = torch.as_tensor(sel)
        return {"pixel_values": source.pixel_values[t].to(device), "labels": source.labels[t].to(device)}
    ids = torch.from_numpy(np.asarray(source[sel], dtype=np.int64))
    if family.objective == "mlm":
        ids, labels = mlm_mask(ids, tokenizer, prob=0.15, generator=generator, part=(rows.indices(len(whole))[0],
                                                                                      len(whole)))
        return {"input_ids": ids.to(device), "labels": labels.to(device)}
    ids = ids.to(device)
    return {"input_ids": ids, "labels": ids}
