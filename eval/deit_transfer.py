"""Transfer a ViT / DeiT checkpoint folder to an image-classification dataset; report top-1 accuracy.

As in DeiT (Touvron et al. 2021, Sec. 5.4 / Table 7) and the multi-level paper's DeiT-B evaluation: load the
pre-trained backbone, replace the classification head by a new one for the target classes (re-initialised),
fine-tune the whole network and report top-1 accuracy on the test split. Images are resized to the
checkpoint's resolution (DeiT upsamples CIFAR's 32x32 to 224); with ``--image_size`` different from the
checkpoint's, position embeddings are interpolated (``interpolate_pos_encoding``).

A DeiT checkpoint with a distillation head (DeiTForImageClassificationWithTeacher) is fine-tuned as
DeiTForImageClassification: same backbone (the distillation token stays in the sequence), one new head on
the class token. Differences from the paper, on purpose: augmentation is a random horizontal flip only
(no RandAugment / Mixup / CutMix / repeated augmentation), AdamW with cosine decay, one seed; the defaults
below (10 epochs, LR 1e-4, batch 64, weight decay 0.05) are ours: DeiT's transfer hyper-parameters were not
found in the paper or the authors' code (docs/papers.md), so state the ones you used next to any number.

    python -m eval.deit_transfer --checkpoint outputs/deit_cifar10/final --quick
    accelerate launch -m eval.deit_transfer --checkpoint outputs/deit_cifar10/final --dataset cifar100
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch
from PIL import ImageOps

from common.cli import check_flags, run_cli
from common.hf_folder import HEADS, check_checkpoint_folder, load_weights
from common.quiet import terminal_bars
from common.table import format_table
from eval import metrics as M
from eval.deit_data import HF_ALIASES, ImageSet, load_dataset_splits, load_image
from eval.finetune import FinetuneConfig, finetune, make_accelerator, start_cli
from eval.report import add_run_args, default_output, log_results, output_or, results_path, save_results

TOOL = "eval.deit_transfer"  # names this CLI in the results JSON it writes (written_by)

log = logging.getLogger("eval.deit_transfer")
QUICK = {"epochs": 1.0, "max_train_samples": 2000, "max_eval_samples": 1000}


@dataclass
class TransferConfig:
    """One transfer run (defaults: see the module docstring)."""

    checkpoint: str
    dataset: str = "cifar10"
    epochs: float = 10.0
    lr: float = 1e-4
    batch_size: int = 64
    weight_decay: float = 0.05
    warmup_ratio: float = 0.1
    scheduler: str = "cosine"
    image_size: int | None = None
    seed: int = 0
    hflip: bool = True
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    eval_split: str | None = None
    label_column: str | None = None
    image_column: str | None = None
    num_workers: int = 0
    cpu: bool = False
    mixed_precision: str = "no"

    def __post_init__(self) -> None:

        check_flags({"--batch_size": self.batch_size, "--image_size": self.image_size, "--seed": self.seed,
                     "--max_train_samples": self.max_train_samples, "--max_eval_samples": self.max_eval_samples,
                     "--num_workers": self.num_workers, "--weight_decay": self.weight_decay,
                     "--warmup_ratio": self.warmup_ratio},
                    at_least_one=("--batch_size", "--image_size", "--max_train_samples", "--max_eval_samples"),
                    not_negative=("--num_workers", "--weight_decay"), fractions=("--warmup_ratio",), seeds=("--seed",))


def check_checkpoint(checkpoint: str):
    """The checkpoint's config, checked to be a ViT or DeiT image model.

    Raises:
        FileNotFoundError: no config.json in the folder.
        ValueError: another kind of model (e.g. a BERT or GPT-2 text model).
    """
    from transformers import AutoConfig

    path = Path(checkpoint)
    check_checkpoint_folder(path, "--checkpoint")  # config.json and whole weights, before any work
    config = AutoConfig.from_pretrained(path)
    if config.model_type not in ("vit", "deit"):
        raise ValueError(f"{path} is a {config.model_type!r} checkpoint ({', '.join(config.architectures or [])}); "
                         "eval.deit_transfer fine-tunes ViT / DeiT image models. For BERT-family text encoders "
                         "use eval.glue, for causal LMs eval.zeroshot.")
    if getattr(config, "num_channels", 3) != 3:
        raise ValueError(f"{path}: num_channels={config.num_channels}; transfer expects RGB (3-channel) models")
    return config


def load_processor(checkpoint: str, config, image_size: int):
    """The checkpoint's saved image processor (Pillow backend), else ViT's default (resize, scale,
    normalise with mean = std = 0.5); resized to ``image_size`` if that differs from what it produces."""
    from transformers import AutoImageProcessor, ViTImageProcessorPil

    if (Path(checkpoint) / "preprocessor_config.json").exists():
        proc = AutoImageProcessor.from_pretrained(checkpoint)
        size = proc.crop_size if getattr(proc, "do_center_crop", False) else proc.size
        if size.get("height") == image_size and size.get("width") == image_size:
            return proc
        return ViTImageProcessorPil(size={"height": image_size, "width": image_size},
                                    image_mean=proc.image_mean, image_std=proc.image_std)
    log.info("no preprocessor_config.json in %s; using ViT's default image processor", checkpoint)
    return ViTImageProcessorPil(size={"height": image_size, "width": image_size})


def build_model(checkpoint: str, config, classes: list[str]):
    """The backbone from ``checkpoint`` with a new, randomly initialised head for ``classes``.

    Raises:
        ValueError: backbone weights missing from the checkpoint.
    """
    from transformers import DeiTForImageClassification, ViTForImageClassification

    cls = {"vit": ViTForImageClassification, "deit": DeiTForImageClassification}[config.model_type]
    # the old head (classifier / cls_classifier / distillation_classifier) is dropped or re-initialised on purpose
    # (a different label set); the backbone loads whole or not at all
    model = load_weights(cls, checkpoint, HEADS, what="--checkpoint", num_labels=len(classes),
                         id2label=dict(enumerate(classes)), label2id={c: i for i, c in enumerate(classes)})[0]
    torch.nn.init.zeros_(model.classifier.bias)
    torch.nn.init.trunc_normal_(model.classifier.weight, std=0.02)  # ViT/DeiT head init
    return model


class Images(torch.utils.data.Dataset):
    """(PIL image, label) pairs; a random horizontal flip when ``augment`` is set."""

    def __init__(self, data: ImageSet, augment: bool, seed: int = 0):
        self.data, self.augment, self.rng = data, augment, np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        im = load_image(self.data.items[i])
        if self.augment and self.rng.random() < 0.5:
            im = ImageOps.mirror(im)
        return {"image": im, "labels": self.data.labels[i]}


def collate_fn(processor, interpolate: bool):
    """Batch through the image processor: pixel_values [B, 3, H, W], labels [B]."""
    def collate(items: list[dict]) -> dict:
        out = {"pixel_values": processor([it["image"] for it in items], return_tensors="pt")["pixel_values"],
               "labels": torch.tensor([it["labels"] for it in items])}
        if interpolate:
            out["interpolate_pos_encoding"] = True
        return out
    return collate


@terminal_bars()  # a log file gets lines, not the bars of transformers
def run_transfer(cfg: TransferConfig, accelerator=None) -> dict:
    """Fine-tune ``cfg.checkpoint`` on ``cfg.dataset``; return top-1 accuracy and the run's facts.

    Raises:
        FileNotFoundError / ValueError: bad checkpoint, dataset path, split or labels (see the helpers).
    """
    t0 = time.time()
    config = check_checkpoint(cfg.checkpoint)
    size = cfg.image_size or config.image_size
    processor = load_processor(cfg.checkpoint, config, size)
    train, test = load_dataset_splits(cfg.dataset, cfg.max_train_samples, cfg.max_eval_samples, cfg.eval_split,
                                      cfg.label_column, cfg.image_column)
    log.info("%s: %d train / %d eval images, %d classes, %dx%d pixels", cfg.dataset, len(train), len(test),
             len(train.classes), size, size)
    accelerator = accelerator or make_accelerator(cpu=cfg.cpu, mixed_precision=cfg.mixed_precision)
    ft = FinetuneConfig(lr=cfg.lr, epochs=cfg.epochs, batch_size=cfg.batch_size, seed=cfg.seed,
                        weight_decay=cfg.weight_decay, warmup_ratio=cfg.warmup_ratio, scheduler=cfg.scheduler,
                        num_workers=cfg.num_workers)
    t1 = time.time()
    out = finetune(lambda: build_model(cfg.checkpoint, config, train.classes), Images(train, cfg.hflip, cfg.seed),
                   {"test": Images(test, False)}, collate_fn(processor, size != config.image_size), ft,
                   accelerator, lambda logits: logits.argmax(-1), desc=f"{Path(cfg.dataset).name} lr={cfg.lr:g}")
    preds, labels = out["test"]
    return {"checkpoint": str(cfg.checkpoint), "dataset": cfg.dataset, "config": asdict(cfg),
            "top1": M.accuracy(preds.numpy(), labels.numpy()), "n_train": len(train), "n_eval": len(labels),
            "num_labels": len(train.classes), "image_size": size, "model_type": config.model_type,
            "num_processes": accelerator.num_processes,
            "train_eval_seconds": round(time.time() - t1, 1), "seconds": round(time.time() - t0, 1)}


def dataset_slug(dataset: str) -> str:
    """A file-name-safe short name for a dataset argument (``hf:a/b`` -> ``hf_a_b``, a folder -> its name)."""
    name = dataset if dataset == "cifar10" or dataset in HF_ALIASES or dataset.startswith("hf:") else Path(dataset).name
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m eval.deit_transfer", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Fine-tune a ViT/DeiT checkpoint folder (e.g. from train.py) on an image dataset; report top-1.\n\n"
        "The old head is replaced by a new one for the dataset's classes; images are resized to the model's\n"
        "image size by its saved image processor (or ViT's default). Datasets: cifar10 (bundled JPEGs, offline),\n"
        f"{', '.join(HF_ALIASES)} (Hugging Face hub, online), hf:<name>[:<config>], or a local folder with\n"
        "train/<class>/* and test|val|validation/<class>/*. Results: JSON next to the checkpoint + table.\n"
        "Multi-GPU: accelerate launch -m eval.deit_transfer ...",
        epilog="examples:\n  python -m eval.deit_transfer --checkpoint outputs/deit_cifar10/final --quick\n"
               "  python -m eval.deit_transfer --checkpoint outputs/deit_cifar10/final --dataset ~/flowers --epochs 30")
    p.add_argument("--checkpoint", required=True, help="ViT/DeiT folder written by save_pretrained")
    p.add_argument("--dataset", default="cifar10",
                   help=f"cifar10 | {' | '.join(HF_ALIASES)} | hf:<name>[:<config>] | folder")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 epoch, 2000 train / 1000 eval images "
                   "(class-balanced for cifar10 and folders); explicit flags win")
    p.add_argument("--epochs", type=float, help="fine-tuning epochs, fractions ok (default 10; --quick: 1)")
    p.add_argument("--lr", type=float, default=1e-4, help="peak AdamW learning rate (default 1e-4)")
    p.add_argument("--batch_size", type=int, default=64, help="global batch over all processes (default 64)")
    p.add_argument("--weight_decay", type=float, default=0.05, help="AdamW weight decay (not on biases/norms)")
    p.add_argument("--warmup_ratio", type=float, default=0.1, help="fraction of steps with linear warm-up")
    p.add_argument("--scheduler", default="cosine", help="LR decay after warm-up (transformers get_scheduler name)")
    p.add_argument("--image_size", type=int, help="input resolution (default: the checkpoint's config.image_size)")
    p.add_argument("--seed", type=int, default=0, help="seed of the new head's init and the data order")
    p.add_argument("--no_hflip", dest="hflip", action="store_false", help="no random horizontal flips in training")
    p.add_argument("--max_train_samples", type=int, help="subset of the train split")
    p.add_argument("--max_eval_samples", type=int, help="subset of the evaluation split")
    p.add_argument("--eval_split", help="evaluation split name (default: test, else validation/valid/val)")
    p.add_argument("--label_column", help="Hub datasets: label column (default: label / fine_label / first ClassLabel)")
    p.add_argument("--image_column", help="Hub datasets: image column (default: the first Image feature)")
    p.add_argument("--num_workers", type=int, default=0, help="DataLoader workers decoding images")
    p.add_argument("--output", help="results JSON (default: beside the run, never inside it: "
                   "outputs/<run>.final.transfer_<dataset>[_quick].json for outputs/<run>/final)")
    add_run_args(p, "growtrain-eval", "transfer-<dataset>-<checkpoint folder name>")
    return p.parse_args(argv)


def config_from_args(a: argparse.Namespace) -> TransferConfig:
    """TransferConfig from parsed flags: explicit flags win over --quick's, which win over the defaults."""
    names = {f.name for f in fields(TransferConfig)}
    kw = {k: v for k, v in vars(a).items() if k in names and v is not None}
    if a.quick:
        kw = {**QUICK, **kw}
    cfg = TransferConfig(**kw)
    FinetuneConfig(epochs=cfg.epochs, lr=cfg.lr, batch_size=cfg.batch_size)  # bad values fail before any loading
    return cfg


