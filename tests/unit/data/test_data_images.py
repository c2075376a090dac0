"""Images: bundled CIFAR-10, local class folders, HF image datasets (save_to_disk), stratified caps, caching."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import ViTImageProcessor

from progressive.config import DataConfig
from progressive.data import load_image_split, make_image_processor
from progressive.data.images import CIFAR10_CLASSES, stratified_subset, stratified_val_mask

COLORS = {"blue": (0, 0, 255), "green": (0, 255, 0), "red": (255, 0, 0)}


@pytest.fixture(scope="module")
def proc():
    return ViTImageProcessor(size={"height": 16, "width": 16})


def test_cifar10_subsample_is_stratified_and_cached(proc, tmp_path, monkeypatch):
    cfg = DataConfig(dataset="cifar10", max_images=40, cache_dir=str(tmp_path))
    s = load_image_split(cfg, "validation", proc)
    assert s.pixel_values.shape == (40, 3, 16, 16) and s.pixel_values.dtype == torch.float32
    assert s.labels.bincount(minlength=10).tolist() == [4] * 10
    assert s.num_labels == 10 and s.label_names == CIFAR10_CLASSES
    assert -1.0 <= s.pixel_values[:].min() and s.pixel_values[:].max() <= 1.0  # ViT normalisation: (x/255 - .5)/.5
    import progressive.data.images as di

    monkeypatch.setattr(di, "_items", lambda *a: pytest.fail("cache miss: decoded again"))
    again = load_image_split(cfg, "test", proc)  # "test" is an alias of "validation"
    assert torch.equal(again.pixel_values[:], s.pixel_values[:]) and torch.equal(again.labels, s.labels)


def _write_folder(root, n_per_class=6, size=(20, 12)):
    for name, rgb in COLORS.items():
        (root / name).mkdir(parents=True)
        for i in range(n_per_class):
            Image.new("RGB", size, rgb).save(root / name / f"{i}.png")


def test_image_folder_labels_follow_sorted_class_folders(proc, tmp_path):
    _write_folder(tmp_path / "imgs")
    cfg = DataConfig(dataset=str(tmp_path / "imgs"), val_fraction=0.34, cache_dir=str(tmp_path / "c"))
    tr, va = load_image_split(cfg, "train", proc), load_image_split(cfg, "validation", proc)
    assert tr.label_names == ["blue", "green", "red"]
    assert len(tr.labels) == 12 and len(va.labels) == 6  # 2 of 6 per class held out
    assert tr.labels.bincount().tolist() == [4, 4, 4] and va.labels.bincount().tolist() == [2, 2, 2]
    for split in (tr, va):
        channel = split.pixel_values[:].mean(dim=(2, 3)).argmax(dim=1)  # brightest channel: R=0, G=1, B=2
        assert (channel == torch.tensor([2, 1, 0])[split.labels]).all()


def test_image_folder_with_train_and_val_subfolders(proc, tmp_path):
    _write_folder(tmp_path / "imgs" / "train", n_per_class=3)
    _write_folder(tmp_path / "imgs" / "val", n_per_class=1)
    cfg = DataConfig(dataset=str(tmp_path / "imgs"), cache_dir=str(tmp_path / "c"))
    assert len(load_image_split(cfg, "train", proc).labels) == 9
    assert len(load_image_split(cfg, "val", proc).labels) == 3


def test_hf_image_dataset_from_save_to_disk(proc, tmp_path):
    import datasets

    feats = datasets.Features({"img": datasets.Image(), "fine": datasets.ClassLabel(names=list(COLORS))})
    rows = {"img": [Image.new("RGB", (8, 8), rgb) for rgb in COLORS.values()] * 4, "fine": [0, 1, 2] * 4}
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows, features=feats)})
    dd.save_to_disk(str(tmp_path / "ds"))
    cfg = DataConfig(dataset=f"hf:{tmp_path / 'ds'}", val_fraction=0.25, cache_dir=str(tmp_path / "c"))
    tr, va = load_image_split(cfg, "train", proc), load_image_split(cfg, "validation", proc)
    assert tr.label_names == list(COLORS) and len(tr.labels) == 9 and len(va.labels) == 3
    channel = tr.pixel_values[:].mean(dim=(2, 3)).argmax(dim=1)
    assert (channel == torch.tensor([2, 1, 0])[tr.labels]).all()  # blue, green, red


def test_stratified_helpers_are_balanced_and_deterministic():
    labels = np.repeat(np.arange(5), [100, 50, 20, 5, 1])
    sub = stratified_subset(labels, 20, seed=0)
    assert np.bincount(labels[sub], minlength=5).tolist() == [5, 5, 5, 4, 1]  # small classes give what they have
    np.testing.assert_array_equal(sub, stratified_subset(labels, 20, seed=0))
    assert not np.array_equal(sub, stratified_subset(labels, 20, seed=1))
    val = stratified_val_mask(labels, 0.1, seed=0)
    assert np.bincount(labels[val], minlength=5).tolist() == [10, 5, 2, 1, 1]


def test_missing_image_folder_and_bad_split_are_errors(proc, tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_image_split(DataConfig(dataset=str(tmp_path / "nowhere")), "train", proc)
    with pytest.raises(ValueError, match="split must be one of"):
        load_image_split(DataConfig(dataset="cifar10"), "holdout", proc)


def test_make_image_processor_gives_image_size_squares(tmp_path):
    cfg = DataConfig(dataset="cifar10", max_images=10, image_size=24, cache_dir=str(tmp_path))
    s = load_image_split(cfg, "validation", make_image_processor(cfg, "deit"))
    assert s.pixel_values.shape == (10, 3, 24, 24)
    with pytest.raises(ValueError, match="family"):
        make_image_processor(cfg, "resnet")


@pytest.mark.parametrize("family", ["vit", "deit"])
def test_uint8_cache_gives_the_processors_float32_pixels_bit_for_bit(tmp_path, family):
    """The cache keeps a quarter of the bytes; a batch is rescaled and normalised with the processor's own
    arithmetic, so training sees exactly what the processor would have given."""
    import numpy as np

    from progressive.data.images import _cifar_items, _to_pil, make_image_processor

    cfg = DataConfig(dataset="cifar10", max_images=30, cache_dir=str(tmp_path), image_size=16)
    proc = make_image_processor(cfg, family)
    s = load_image_split(cfg, "validation", proc)
    assert s.pixel_values.raw.dtype == np.uint8 and s.pixel_values.raw.nbytes == 30 * 3 * 16 * 16
    items, labels, _ = _cifar_items("validation")
    from progressive.data.images import stratified_subset

    keep = stratified_subset(labels, 30, cfg.seed)
    want = proc(images=[_to_pil(items[i]) for i in keep], return_tensors="pt")["pixel_values"]
    got = s.pixel_values[torch.arange(30)]
    assert got.dtype == torch.float32 and torch.equal(got, want)
