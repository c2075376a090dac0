"""Loading a checkpoint for zero-shot evaluation: checked to be a causal language model (by its config, and by
a test that a later token cannot move earlier logits), and the window length it allows.
"""

from __future__ import annotations

from pathlib import Path

import torch

from common.hf_folder import check_checkpoint_folder, check_loadable, load_weights

__all__ = ["DTYPES", "DEFAULT_MAX_LENGTH", "CheckpointError", "load_causal_lm", "load_tokenizer",
           "check_checkpoint_config", "check_causal", "resolve_max_length"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_MAX_LENGTH = 2048  # the harness's fallback when neither config nor tokenizer gives a context


class CheckpointError(ValueError):
    """The checkpoint folder cannot be evaluated as a causal language model."""


def _causal_class_names() -> set[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names: set[str] = set()
    for v in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        names.update([v] if isinstance(v, str) else v)
    return names


# files a tokenizer is loaded from (transformers' names, prefixes as the operators CLI copies them): a folder with none
# of them loads as an EMPTY tokenizer of one token, which encodes every text to nothing
TOKENIZER_FILES = ("tokenizer", "vocab", "merges", "spiece", "sentencepiece", "special_tokens_map", "added_tokens")
PROBE = "The quick brown fox jumps over the lazy dog."


def load_tokenizer(checkpoint: str | Path, tokenizer: str | Path | None = None):
    """The tokenizer to score with: ``tokenizer`` (a folder or a Hub name) when given, else the checkpoint's own,
    checked to be there and to encode text to tokens.

    Raises:
        CheckpointError: the checkpoint has no tokenizer files and none is given, it does not load, or it encodes
            text to no tokens (transformers' empty tokenizer); the message says to pass ``--tokenizer``.
    """
    from transformers import AutoTokenizer

    source = tokenizer or Path(checkpoint)
    if tokenizer is None and not any(f.name.startswith(TOKENIZER_FILES) for f in Path(checkpoint).iterdir()):
        raise CheckpointError(f"{checkpoint} has no tokenizer files (tokenizer.json, tokenizer_config.json, "
                              "vocab.json, ...): pass --tokenizer FOLDER or a Hub name (the tokenizer the model was "
                              "trained with, e.g. the run's final/)")
    try:
        tok = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as e:
        first = (str(e).splitlines() or [""])[0][:200]
        raise CheckpointError(f"no usable tokenizer in {source} ({type(e).__name__}: {first}); save it with the "
                              "model or pass --tokenizer") from None
    if not tok.encode(PROBE, add_special_tokens=False):
        raise CheckpointError(f"the tokenizer in {source} encodes text to no tokens (a vocabulary of {len(tok)}): "
                              "its vocabulary files are missing; pass --tokenizer FOLDER or a Hub name")
    return tok


def load_causal_lm(checkpoint: str | Path, tokenizer: str | Path | None = None, dtype: str = "float32"):
    """Load (model, tokenizer) from a Hugging Face checkpoint folder, checked to be a causal LM.

    Raises:
        FileNotFoundError: no folder or no config.json in it.
        CheckpointError: the checkpoint is not a causal LM (e.g. a BertForMaskedLM), has no usable tokenizer
            (``load_tokenizer``), or its model attends to later tokens.
        CheckpointFolderError: damaged weights, or a model larger than the memory available.
    """
    from transformers import AutoModelForCausalLM

    path = Path(checkpoint)
    check_checkpoint_config(path, dtype)
    tok = load_tokenizer(path, tokenizer)
    kwargs = {} if dtype == "auto" else {"dtype": DTYPES[dtype]}
    model = load_weights(AutoModelForCausalLM, path, what="checkpoint", **kwargs)[0].eval()  # whole, or an error
    check_causal(model)
    return model, tok


def check_checkpoint_config(checkpoint: str | Path, dtype: str = "float32"):
    """Load the checkpoint's config and check that it names a causal-LM class that fits in memory in ``dtype``
    ("auto": the checkpoint's own); return the config.

    Raises:
        FileNotFoundError: no folder or no config.json in it.
        CheckpointError: ``architectures`` names no causal-LM class (e.g. BertForMaskedLM), or the model
            is an encoder-decoder.
        CheckpointFolderError: damaged weights, an unknown model_type, or a model larger than the memory available.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(checkpoint)
    check_checkpoint_folder(path, "checkpoint")  # config.json and whole weights, before any model loads
    config = AutoConfig.from_pretrained(path)
    archs = list(getattr(config, "architectures", None) or [])
    if (archs and not set(archs) & _causal_class_names()) or getattr(config, "is_encoder_decoder", False):
        raise CheckpointError(
            f"{path} holds a {archs[0] if archs else config.model_type} (config.json 'architectures'); "
            "zero-shot LM evaluation needs a causal LM such as GPT2LMHeadModel or LlamaForCausalLM. "
            "Masked LMs (BERT) are evaluated by fine-tuning: python -m eval.glue"
        )
    check_loadable(AutoModelForCausalLM, path, "checkpoint", DTYPES.get(dtype), config)  # either engine loads it
    return config


@torch.no_grad()
def check_causal(model, n: int = 8) -> None:
    """Check that changing the last token leaves every earlier position's logits unchanged.

    Raises:
        CheckpointError: earlier logits moved, i.e. the model sees the future (a bidirectional encoder
            loaded through a causal-LM head, such as BertLMHeadModel without ``is_decoder``).
    """
    vocab = model.get_input_embeddings().num_embeddings
    n = max(2, min(n, _model_positions(model.config) or n))
    device = next(model.parameters()).device
    ids = torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(0)).to(device)
    moved = ids.clone()
    moved[0, -1] = (moved[0, -1] + 1) % vocab
    a, b = model(ids).logits[0, :-1].float(), model(moved).logits[0, :-1].float()
    # A causal model gives the same numbers up to round-off; a random-init encoder moves them by about 1%
    # of the logits' spread, so the threshold is relative to that spread.
    if (a - b).abs().max() > 1e-4 * a.std() + 1e-7:
        raise CheckpointError(
            f"{type(model).__name__} is not causal: logits at earlier positions change with a later token "
            "(a bidirectional encoder cannot be scored as a left-to-right language model)"
        )


def _model_positions(config) -> int | None:
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        if getattr(config, attr, None):
            return int(getattr(config, attr))
    return None


def resolve_max_length(config, tokenizer, requested: int | None = None) -> int:
    """Window length: ``requested``, else the model's positions, else the tokenizer's limit, else 2048.

    Raises:
        ValueError: ``requested`` exceeds the model's position embeddings.
    """
    positions = _model_positions(config)
    if requested is not None:
        if positions is not None and requested > positions:
            raise ValueError(f"--max_length {requested} exceeds the model's {positions} positions")
        return int(requested)
    if positions is not None:
        return positions
    tok_max = getattr(tokenizer, "model_max_length", None)
    return int(tok_max) if tok_max and tok_max < 1e9 else DEFAULT_MAX_LENGTH
