"""Image classification data: bundled CIFAR-10 JPEGs, Hugging Face image datasets, or a local image folder,
preprocessed by a transformers image processor (no torchvision) and cached on disk.

Sources (cfg.dataset):
- "cifar10": data/cifar10/cifar10_{train_50k,test_10k}_jpeg.tar.gz, members cifar10/<split>/<class>/<NNNN>.jpg,
  labels 0..9 in CIFAR order (airplane ... truck). split "train" -> the train archive; "validation" -> the test
  archive (CIFAR-10 has no separate validation set; its test set is the usual evaluation split).
- "hf:<name>[:<config>]": the first Image column and the first ClassLabel column; "validation" reads the
  validation (or val/valid/test) split, else a stratified val_fraction of train chosen by seed.
- a folder: <root>/<class>/*.jpg|png|...; or <root>/train/<class>/... plus <root>/val|validation|test/<class>/...;
  without such split folders a stratified val_fraction is split off by seed.

cfg.max_images caps each split, stratified by class (round-robin over each class's seeded shuffle) so class
balance is kept. The processor resizes; the resized images are cached as uint8 [N, 3, H, W] (a quarter of the
float32 the processor returns: ImageNet-1k at 224 px is 193 GB, not 770) with the labels under
cfg.cache_dir/images/<key>/ (key: source identity, split, seed, val_fraction, max_images, processor config),
written a chunk at a time, atomically, and memory-mapped when read back. A batch is rescaled and normalised
when it is taken (``Pixels``), with the processor's own arithmetic: the same float32 values, bit for bit.
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from common.io import atomic_write_json, publish_once
from progressive.data.cache import building, cache_key, check_sealed, reserved_npy, seal
from progressive.data.identity import content_identity
from progressive.data.sources import DATA_ROOT, hf_identity, load_hf_dataset

if TYPE_CHECKING:
    from progressive.config import DataConfig

__all__ = ["ImageSplit", "Pixels", "load_image_split", "make_image_processor", "CIFAR10_CLASSES"]

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
CIFAR10_FILES = {"train": "cifar10_train_50k_jpeg.tar.gz", "validation": "cifar10_test_10k_jpeg.tar.gz"}
_IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
_SPLIT_ALIASES = {"train": "train", "validation": "validation", "val": "validation", "valid": "validation",
                  "eval": "validation", "test": "validation"}
_HF_VAL = ("validation", "valid", "val", "test")
_FOLDER_VAL = ("val", "validation", "valid", "test")
_CACHE_VERSION = 3  # 2: sources identified by content digests, not sizes and mtimes; 3: uint8 pixels
_CHUNK = 1000  # images per image-processor call


class Pixels:
    """Images stored as uint8 [N, 3, H, W]; indexing returns float32 tensors rescaled and normalised as the
    image processor does, bit for bit, without its float64 pass: a uint8 has 256 values, so each channel's
    256 outputs are computed once with the processor's arithmetic (rescale in float64, then cast, subtract
    the mean, divide by the std in float32) and a batch is a table look-up (a quarter of the memory traffic
    and none of the float64 arithmetic per pixel)."""

    def __init__(self, raw: np.ndarray, processor) -> None:
        self.raw = raw
        scale = float(processor.rescale_factor) if getattr(processor, "do_rescale", True) else None
        values = np.arange(256, dtype=np.uint8)
        x = (values.astype(np.float64) * scale).astype(np.float32) if scale is not None else values.astype(np.float32)
        channels = raw.shape[1] if raw.ndim == 4 else 3
        self.table = np.repeat(x[None], channels, axis=0)  # [C, 256] float32
        if getattr(processor, "do_normalize", True):
            mean = np.broadcast_to(np.asarray(processor.image_mean, np.float32), (channels,))[:, None]
            std = np.broadcast_to(np.asarray(processor.image_std, np.float32), (channels,))[:, None]
            self.table = (self.table - mean) / std

    def __len__(self) -> int:
        return len(self.raw)

    @property
    def shape(self) -> torch.Size:
        return torch.Size(self.raw.shape)

    dtype = torch.float32

    def __getitem__(self, idx) -> torch.Tensor:
        idx = idx.numpy() if isinstance(idx, torch.Tensor) else idx
        x = np.asarray(self.raw[idx])
        out = np.empty(x.shape, np.float32)
        for c in range(x.shape[-3]):
            np.take(self.table[c], x[..., c, :, :], out=out[..., c, :, :])
        return torch.from_numpy(out)


@dataclass
class ImageSplit:
    """pixel_values: [N, 3, H, W] (``Pixels``: uint8 on disk, float32 when indexed); labels: long [N];
    num_labels; label_names; path: cache folder."""

    pixel_values: Pixels
    labels: torch.Tensor
    num_labels: int
    label_names: list[str]
    path: Path


def make_image_processor(cfg: DataConfig, family: str = "vit"):
    """A ViTImageProcessor producing cfg.image_size squares: mean/std 0.5 for "vit" (ViT's convention), the
    ImageNet mean/std for "deit" (DeiT's). Save it next to checkpoints with save_pretrained.

    Raises:
        ValueError: unknown family.
    """
    from transformers import ViTImageProcessor

    stats = {"vit": ([0.5] * 3, [0.5] * 3), "deit": ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])}
    if family not in stats:
        raise ValueError(f"make_image_processor: family must be one of {sorted(stats)}, got {family!r}")
    mean, std = stats[family]
    return ViTImageProcessor(size={"height": cfg.image_size, "width": cfg.image_size}, image_mean=mean, image_std=std)


def _stratified_rank(labels: np.ndarray, seed: int) -> np.ndarray:
    """Each item's position in its class after a seeded shuffle (0 = first pick of its class)."""
    rng = np.random.default_rng(seed)
    rank = np.empty(len(labels), dtype=np.int64)
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        rank[idx[rng.permutation(len(idx))]] = np.arange(len(idx))
    return rank


def stratified_subset(labels: np.ndarray, k: int | None, seed: int) -> np.ndarray:
    """Sorted indices of ``k`` items taken round-robin over classes (balanced); all items if k is None."""
    if k is None or k >= len(labels):
        return np.arange(len(labels))
    if k < 1:
        raise ValueError(f"max_images must be >= 1, got {k}")
    rank = _stratified_rank(labels, seed)
    order = np.lexsort((labels, rank))  # by rank, then class: one of each class before any second
    return np.sort(order[:k])


def stratified_val_mask(labels: np.ndarray, val_fraction: float, seed: int) -> np.ndarray:
    """Boolean mask of validation items: round(val_fraction * n_c) per class (at least 1), chosen by seed."""
    rank = _stratified_rank(labels, seed + 1_000_003)  # a different stream than the subsample's
    counts = np.bincount(labels)
    n_val = np.maximum(1, np.round(counts * val_fraction)).astype(np.int64)
    return rank < n_val[labels]


def _cifar_items(split: str) -> tuple[list, np.ndarray, list[str]]:
    path = DATA_ROOT / "cifar10" / CIFAR10_FILES[split]
    if not path.exists():
        raise FileNotFoundError(f"bundled CIFAR-10 archive {path} is missing (dataset='cifar10')")
    blobs, labels = [], []
    with tarfile.open(path) as tar:
        members = sorted((m for m in tar.getmembers() if m.isfile() and m.name.endswith(".jpg")),
                         key=lambda m: m.name)
        for m in members:
            blobs.append(tar.extractfile(m).read())
            labels.append(CIFAR10_CLASSES.index(Path(m.name).parent.name))
    return blobs, np.asarray(labels, dtype=np.int64), list(CIFAR10_CLASSES)


def _folder_classes(root: Path) -> tuple[list[Path], np.ndarray, list[str]]:
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    files, labels = [], []
    for c, name in enumerate(classes):
        for f in sorted((root / name).rglob("*")):
            if f.suffix.lower() in _IMAGE_EXTS:
                files.append(f)
                labels.append(c)
    if not files:
        raise ValueError(f"dataset={str(root)!r}: no images in class subfolders (expected <root>/<class>/*.jpg)")
    return files, np.asarray(labels, dtype=np.int64), classes


def _folder_items(cfg: DataConfig, split: str) -> tuple[list, np.ndarray, list[str]]:
    root = Path(cfg.dataset).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {str(root)!r} does not exist (dataset=...)")
    val_dir = next((root / v for v in _FOLDER_VAL if (root / v).is_dir()), None)
    if (root / "train").is_dir() and val_dir is not None:
        files, labels, classes = _folder_classes(root / ("train" if split == "train" else val_dir.name))
        return files, labels, classes
    files, labels, classes = _folder_classes(root)
    keep = stratified_val_mask(labels, cfg.val_fraction, cfg.seed) == (split == "validation")
    return [f for f, k in zip(files, keep) if k], labels[keep], classes


def _hf_image_columns(ds) -> tuple[str, str]:
    import datasets

    img = next((k for k, f in ds.features.items() if isinstance(f, datasets.Image)), None)
    lab = next((k for k, f in ds.features.items() if isinstance(f, datasets.ClassLabel)), None)
    if img is None or lab is None:
        raise ValueError(f"HF dataset needs an Image and a ClassLabel column; features: {dict(ds.features)}")
    return img, lab


def _hf_items(cfg: DataConfig, split: str) -> tuple[list, np.ndarray, list[str]]:
    name, _, config = cfg.dataset[3:].partition(":")
    dd = load_hf_dataset(name, config or None)
    if "train" not in dd:
        raise ValueError(f"dataset={cfg.dataset!r} has no 'train' split (splits: {sorted(dd)})")
    val_name = next((s for s in _HF_VAL if s in dd), None)
    ds = dd["train"] if split == "train" or val_name is None else dd[val_name]
    img, lab = _hf_image_columns(ds)
    labels = np.asarray(ds[lab], dtype=np.int64)
    idx = np.arange(len(ds))
    if val_name is None:
        idx = idx[stratified_val_mask(labels, cfg.val_fraction, cfg.seed) == (split == "validation")]
    column = ds[img]
    return [column[int(i)] for i in idx], labels[idx], list(ds.features[lab].names)


def _items(cfg: DataConfig, split: str) -> tuple[list, np.ndarray, list[str]]:
    if cfg.dataset == "cifar10":
        return _cifar_items(split)
    if cfg.dataset.startswith("hf:"):
        return _hf_items(cfg, split)
    return _folder_items(cfg, split)


def _identity(cfg: DataConfig) -> list:
    """The source's identity for cache keys: content digests of local files (names relative to their root,
    no absolute path: progressive.data.identity), or the Hugging Face datasets' fingerprints."""
    if cfg.dataset == "cifar10":
        root = DATA_ROOT / "cifar10"
        return ["cifar10", content_identity([root / f for f in sorted(CIFAR10_FILES.values())], root, cfg.cache_dir)]
    if cfg.dataset.startswith("hf:"):
        name, _, config = cfg.dataset[3:].partition(":")
        return hf_identity(cfg.dataset, load_hf_dataset(name, config or None))
    root = Path(cfg.dataset).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {str(root)!r} does not exist (dataset=...)")
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in _IMAGE_EXTS and p.is_file())
    return ["image folder", content_identity(files, root, cfg.cache_dir)]


def _to_pil(item) -> Image.Image:
    if isinstance(item, bytes):
        item = Image.open(io.BytesIO(item))
    elif isinstance(item, Path):
        item = Image.open(item)
    return item.convert("RGB")


def load_image_split(cfg: DataConfig, split: str, image_processor) -> ImageSplit:
    """Images and labels of ``split``, preprocessed by ``image_processor``; cached on disk.

    Args:
        cfg: DataConfig (dataset, seed, val_fraction, max_images, cache_dir).
        split: "train" or "validation" (aliases: val, valid, eval, test).
        image_processor: a transformers image processor (e.g. ViTImageProcessor(size=...)); its config is part
            of the cache key.

    Returns:
        ImageSplit with pixel_values [N, 3, H, W] (float32 when indexed) and long labels [N].

    Raises:
        FileNotFoundError: missing archive or folder. ValueError: unknown split, no images/columns.
    """
    if split not in _SPLIT_ALIASES:
        raise ValueError(f"split must be one of {sorted(_SPLIT_ALIASES)}, got {split!r}")
    split = _SPLIT_ALIASES[split]
    key = cache_key({
        "v": _CACHE_VERSION, "source": _identity(cfg), "split": split, "seed": cfg.seed,
        "val_fraction": cfg.val_fraction, "max_images": cfg.max_images,
        "processor": image_processor.to_json_string(),
    })
    folder = Path(cfg.cache_dir) / "images" / key
    with building(folder):  # one builder a folder; the others wait and read it
        if not (folder / "meta.json").exists():
            items, labels, names = _items(cfg, split)
            keep = stratified_subset(labels, cfg.max_images, cfg.seed)
            if not len(keep):
                raise ValueError(f"dataset={cfg.dataset!r} split {split!r} has no images")
            with publish_once(folder) as tmp:
                out = None
                for start in tqdm(range(0, len(keep), _CHUNK), desc=f"images {split}", disable=None):
                    pil = [_to_pil(items[i]) for i in keep[start:start + _CHUNK]]
                    resized = image_processor(images=pil, return_tensors="np", do_rescale=False,
                                              do_normalize=False)["pixel_values"]  # resized (and cropped) 0..255
                    if out is None:  # the processor decides the size (a resize, or a resize and a crop)
                        out = reserved_npy(tmp / "pixels_uint8.npy", np.uint8, (len(keep), *np.shape(resized)[1:]),
                                           shown=folder / "pixels_uint8.npy")  # reserved: a full disk is no SIGBUS
                    out[start:start + len(pil)] = np.clip(np.rint(resized), 0, 255).astype(np.uint8)
                out.flush()
                del out
                np.save(tmp / "labels.npy", labels[keep])
                atomic_write_json(tmp / "meta.json", seal(tmp, {"dataset": cfg.dataset, "split": split,
                                                                "label_names": names, "n": int(len(keep))}))
    meta = check_sealed(folder, cfg.cache_dir)
    pixels = Pixels(np.load(folder / "pixels_uint8.npy", mmap_mode="r"), image_processor)
    labels_t = torch.from_numpy(np.load(folder / "labels.npy")).long()
    names = meta["label_names"]
    return ImageSplit(pixel_values=pixels, labels=labels_t, num_labels=len(names), label_names=names, path=folder)
