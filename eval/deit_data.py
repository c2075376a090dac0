"""Image datasets for eval.deit_transfer: bundled CIFAR-10 JPEGs, Hugging Face datasets, local folders.

Every source becomes an ``ImageSet``: a list of items, integer labels and class names, where items are
decoded lazily (``load_image``) so Flowers/Cars-sized images never sit in memory all at once. Pixels are
produced per batch by the checkpoint's image processor (transformers, Pillow backend: no torchvision).

Sources (``--dataset``):
    cifar10                       bundled data/cifar10/cifar10_{train_50k,test_10k}_jpeg.tar.gz, labels 0-9 =
                                  airplane..truck (CIFAR order); JPEG re-encodings (see data/SOURCES.md)
    cifar100 | flowers102 | stanford_cars   aliases of Hub datasets (``HF_ALIASES``; need the network)
    hf:<name>[:<config>]          any Hub image-classification dataset (image / label columns auto-detected)
    <folder>                      local images: <folder>/train/<class>/* and <folder>/{test,val,validation}/<class>/*
"""

from __future__ import annotations

import io
import logging
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from common.hub import hub_call
from common.paths import DATA

log = logging.getLogger("eval.deit_transfer")
CIFAR_DIR = DATA / "cifar10"
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR10_FILES = {"train": "cifar10_train_50k_jpeg.tar.gz", "test": "cifar10_test_10k_jpeg.tar.gz"}
# name -> (hub id, config, label column). Names as commonly used on the Hub; not verifiable offline here.
HF_ALIASES = {
    "cifar100": ("uoft-cs/cifar100", None, "fine_label"),
    "flowers102": ("nelorth/oxford-flowers", None, None),
    "stanford_cars": ("tanganke/stanford_cars", None, None),
}
EVAL_SPLITS = ("test", "validation", "valid", "val")
IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


@dataclass
class ImageSet:
    """Items (arrays, paths or a Hub dataset), labels 0..num_labels-1, class names."""

    items: object
    labels: list[int]
    classes: list[str]

    def __len__(self) -> int:
        return len(self.labels)


def load_image(item) -> Image.Image:
    """Decode one item (uint8 HWC array, file path or PIL image) to an RGB PIL image."""
    if isinstance(item, np.ndarray):
        return Image.fromarray(item)
    if isinstance(item, str | Path):
        with Image.open(item) as im:
            return im.convert("RGB")
    return item.convert("RGB")


