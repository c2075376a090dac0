"""eval.deit_transfer: tiny ViT/DeiT transfer runs on bundled CIFAR-10 and local folders, W&B offline, bad input."""

import json
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import (
    BertConfig,
    BertModel,
    DeiTConfig,
    DeiTForImageClassificationWithTeacher,
    ViTConfig,
    ViTForImageClassification,
    ViTImageProcessorPil,
)

from eval import deit_transfer as dt
from eval.deit_data import check_labels, load_cifar10, load_dataset_splits

TINY = {"image_size": 32, "patch_size": 4, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 64}


@pytest.fixture(scope="module")
def deit_dir(tmp_path_factory):
    """A DeiT with distillation head (5 ImageNet-style classes) and its saved image processor."""
    d = tmp_path_factory.mktemp("deit_tiny")
    torch.manual_seed(0)
    DeiTForImageClassificationWithTeacher(DeiTConfig(**TINY, num_labels=5)).save_pretrained(d)
    ViTImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def vit_dir(tmp_path_factory):
    """A ViT classifier saved without an image processor (the default one is used)."""
    d = tmp_path_factory.mktemp("vit_tiny")
    torch.manual_seed(0)
    ViTForImageClassification(ViTConfig(**TINY)).save_pretrained(d)
    return d


def _colour_folder(root, n_train=16, n_test=6, classes=("red", "green", "blue")):
    """Noisy solid-colour 32x32 images: a task any working fine-tune solves."""
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("test", n_test)):
        for c, name in enumerate(classes):
            (root / split / name).mkdir(parents=True)
            for i in range(n):
                x = rng.integers(0, 60, size=(32, 32, 3))
                x[..., c % 3] += 180
                Image.fromarray(x.astype(np.uint8)).save(root / split / name / f"{i}.png")
    return root


def test_deit_cifar10_quick_run_writes_top1_json_and_wandb_offline(deit_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    res = dt.main(["--checkpoint", str(deit_dir), "--quick", "--max_train_samples", "40", "--max_eval_samples", "20",
                   "--batch_size", "8", "--output", str(tmp_path / "t.json"), "--report_to", "wandb",
                   "--logging_dir", str(tmp_path / "logs"), "--cpu"])
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["n_train"] == 40 and saved["n_eval"] == 20 and saved["num_labels"] == 10
    assert saved["model_type"] == "deit" and saved["top1"] == res["top1"]
    assert 0.0 <= saved["top1"] <= 1.0 and round(20 * saved["top1"]) == pytest.approx(20 * saved["top1"])
    runs = list((tmp_path / "logs").rglob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and b"transfer/cifar10/top1" in runs[0].read_bytes()


def test_vit_transfer_on_local_folder_learns_colour_classes(vit_dir, tmp_path):
    root = _colour_folder(tmp_path / "colours", n_train=8, n_test=6)
    cfg = dt.TransferConfig(str(vit_dir), dataset=str(root), epochs=4, lr=3e-3, batch_size=8, warmup_ratio=0.0,
                            cpu=True)
    res = dt.run_transfer(cfg)
    assert res["n_train"] == 24 and res["n_eval"] == 18 and res["num_labels"] == 3
    assert res["top1"] >= 0.9


def test_image_size_override_interpolates_position_embeddings(vit_dir, tmp_path):
    root = _colour_folder(tmp_path / "colours", n_train=4, n_test=2)
    res = dt.run_transfer(dt.TransferConfig(str(vit_dir), dataset=str(root), image_size=48, epochs=1, batch_size=4,
                                            cpu=True))
    assert res["image_size"] == 48 and res["n_eval"] == 6


def test_backbone_weights_load_and_head_is_replaced(deit_dir):
    config = dt.check_checkpoint(str(deit_dir))
    model = dt.build_model(str(deit_dir), config, ["a", "b", "c"])
    ref = DeiTForImageClassificationWithTeacher.from_pretrained(deit_dir)
    assert type(model).__name__ == "DeiTForImageClassification" and model.classifier.out_features == 3
    for (n, p), (n_ref, p_ref) in zip(model.deit.named_parameters(), ref.deit.named_parameters()):
        assert n == n_ref and torch.equal(p, p_ref)
    assert model.config.id2label == {0: "a", 1: "b", 2: "c"}


def test_cifar10_subset_is_class_balanced_32px_rgb():
    s = load_cifar10("test", 25)
    counts = Counter(s.labels)
    assert [counts[c] for c in range(10)] == [3] * 5 + [2] * 5
    assert s.items[0].shape == (32, 32, 3) and s.items[0].dtype == np.uint8
    assert s.classes[0] == "airplane" and s.classes[9] == "truck"


def test_text_checkpoint_is_rejected_naming_eval_glue(tmp_path):
    BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                         vocab_size=64)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="'bert' checkpoint.*eval.glue"):
        dt.run_transfer(dt.TransferConfig(str(tmp_path)))


