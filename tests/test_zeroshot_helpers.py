"""Tiny checkpoints and toy models shared by the zero-shot tests (no tests in this file)."""

from __future__ import annotations

import functools
import gzip
import importlib.util
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

REPO = Path(__file__).resolve().parents[1]


@functools.cache
def gpt2_tokenizer():
    """The real GPT-2 BPE tokenizer from the bundled vocab/merges (docs/data_and_flops.md: not GPT2Tokenizer(...))."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    with tempfile.TemporaryDirectory() as tmp:
        for name in ("vocab.json", "merges.txt"):
            with gzip.open(REPO / "data/tokenizers/gpt2" / f"{name}.gz", "rb") as f, open(Path(tmp) / name, "wb") as g:
                shutil.copyfileobj(f, g)
        bpe = ByteLevelBPETokenizer(str(Path(tmp) / "vocab.json"), str(Path(tmp) / "merges.txt"))
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>",
                                   bos_token="<|endoftext|>")


def make_tiny_gpt2(out: Path, n_positions: int = 80, n_embd: int = 32, n_layer: int = 2, seed: int = 0) -> Path:
    """Random GPT2LMHeadModel (GPT-2 vocabulary) + tokenizer saved to ``out``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=50257, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer, n_head=2,
                     bos_token_id=50256, eos_token_id=50256)
    GPT2LMHeadModel(cfg).save_pretrained(out)
    gpt2_tokenizer().save_pretrained(out)
    return out


def word_tokenizer(words: list[str]):
    """Whitespace word-level tokenizer: id 0 is "<eos>" (and there is no BOS), then ``words``."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


class BigramLM(torch.nn.Module):
    """A causal LM whose logits at position t are ``table[input_ids[t]]``: log-probabilities by hand."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = torch.nn.Parameter(table.float(), requires_grad=False)

    def forward(self, input_ids: torch.Tensor, logits_to_keep: int = 0):
        logits = self.table[input_ids]
        return SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)


def test_wikitext_without_lm_eval_is_refused_in_one_line_naming_the_way_out(monkeypatch):
    """WikiText is scored with lm-evaluation-harness's own detokenizer: without lm-eval (a GPU image, say) the
    default tasks failed with a traceback mid-run; the config now says so at once, and LAMBADA/PTB still run."""

    import pytest

    from eval import zeroshot

    real = importlib.util.find_spec
    monkeypatch.setattr(zeroshot.importlib.util, "find_spec",
                        lambda name, *a: None if name == "lm_eval" else real(name, *a))
    with pytest.raises(ValueError, match="needs lm-evaluation-harness: pip install lm-eval.*lambada, ptb"):
        zeroshot.ZeroShotConfig(checkpoint="x").validate()
    zeroshot.ZeroShotConfig(checkpoint="x", tasks=("lambada", "ptb")).validate()