def main(argv: list[str] | None = None) -> dict:
    """CLI entry point: run, save JSON beside the checkpoint (``default_output``), log to the tracker, print the
    table."""

    a = parse_args(argv)
    cfg = config_from_args(a)
    ckpt, slug = Path(cfg.checkpoint), dataset_slug(cfg.dataset)
    default = default_output(ckpt, f"transfer_{slug}{'_quick' if a.quick else ''}.json")  # outside the run
    out = results_path(output_or(a.output, default), TOOL)
    accelerator = start_cli(cpu=cfg.cpu, mixed_precision=cfg.mixed_precision)
    res = run_transfer(cfg, accelerator)
    if accelerator.is_main_process:
        out = save_results(res, out, TOOL)
        print(format_table([{"dataset": cfg.dataset, "top-1 %": round(100 * res["top1"], 2), "epochs": cfg.epochs,
                             "lr": cfg.lr, "batch": cfg.batch_size, "image": res["image_size"], "train": res["n_train"],
                             "eval": res["n_eval"], "s": res["seconds"]}]))
        print(f"results: {out}")
    log_results({f"transfer/{slug}/top1": 100 * res["top1"]}, a.report_to, a.project, a.run_name,
                a.logging_dir or out.parent / "eval_logs", config=res["config"], checkpoint=ckpt,
                kind=f"transfer-{slug}", default_name=f"transfer-{slug}-{ckpt.name}")
    return res


def cli(argv: list[str] | None = None) -> int:
    """``python -m ...``: ``main`` with one-line errors (exit code 2) instead of tracebacks (``--debug``)."""

    return run_cli(main, argv)


if __name__ == "__main__":
    sys.exit(cli())