def test_missing_paths_and_splits_are_named_in_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_dataset_splits(str(tmp_path / "nowhere"))
    root = _colour_folder(tmp_path / "c", n_train=1, n_test=1)
    for d in (root / "test").iterdir():
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
    (root / "test").rmdir()
    with pytest.raises(FileNotFoundError, match=r"no evaluation split under .*c: expected one of test"):
        load_dataset_splits(str(root))
    with pytest.raises(FileNotFoundError, match=r"cifar10_test_10k_jpeg\.tar\.gz"):
        load_cifar10("test", root=tmp_path)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        dt.check_checkpoint(str(tmp_path))


def test_eval_class_outside_train_classes_is_rejected(tmp_path):
    root = _colour_folder(tmp_path / "c", n_train=1, n_test=1)
    (root / "test" / "purple").mkdir()
    with pytest.raises(ValueError, match=r"class folder\(s\) \['purple'\] are not among the train classes"):
        load_dataset_splits(str(root))


def test_hub_label_outside_classes_names_the_row():
    check_labels([0, 2, 1], 3, "ds:test")
    with pytest.raises(ValueError, match="ds:test row 1: label 3 outside the 3 classes"):
        check_labels([0, 3, 1], 3, "ds:test")


def test_help_and_quick_defaults():
    a = dt.parse_args(["--checkpoint", "x", "--quick", "--epochs", "2"])
    cfg = dt.config_from_args(a)
    assert cfg.epochs == 2 and cfg.max_train_samples == 2000 and cfg.max_eval_samples == 1000 and cfg.hflip
    full = dt.config_from_args(dt.parse_args(["--checkpoint", "x"]))
    assert full.epochs == 10 and full.lr == 1e-4 and full.batch_size == 64 and full.max_train_samples is None
    assert dt.dataset_slug("hf:org/name:cfg") == "hf_org_name_cfg" and dt.dataset_slug("/a/b/flowers") == "flowers"


def test_help_names_datasets(capsys):
    with pytest.raises(SystemExit):
        dt.parse_args(["--help"])
    text = capsys.readouterr().out
    for phrase in ("cifar10", "cifar100", "flowers102", "stanford_cars", "train/<class>", "top-1", "accelerate launch"):
        assert phrase in text


def test_hub_alias_cifar100_uses_fine_labels_and_detects_the_image_column(monkeypatch):
    import datasets

    feats = datasets.Features({"img": datasets.Image(), "coarse_label": datasets.ClassLabel(names=["x", "y"]),
                               "fine_label": datasets.ClassLabel(names=["a", "b", "c"])})
    ims = [Image.new("RGB", (32, 32), (40 * i, 0, 0)) for i in range(3)]

    def fake_load(name, config, split):
        assert name == "uoft-cs/cifar100" and split in ("train", "test")
        return datasets.Dataset.from_dict({"img": ims, "coarse_label": [0, 1, 1], "fine_label": [2, 0, 1]},
                                          features=feats)
    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    monkeypatch.setattr(datasets, "get_dataset_split_names", lambda name, config: ["train", "test"])
    train, test = load_dataset_splits("cifar100", max_train=2)
    assert train.classes == ["a", "b", "c"] and len(train) == 2 and test.labels == [2, 0, 1]
    assert train.items[0].size == (32, 32)
