"""Fine-tuning through train.py: model.init_from (a checkpoint this project wrote), model.task classify on
the bundled GLUE TSVs for BERT-, GPT-2- and Llama-style models, ViT image classification, and the errors."""

import pytest
import torch
from transformers import AutoModelForSequenceClassification, BertForMaskedLM, ViTForImageClassification

from progressive.config import ConfigError
from progressive.run.trainer import Trainer
from tests.train_utils import rows, tiny_cfg


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A tiny BERT (masked LM) and a tiny ViT, pretrained for a few steps: outputs/<run>/final folders."""
    root = tmp_path_factory.mktemp("pretrained")
    out = {}
    for family in ("bert", "vit"):
        cfg = tiny_cfg(root, family=family, method="baseline", train__steps=3, model__num_layers=3)
        Trainer(cfg).run()
        out[family] = cfg.run_dir / "final"
    return out


def _classify(tmp_path, family, **over):
    base = dict(method="baseline", model__task="classify", data__dataset="glue:rte", data__seq_len=32,
                data__max_tokens=None, train__steps=4, train__eval_every=2, train__eval_batches=2)
    return tiny_cfg(tmp_path, family=family, **{**base, **over})


def test_bert_fine_tunes_on_glue_from_its_pretrained_checkpoint(tmp_path, pretrained):
    cfg = _classify(tmp_path, "bert", model__init_from=str(pretrained["bert"]), train__lr=1e-12, train__steps=2)
    Trainer(cfg).run()
    val = rows(cfg.run_dir, "val")
    assert all(0.0 <= r["val_accuracy"] <= 1.0 for r in val) and len(val) >= 2
    tuned = AutoModelForSequenceClassification.from_pretrained(cfg.run_dir / "final")
    assert type(tuned).__name__ == "BertForSequenceClassification" and tuned.config.num_labels == 2
    source = BertForMaskedLM.from_pretrained(pretrained["bert"]).bert.state_dict()
    mine = tuned.bert.state_dict()
    encoder = [k for k in source if k.startswith(("embeddings.", "encoder."))]
    # LR 1e-12: the weights are still the checkpoint's (a fresh initialisation would differ by ~0.02)
    assert encoder and all(torch.allclose(mine[k], source[k], rtol=0, atol=1e-8) for k in encoder)
    assert (cfg.run_dir / "final" / "tokenizer.json").is_file()  # the checkpoint's tokenizer went along


def _after_first_decision(run_dir):
    """Weights in the checkpoint written right after step 1 (AutoFreeze's first decision, freeze_every=1)."""
    from progressive.run.checkpoint import list_checkpoints, load_checkpoint

    return load_checkpoint(list_checkpoints(run_dir)[0])[1]["model"]


def test_autofreeze_fine_tuning_bert_leaves_the_frozen_encoder_untouched(tmp_path, pretrained):
    cfg = _classify(tmp_path, "bert", model__init_from=str(pretrained["bert"]), method="autofreeze",
                    method__autofreeze__freeze_every=1, method__autofreeze__alpha=0.9, train__steps=4,
                    method__autofreeze__criterion="bound",
                    train__checkpoint_every=1, train__keep_checkpoints=10)
    Trainer(cfg).run()
    assert [r["frozen"] for r in rows(cfg.run_dir, "train")] == [0, 3, 3, 3]
    early = _after_first_decision(cfg.run_dir)
    final = AutoModelForSequenceClassification.from_pretrained(cfg.run_dir / "final").state_dict()
    frozen = [k for k in final if k.startswith(("bert.embeddings.", "bert.encoder."))]
    assert frozen and all(torch.equal(final[k], early[k]) for k in frozen)
    assert not torch.equal(final["classifier.weight"], early["classifier.weight"])


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_decoders_classify_glue_sentence_pairs_from_scratch(tmp_path, family):
    cfg = _classify(tmp_path, family, data__dataset="glue:mrpc", train__steps=3)
    Trainer(cfg).run()
    assert "val_accuracy" in rows(cfg.run_dir, "val")[-1]
    tuned = AutoModelForSequenceClassification.from_pretrained(cfg.run_dir / "final")
    assert type(tuned).__name__.endswith("ForSequenceClassification") and tuned.config.pad_token_id is not None


def test_vit_fine_tunes_from_its_checkpoint_with_autofreeze_and_autocache(tmp_path, pretrained):
    cfg = tiny_cfg(tmp_path, family="vit", method="autofreeze", model__init_from=str(pretrained["vit"]),
                   train__steps=12, method__autofreeze__freeze_every=1, method__autofreeze__alpha=0.9,
                   method__autofreeze__criterion="bound", method__autofreeze__cache__enabled=True,
                   data__max_images=32, train__checkpoint_every=1, train__keep_checkpoints=20)
    Trainer(cfg).run()
    last = rows(cfg.run_dir, "train")[-1]
    assert last["frozen"] == 3 and last["cache_hit_rate"] > 0  # 32 images, batch 8: an epoch is 4 steps
    early = _after_first_decision(cfg.run_dir)
    got = ViTForImageClassification.from_pretrained(cfg.run_dir / "final").state_dict()
    key = "vit.embeddings.patch_embeddings.projection.weight"
    assert torch.equal(early[key], got[key])
    assert ViTForImageClassification.from_pretrained(pretrained["vit"]).config.num_hidden_layers == 3


@pytest.mark.slow
def test_init_from_errors_name_the_field_before_data_loads(tmp_path, pretrained):
    with pytest.raises(ConfigError, match="model.init_from: .* has no config.json"):
        Trainer(_classify(tmp_path, "bert", model__init_from=str(tmp_path)))
    with pytest.raises(ConfigError, match="model.init_from: .* is a 'bert' checkpoint, but model.family is 'gpt2'"):
        Trainer(_classify(tmp_path, "gpt2", model__init_from=str(pretrained["bert"])))
    with pytest.raises(ValueError, match="no-such-org/no-such-model.* not in the local Hugging Face cache"):
        Trainer(_classify(tmp_path, "bert", model__init_from="no-such-org/no-such-model"))  # offline: fails at once
    with pytest.raises(ConfigError, match="model.init_from: no such folder .*outputs/never/final"):
        Trainer(_classify(tmp_path, "bert", model__init_from="outputs/never/final"))
    with pytest.raises(ConfigError, match="model.task: one of pretrain, classify"):
        Trainer(_classify(tmp_path, "bert", model__task="regress"))
    with pytest.raises(ValueError, match="data.dataset: unknown GLUE task"):
        Trainer(_classify(tmp_path, "bert", data__dataset="glue:nope")).run()


def test_a_local_checkpoint_loads_without_network_and_without_offline_variables(pretrained, monkeypatch):
    """A local init_from folder never goes through the Hub probe (it failed on machines without network
    unless HF_HUB_OFFLINE was set, which the test session sets)."""
    from progressive.model.build import get_family, load_init_config

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: any probe would fail
    family = get_family("bert").for_task("pretrain")
    config = load_init_config(str(pretrained["bert"]), family)
    model = family.build_model(config, init_from=str(pretrained["bert"]))
    source = BertForMaskedLM.from_pretrained(pretrained["bert"]).state_dict()
    assert all(torch.equal(v, source[k]) for k, v in model.state_dict().items())
