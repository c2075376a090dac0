"""Training data: the public API the trainer codes against.

    cfg = DataConfig(dataset="bundled", tokenizer="gpt2", seq_len=128)
    tok = build_tokenizer(cfg)                       # PreTrainedTokenizerFast, save_pretrained-able
    blocks = load_token_blocks(cfg, tok)             # .train / .val: memory-mapped int32 [N, seq_len]
    idx = batch_indices(len(blocks.train), batch_size=32, seed=cfg.seed, step=step)
    input_ids, labels = mlm_mask(torch.from_numpy(blocks.train[idx]).long(), tok, generator=g)  # BERT only
    split = load_image_split(cfg, "train", image_processor)   # .pixel_values [N, 3, H, W], .labels [N]

Modules, each importing only those above it: cache (cache keys), sources (documents from the bundled corpus,
local files, Hugging Face datasets), tokenizers, text (token streams and blocks), images (image classification
splits), classify (text classification, GLUE-format), batches (deterministic batches, BERT masking). The
``data:`` section of a recipe, ``DataConfig``, is progressive.config's.
"""

import importlib
from typing import Any

# name -> the module that defines it; each loads on first use, so naming one of them imports neither
# torch nor transformers (train.py --help, --list and --print_config answer at once)
_WHERE = {
    "TokenBlocks": "text",
    "ImageSplit": "images",
    "ClassifySplit": "classify",
    "load_classify_split": "classify",
    "build_tokenizer": "tokenizers",
    "TRAINED_TOKENIZERS": "tokenizers",
    "load_token_blocks": "text",
    "find_token_blocks": "text",
    "NotKnown": "identity",
    "load_image_split": "images",
    "make_image_processor": "images",
    "batch_indices": "batches",
    "sample_indices": "batches",
    "mlm_mask": "batches",
}
__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    module = importlib.import_module(f"{__name__}.{_WHERE[name]}")
    return getattr(module, "TRAINED_KINDS" if name == "TRAINED_TOKENIZERS" else name)
