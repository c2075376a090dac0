"""Batched log-likelihood scoring of a causal LM with lm-evaluation-harness (0.4.13) semantics.

A *request* is (context tokens, continuation tokens). The model reads
``(context + continuation)[-(L + 1):][:-1]`` (L = max_length, so at most L tokens: a context longer than
that is cut from the LEFT) and the last ``len(continuation)`` positions are scored:

    loglikelihood = sum_t log p(cont_t | everything before it)
    is_greedy     = all_t  argmax_v p(v | everything before it) == cont_t

LAMBADA is one request per passage (``lambada_request``). A document (WikiText page, PTB stream) is
scored with rolling windows (``rolling_requests``, the harness's ``get_rolling_token_windows`` with
``context_len=1`` followed by ``make_disjoint_window``): the first window predicts the first L tokens
from a prefix token (BOS if the tokenizer has one, else EOS); each later window predicts the next L
tokens from ONE token of context; the last, partial window is backfilled with earlier tokens as context
so that the model still sees L tokens. Every token is scored exactly once and no window exceeds L.

Differences from the harness that do not change numbers beyond float round-off: we run the LM head and
the log-softmax (always in float32) only on the positions that are scored (``logits_to_keep``), and
batches are built from requests sorted by length, as the harness does, but need not group identically.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Request:
    """Tokens to condition on (at least one) and tokens to score."""

    context: list[int]
    continuation: list[int]

    def truncated(self, max_length: int) -> bool:
        """True when the model cannot see the whole context (it is cut from the left)."""
        return len(self.context) + len(self.continuation) > max_length + 1


def prefix_token_id(tokenizer) -> int:
    """The token a document is conditioned on before its first token: BOS, else EOS (the harness's rule).

    Raises:
        ValueError: the tokenizer has neither a BOS nor an EOS token.
    """
    for tid in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if tid is not None:
            return int(tid)
    raise ValueError("the tokenizer has neither a BOS nor an EOS token; rolling windows need one as prefix")


def encode(tokenizer, text: str, prefix_id: int) -> list[int]:
    """Tokenize like the harness's ``HFLM.tok_encode``: the tokenizer's default special tokens (e.g. BOS
    for Llama, none for GPT-2), except none when ``text`` already starts with the prefix token's text."""
    if text.startswith(tokenizer.decode(prefix_id)):
        return tokenizer.encode(text, add_special_tokens=False)
    return tokenizer.encode(text)


def lambada_request(tokenizer, text: str, prefix_id: int) -> Request:
    """The harness's ``lambada_openai`` request for one passage.

    context = the passage without its last space-separated word, continuation = " " + that word.
    As in ``LM._encode_pair``, spaces trailing the context move to the continuation, the pair is
    tokenized as a whole and split after the context's own tokens (so a merge across the boundary
    cannot hide a token). An empty context becomes the prefix token.
    """
    words = text.split(" ")
    context, continuation = " ".join(words[:-1]), " " + words[-1]
    if context == "":
        cont = tokenizer.encode(continuation, add_special_tokens=False)
        return Request([prefix_id], cont) if cont[0] != prefix_id else Request(cont[:1], cont[1:])
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = encode(tokenizer, context + continuation, prefix_id)
    ctx = encode(tokenizer, context, prefix_id)
    return Request(ctx, whole[len(ctx) :])


def rolling_requests(tokens: Sequence[int], prefix_id: int, max_length: int) -> list[Request]:
    """Disjoint rolling windows over a document's tokens (see the module docstring).

    Window k predicts ``tokens[start:end]`` with ``end - start <= max_length``; its context is the prefix
    token for the first window, otherwise the ``max_length - (end - start) + 1`` tokens before ``start``
    (one token for a full window, more for the final partial one).

    Raises:
        ValueError: ``max_length`` < 1.
    """
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    tokens = list(tokens)
    out, start = [], 0
    while start < len(tokens):
        end = min(start + max_length, len(tokens))
        ctx = [prefix_id] if start == 0 else tokens[max(0, end - max_length - 1) : start]
        out.append(Request(ctx, tokens[start:end]))
        start = end
    return out


def _forward_kwargs(model) -> dict:
    """``use_cache=False`` where the forward accepts it: each batch is one pass, a KV cache is waste."""
    params = inspect.signature(model.forward).parameters
    return {"use_cache": False} if "use_cache" in params else {}


@torch.no_grad()
def score_requests(
    model,
    requests: Sequence[Request],
    max_length: int,
    batch_size: int = 8,
    accelerator=None,
    desc: str = "scoring",
) -> list[tuple[float, bool]]:
    """(loglikelihood, is_greedy) for each request, in input order.

    With an Accelerate ``accelerator`` of several processes, each process scores a contiguous shard and
    the results are gathered, so every process returns the full list.

    Raises:
        ValueError: a continuation is empty or longer than ``max_length`` (it cannot be scored in one
            pass; documents must go through ``rolling_requests``).
    """
    for r in requests:
        if not r.context or not 1 <= len(r.continuation) <= max_length:
            raise ValueError(
                f"cannot score a request with {len(r.context)} context and {len(r.continuation)} "
                f"continuation tokens at max_length={max_length}"
            )
    indices = list(range(len(requests)))
    is_main = accelerator is None or accelerator.is_main_process
    if accelerator is not None and accelerator.num_processes > 1:
        with accelerator.split_between_processes(indices) as shard:
            indices = list(shard)
    device = next(model.parameters()).device
    kwargs = _forward_kwargs(model)
    keep_ok = "logits_to_keep" in inspect.signature(model.forward).parameters
    # Longest first (the harness's order): similar lengths share a batch, an OOM shows up at once.
    order = sorted(indices, key=lambda i: -(len(requests[i].context) + len(requests[i].continuation)))
    results: list[tuple[int, float, bool]] = []
    # disable=None: no bar where stderr is no terminal (a log file would keep its carriage returns)
    for b in tqdm(range(0, len(order), batch_size), desc=desc, disable=None if is_main else True, leave=False):
        batch = order[b : b + batch_size]
        inps = [(requests[i].context + requests[i].continuation)[-(max_length + 1) :][:-1] for i in batch]
        width = max(len(x) for x in inps)
        ids = torch.zeros(len(batch), width, dtype=torch.long)  # right padding: causal, so never seen
        for row, x in enumerate(inps):
            ids[row, : len(x)] = torch.tensor(x)
        # First scored position per row; only positions from the earliest one on need logits.
        starts = [len(x) - len(requests[i].continuation) for x, i in zip(inps, batch)]
        keep = width - min(starts)
        if keep_ok:
            logits = model(ids.to(device), logits_to_keep=keep, **kwargs).logits
        else:
            logits = model(ids.to(device), **kwargs).logits[:, -keep:]
        logp = torch.log_softmax(logits.float(), dim=-1)  # (B, keep, V)
        for row, i in enumerate(batch):
            cont = torch.tensor(requests[i].continuation, device=logp.device)
            s = starts[row] - (width - keep)
            lp = logp[row, s : s + len(cont)]  # (n_cont, V)
            ll = lp.gather(-1, cont[:, None]).sum().item()
            results.append((i, ll, bool((lp.argmax(-1) == cont).all())))
    if accelerator is not None and accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        results = gather_object(results)
    results.sort(key=lambda t: t[0])
    if len(results) != len(requests):
        raise RuntimeError(f"gathered {len(results)} scores for {len(requests)} requests")
    return [(ll, greedy) for _, ll, greedy in results]
