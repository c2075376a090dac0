"""Training data: the public API the trainer codes against.

    cfg = DataConfig(dataset="bundled", tokenizer="gpt2", seq_len=128)
    tok = build_tokenizer(cfg)                       # PreTrainedTokenizerFast, save_pretrained-able
    blocks = load_token_blocks(cfg, tok)             # .train / .val: memory-mapped int32 [N, seq_len]
    idx = batch_indices(len(blocks.train), batch_size=32, seed=cfg.seed, step=step)
    input_ids, labels = mlm_mask(torch.from_numpy(blocks.train[idx]).long(), tok, generator=g)  # BERT only
    split = load_image_split(cfg, "train", image_processor)   # .pixel_values [N, 3, H, W], .labels [N]

Modules, each importing only those above it: config (DataConfig), cache (cache keys), sources (documents
from the bundled corpus, local files, Hugging Face datasets), tokenizers, text (token streams and blocks),
images (image classification splits), classify (text classification,
GLUE-format), batches (deterministic batches, BERT masking).
"""

from progressive.data.batches import batch_indices, mlm_mask, sample_indices
from progressive.data.classify import ClassifySplit, load_classify_split
from progressive.data.config import DataConfig
from progressive.data.images import ImageSplit, load_image_split, make_image_processor
from progressive.data.text import TokenBlocks, load_token_blocks
from progressive.data.tokenizers import TRAINED_KINDS as TRAINED_TOKENIZERS
from progressive.data.tokenizers import build_tokenizer

__all__ = [
    "DataConfig",
    "TokenBlocks",
    "ImageSplit",
    "ClassifySplit",
    "load_classify_split",
    "build_tokenizer",
    "TRAINED_TOKENIZERS",
    "load_token_blocks",
    "load_image_split",
    "make_image_processor",
    "batch_indices",
    "sample_indices",
    "mlm_mask",
]
