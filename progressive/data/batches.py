"""Deterministic batches and BERT masking, shared by every objective: the batch of step s is a pure function
of (seed, s), so resuming needs only the step, and MLM masks are drawn from a generator seeded per step."""

from __future__ import annotations

import functools

import numpy as np
import torch

__all__ = ["batch_indices", "sample_indices", "mlm_mask"]


@functools.lru_cache(maxsize=4)
def _epoch_permutation(n_blocks: int, seed: int, epoch: int) -> np.ndarray:
    # Seeding with (seed, epoch) makes every epoch's order a pure function of its number, so any
    # step can be reproduced without replaying earlier ones.
    return np.random.default_rng([seed, epoch]).permutation(n_blocks)


def sample_indices(n_blocks: int, start: int, count: int, seed: int) -> np.ndarray:
    """Block indices for samples ``start .. start+count-1`` of the infinite, epoch-shuffled sample stream.

    Sample position p is block ``perm_e[p % n_blocks]`` with e = p // n_blocks and perm_e a permutation
    seeded by (seed, e): every epoch visits every block once, in a fresh order. A batch may straddle two
    epochs. Use this (with a running count of consumed samples) when the batch size changes.

    Args:
        n_blocks: number of training blocks (>= 1).
        start: position of the first sample in the stream (>= 0).
        count: number of samples (>= 0).
        seed: shuffling seed.

    Returns:
        int64 array [count].

    Raises:
        ValueError: n_blocks < 1 or negative start/count.
    """
    if n_blocks < 1:
        raise ValueError(f"no training blocks to sample from (n_blocks={n_blocks}); use more data or a smaller seq_len")
    if start < 0 or count < 0:
        raise ValueError(f"start and count must be >= 0, got start={start}, count={count}")
    pos = np.arange(start, start + count, dtype=np.int64)
    out = np.empty(count, dtype=np.int64)
    epochs = pos // n_blocks
    for e in np.unique(epochs):
        sel = epochs == e
        out[sel] = _epoch_permutation(n_blocks, seed, int(e))[pos[sel] % n_blocks]
    return out


def batch_indices(n_blocks: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """The batch of global step ``step``: samples [step*batch_size, (step+1)*batch_size) of the stream.

    Deterministic for (n_blocks, batch_size, seed, step), reshuffled every epoch, so resuming needs only the
    step. This assumes one batch size for the whole run (what the trainer does); if the batch size changes
    between phases, track the number of consumed samples and call ``sample_indices`` instead. In DDP each
    rank takes its own slice of the global batch.

    Args:
        n_blocks: number of training blocks.
        batch_size: global batch size (>= 1, <= n_blocks).
        seed: shuffling seed.
        step: global step (>= 0).

    Returns:
        int64 array [batch_size] of distinct block indices within one epoch.

    Raises:
        ValueError: batch_size < 1, step < 0, or fewer blocks than one batch.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if n_blocks < batch_size:
        raise ValueError(
            f"too little data for one batch: {n_blocks} training blocks < batch_size {batch_size}; "
            "use more data (max_tokens), a shorter seq_len or a smaller batch"
        )
    return sample_indices(n_blocks, step * batch_size, batch_size, seed)


def mlm_mask(
    input_ids: torch.Tensor,
    tokenizer,
    prob: float = 0.15,
    generator: torch.Generator | None = None,
    part: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking (Devlin et al. 2019, sec. 3.1): choose ``prob`` of the non-special tokens; of those,
    80% become [MASK], 10% a random token, 10% stay; labels are the original ids there and -100 elsewhere.

    Args:
        input_ids: long tensor [B, T] (not modified).
        tokenizer: a tokenizer with ``mask_token_id`` and ``all_special_ids``.
        prob: masking probability per non-special token.
        generator: torch.Generator for reproducible masks (its device is used for sampling).
        part: (first row, rows in the whole batch) when ``input_ids`` are some rows of a larger batch (one
            process's share): the draws are made for the whole batch and these rows kept, so every split of
            a batch over processes gets the masks the whole batch gets.

    Returns:
        (masked input_ids, labels), both long [B, T] on input_ids' device.

    Raises:
        ValueError: the tokenizer has no mask token, or prob is outside (0, 1].
    """
    if tokenizer.mask_token_id is None:
        raise ValueError("mlm_mask needs a tokenizer with a mask token (use tokenizer='wordpiece' or a BERT tokenizer)")
    if not 0.0 < prob <= 1.0:
        raise ValueError(f"masking prob must be in (0, 1], got {prob}")
    dev = generator.device if generator is not None else torch.device("cpu")
    ids = input_ids.to(dev)
    first, total = part if part is not None else (0, ids.shape[0])
    if not 0 <= first <= total - ids.shape[0]:
        raise ValueError(f"mlm_mask: rows {first}..{first + ids.shape[0] - 1} are not inside a batch of {total} rows")
    shape, mine = (total, *ids.shape[1:]), slice(first, first + ids.shape[0])

    def draw(fn, *args, **kw):  # the whole batch's draws, this part's rows
        return fn(*args, shape, generator=generator, device=dev, **kw)[mine]

    special = torch.isin(ids, torch.tensor(sorted(set(tokenizer.all_special_ids)), device=dev))
    chosen = (draw(torch.rand) < prob) & ~special
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    r = draw(torch.rand)
    to_mask = chosen & (r < 0.8)
    to_random = chosen & (r >= 0.8) & (r < 0.9)  # the remaining 10% keep their token
    rand_ids = draw(torch.randint, len(tokenizer), dtype=ids.dtype)
    out = torch.where(to_mask, torch.full_like(ids, tokenizer.mask_token_id), ids)
    out = torch.where(to_random, rand_ids, out)
    return out.to(input_ids.device), labels.to(input_ids.device)