def balanced_quota(n: int | None, num_classes: int) -> list[int | None]:
    """Per-class counts that sum to ``n`` (the first ``n % k`` classes get one more)."""
    if n is None:
        return [None] * num_classes
    return [n // num_classes + (c < n % num_classes) for c in range(num_classes)]


def load_cifar10(split: str, max_samples: int | None = None, root: str | Path = CIFAR_DIR) -> ImageSet:
    """The bundled CIFAR-10 JPEGs of ``split`` ("train" | "test"), optionally a class-balanced subset.

    The subset takes the first images of each class in file order, so it is the same on every run.

    Raises:
        FileNotFoundError: the tar file is missing (the message names it).
        ValueError: unknown split or an unexpected class folder in the archive.
    """
    if split not in CIFAR10_FILES:
        raise ValueError(f"CIFAR-10 split must be one of {list(CIFAR10_FILES)}, got {split!r}")
    path = Path(root) / CIFAR10_FILES[split]
    if not path.exists():
        raise FileNotFoundError(f"CIFAR-10 {split} archive not found: {path} (see data/SOURCES.md)")
    quota = balanced_quota(max_samples, len(CIFAR10_CLASSES))
    taken = [0] * len(CIFAR10_CLASSES)
    items, labels = [], []
    with tarfile.open(path, "r:gz") as tf:
        for m in tf:  # streaming: members are read in order, never all decompressed at once
            if not m.isfile() or not m.name.endswith(".jpg"):
                continue
            cls = m.name.split("/")[-2]
            if cls not in CIFAR10_CLASSES:
                raise ValueError(f"{path}: member {m.name} is in unknown class folder {cls!r}")
            c = CIFAR10_CLASSES.index(cls)
            if quota[c] is not None and taken[c] >= quota[c]:
                continue
            with Image.open(io.BytesIO(tf.extractfile(m).read())) as im:
                items.append(np.asarray(im.convert("RGB")))
            labels.append(c)
            taken[c] += 1
    return ImageSet(items, labels, list(CIFAR10_CLASSES))


def load_folder(root: str | Path, split: str, classes: list[str] | None = None,
                max_samples: int | None = None) -> ImageSet:
    """Images under ``root/<split>/<class>/``; labels follow ``classes`` (default: sorted train folders).

    Raises:
        FileNotFoundError: ``root/<split>`` is missing or holds no images.
        ValueError: a class folder of this split is not among ``classes``.
    """
    base = Path(root) / split
    if not base.is_dir():
        raise FileNotFoundError(f"image folder split not found: {base} (expected {base}/<class>/<image>)")
    dirs = sorted(d for d in base.iterdir() if d.is_dir())
    classes = classes or [d.name for d in dirs]
    unknown = [d.name for d in dirs if d.name not in classes]
    if unknown:
        raise ValueError(f"{base}: class folder(s) {unknown} are not among the train classes {classes}")
    per_class = [sorted(p for p in d.iterdir() if p.suffix.lower() in IMAGE_EXTS) for d in dirs]
    quota = balanced_quota(max_samples, len(dirs))
    items, labels = [], []
    for d, files, q in zip(dirs, per_class, quota):
        items += [str(p) for p in files[:q]]
        labels += [classes.index(d.name)] * len(files[:q])
    if not items:
        raise FileNotFoundError(f"no images ({', '.join(sorted(IMAGE_EXTS))}) under {base}/<class>/")
    return ImageSet(items, labels, classes)


def load_hf(name: str, config: str | None, split: str, label_column: str | None = None,
            image_column: str | None = None, max_samples: int | None = None, seed: int = 0) -> ImageSet:
    """One split of a Hub image-classification dataset (needs the network unless cached).

    Raises:
        ValueError: no image / label column found, or a label outside the dataset's classes (names the row).
    """
    from datasets import ClassLabel, load_dataset
    from datasets import Image as HFImage

    ds = hub_call(f"dataset {name!r} split {split!r}", lambda: load_dataset(name, config, split=split))
    feats = ds.features
    image_column = image_column or next((k for k, f in feats.items() if isinstance(f, HFImage)), None)
    label_column = label_column or next((k for k in ("label", "fine_label", "labels") if k in feats), None) or \
        next((k for k, f in feats.items() if isinstance(f, ClassLabel)), None)
    if image_column not in feats or label_column not in feats:
        raise ValueError(f"{name}:{split}: cannot find image/label columns in {list(feats)}; "
                         "pass --image_column / --label_column")
    f = feats[label_column]
    classes = list(f.names) if isinstance(f, ClassLabel) else None
    labels = [int(y) for y in ds[label_column]]
    n = len(classes) if classes else max(labels) + 1
    check_labels(labels, n, f"{name}:{split}")
    if max_samples is not None and max_samples < len(labels):
        keep = np.sort(np.random.default_rng(seed).choice(len(labels), size=max_samples, replace=False))
        ds, labels = ds.select(keep), [labels[i] for i in keep]
    items = _Column(ds, image_column)
    return ImageSet(items, labels, classes or [str(i) for i in range(n)])


class _Column:
    """Lazy view of one image column of a Hub dataset (decodes on access)."""

    def __init__(self, ds, column: str):
        self.ds, self.column = ds, column

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int):
        return self.ds[int(i)][self.column]


def check_labels(labels: list[int], num_labels: int, where: str) -> None:
    """Raise ValueError naming the first row whose label is outside 0..num_labels-1."""
    for i, y in enumerate(labels):
        if not 0 <= y < num_labels:
            raise ValueError(f"{where} row {i}: label {y} outside the {num_labels} classes 0..{num_labels - 1}")


def load_dataset_splits(dataset: str, max_train: int | None = None, max_eval: int | None = None,
                        eval_split: str | None = None, label_column: str | None = None,
                        image_column: str | None = None) -> tuple[ImageSet, ImageSet]:
    """Train and evaluation ImageSets for a ``--dataset`` value (see the module docstring).

    Raises:
        FileNotFoundError: a local path or split that does not exist (named in the message).
        ValueError: labels outside the train classes.
    """
    if dataset == "cifar10":
        return load_cifar10("train", max_train), load_cifar10("test", max_eval)
    if dataset in HF_ALIASES or dataset.startswith("hf:"):
        if dataset in HF_ALIASES:
            name, config, alias_label = HF_ALIASES[dataset]
        else:  # hf:<name>[:<config>]
            name, _, config = dataset[3:].partition(":")
            config, alias_label = config or None, None
        label_column = label_column or alias_label
        if eval_split is None:
            from datasets import get_dataset_split_names

            names = get_dataset_split_names(name, config)
            eval_split = next((s for s in EVAL_SPLITS if s in names), None)
            if eval_split is None:
                raise ValueError(f"{name}: no evaluation split among {names}; pass --eval_split")
        train = load_hf(name, config, "train", label_column, image_column, max_train)
        test = load_hf(name, config, eval_split, label_column, image_column, max_eval)
        check_labels(test.labels, len(train.classes), f"{name}:{eval_split}")
        return train, test
    root = Path(dataset)
    if not root.is_dir():
        raise FileNotFoundError(f"--dataset {dataset!r} is not cifar10, a Hub alias ({', '.join(HF_ALIASES)}), "
                                "hf:<name>, or an existing folder")
    train = load_folder(root, "train", max_samples=max_train)
    split = eval_split or next((s for s in EVAL_SPLITS if (root / s).is_dir()), None)
    if split is None:
        raise FileNotFoundError(f"no evaluation split under {root}: expected one of {', '.join(EVAL_SPLITS)}/")
    return train, load_folder(root, split, classes=train.classes, max_samples=max_eval)
