"""The fine-tuning loop shared by eval.glue and eval.deit_transfer: one model, one LR, one seed.

Accelerate owns devices and processes: ``accelerate launch -m eval.glue ...`` (or ``torchrun`` with
``--cpu``) runs data parallel; every process builds the same model from the same seed, dataloaders are
sharded by ``prepare`` and predictions come back with ``gather_for_metrics`` (which drops the padding
samples of the last uneven batch), so metrics are over exactly the evaluation set.

Schedule: AdamW (torch defaults: betas 0.9/0.999, eps 1e-8), linear warm-up over ``warmup_ratio`` of the steps,
then ``scheduler`` decay to 0 (BERT's
GLUE recipe: linear, 10% warm-up, weight decay 0.01 on everything but biases and LayerNorm weights).
The model is evaluated once, after the last epoch (no early stopping / best-epoch picking, which would
select on the dev set a second time).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm
from transformers import get_scheduler

from common.quiet import quiet_transformers


@dataclass
class FinetuneConfig:
    """Hyper-parameters of one fine-tuning run."""

    lr: float = 2e-5
    epochs: float = 5.0            # fractions allowed (quick runs); steps = ceil(epochs * batches per epoch)
    batch_size: int = 32           # per step, over all processes (each process gets batch_size / world size)
    seed: int = 0
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    scheduler: str = "linear"      # any transformers.get_scheduler name ("linear", "cosine", ...)
    max_grad_norm: float = 1.0
    eval_batch_size: int = 64
    num_workers: int = 0

    def __post_init__(self) -> None:
        # A run with no training steps would report the scores of an untrained head as results.
        if not self.epochs > 0:
            raise ValueError(f"--epochs must be > 0 (fractions are fine, e.g. 0.5), got {self.epochs}")
        if not self.lr > 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")
        if self.batch_size < 1 or self.eval_batch_size < 1:
            raise ValueError(f"--batch_size must be >= 1, got {self.batch_size}")


def make_accelerator(cpu: bool = False, mixed_precision: str = "no") -> Accelerator:
    """One Accelerator per process, reused by every run (``free_memory`` between runs)."""
    return Accelerator(cpu=cpu, mixed_precision=mixed_precision)


def start_cli(cpu: bool = False, mixed_precision: str = "no") -> Accelerator:
    """What every fine-tuning CLI does first: quiet transformers (its per-load weight bars too; our
    tqdm bars stay), INFO logging with one copy of the logs (main process), and the Accelerator."""

    from transformers.utils.logging import disable_progress_bar

    quiet_transformers()
    disable_progress_bar()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    accelerator = make_accelerator(cpu=cpu, mixed_precision=mixed_precision)
    if not accelerator.is_main_process:
        logging.getLogger().setLevel(logging.WARNING)
    return accelerator


def per_process_batch(batch_size: int, accelerator: Accelerator) -> int:
    """Split a global batch over the processes.

    Raises:
        ValueError: ``batch_size`` is not a multiple of the number of processes.
    """
    world = accelerator.num_processes
    if batch_size % world:
        raise ValueError(f"--batch_size {batch_size} must be a multiple of the number of processes ({world})")
    return batch_size // world


def finetune(
    build_model: Callable[[], torch.nn.Module],
    train_set: Dataset,
    eval_sets: Mapping[str, Dataset],
    collate: Callable,
    cfg: FinetuneConfig,
    accelerator: Accelerator,
    predict: Callable[[torch.Tensor], torch.Tensor],
    desc: str = "fine-tune",
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Train ``build_model()`` on ``train_set`` with ``cfg``; return predictions on every eval set.

    Args:
        build_model: returns a fresh model; called after ``set_seed(cfg.seed)`` so the new head's init
            and the data order depend on the seed only.
        train_set / eval_sets: map-style datasets; items are dicts that ``collate`` batches, with a
            ``labels`` entry (the model's forward must return ``.loss`` when given labels).
        predict: logits -> predictions (argmax for classes, squeeze for regression).

    Returns:
        ``{name: (predictions, labels)}`` on CPU, gathered over processes, in dataset order.
    """
    set_seed(cfg.seed)
    model = build_model()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]  # biases and norm weights
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr
    )
    bs = per_process_batch(cfg.batch_size, accelerator)
    gen = torch.Generator().manual_seed(cfg.seed)
    train_dl = DataLoader(train_set, batch_size=bs, shuffle=True, collate_fn=collate, generator=gen,
                          num_workers=cfg.num_workers)
    eval_dls = {k: DataLoader(d, batch_size=cfg.eval_batch_size, collate_fn=collate, num_workers=cfg.num_workers)
                for k, d in eval_sets.items()}
    model, optimizer, train_dl = accelerator.prepare(model, optimizer, train_dl)
    eval_dls = {k: accelerator.prepare(d) for k, d in eval_dls.items()}

    steps_per_epoch = len(train_dl)
    total = max(1, math.ceil(cfg.epochs * steps_per_epoch))
    sched = get_scheduler(cfg.scheduler, optimizer, num_warmup_steps=int(cfg.warmup_ratio * total),
                          num_training_steps=total)
    # disable=None: no bar where stderr is no terminal (a log file would keep its carriage returns)
    bar = tqdm(total=total, desc=desc, disable=None if accelerator.is_local_main_process else True, leave=False)
    step = 0
    model.train()
    while step < total:
        for batch in train_dl:
            loss = model(**batch).loss
            accelerator.backward(loss)
            if cfg.max_grad_norm:
                accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            sched.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.4f}")
            if step >= total:
                break
    bar.close()

    out = {k: evaluate(model, dl, accelerator, predict) for k, dl in eval_dls.items()}
    accelerator.free_memory(model, optimizer, train_dl, sched)
    return out


@torch.no_grad()
def evaluate(model: torch.nn.Module, dataloader: DataLoader, accelerator: Accelerator,
             predict: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Predictions and labels over a prepared dataloader, gathered from all processes (exactly N rows)."""
    model.eval()
    preds, labels = [], []
    for batch in dataloader:
        y = batch.pop("labels")
        p = predict(model(**batch).logits)
        p, y = accelerator.gather_for_metrics((p, y))
        preds.append((p.float() if p.is_floating_point() else p).cpu())
        labels.append(y.cpu())
    model.train()
    return torch.cat(preds), torch.cat(labels)
