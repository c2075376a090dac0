"""AutoFreeze and AutoCache (PipeTransformer, ICML 2021): the schedule and criteria, freezing in training
(optimizer, FLOPs, a tied head), the cache (same losses, fewer FLOPs), bad input."""

import numpy as np
import pytest
import torch
from transformers import GPT2LMHeadModel

from progressive.config import ConfigError, validate
from progressive.methods.autofreeze.method import bound, criterion
from progressive.run.trainer import Trainer
from tests.train_utils import rows, tiny_cfg


@pytest.mark.parametrize("alpha, expected", [
    (1 / 3, [4, 7, 9, 10, 11, 11, 12, 12, 12]),  # the authors' code's schedule for L = 12 (their table)
    (1 / 2, [6, 9, 11, 12, 12]),
    (1 / 5, [3, 5, 6, 8, 9, 9, 10, 10, 11]),
])
def test_the_bound_is_the_papers_closed_form_as_the_authors_code_rounds_it(alpha, expected):
    assert [bound(12, alpha, t) for t in range(1, len(expected) + 1)] == expected


def test_gradient_criteria():
    norms = np.array([0.0, 0.0, 5.0, 1.0, 3.0, 2.0])  # layers 0, 1 frozen already: ignored
    assert criterion("argmin", norms, None, frozen=2) == 4  # layer 3 moved least: freeze through it
    assert criterion("bound", norms, None, frozen=2) == 6
    assert criterion("relative", norms, None, frozen=2) == 2  # no reference yet: nothing more
    prev = np.array([0.0, 0.0, 5.1, 1.02, 6.0, 4.0])  # relative changes 0.02, 0.02, 0.5, 0.5; median 0.26
    assert criterion("relative", norms, prev, frozen=2) == 4


def _cfg(tmp_path, name, **over):
    base = dict(method="autofreeze", model__num_layers=4, train__steps=24, train__eval_every=12,
                data__max_tokens=3000, method__autofreeze__freeze_every=3, method__autofreeze__criterion="bound",
                method__autofreeze__alpha=0.5)
    return tiny_cfg(tmp_path / name, **{**base, **over})


def test_freezing_grows_a_prefix_its_weights_stay_put_and_the_flops_count_what_ran(tmp_path):
    cfg = _cfg(tmp_path, "run", train__checkpoint_every=100)
    tr = Trainer(cfg)
    summary = tr.run()
    train = rows(cfg.run_dir, "train")
    frozen = [r["frozen"] for r in train]
    assert frozen[:3] == [0, 0, 0] and frozen[3] == 2 and frozen[-1] == 4 and frozen == sorted(frozen)
    flops = np.diff([0] + [r["flops"] for r in train])
    assert flops[0] > flops[3] > flops[-1]  # a frozen layer costs a forward only
    trainable = {id(p) for g in tr.opt.optimizer.param_groups for p in g["params"]}
    assert id(tr.raw.transformer.h[3].mlp.c_fc.weight) not in trainable  # frozen: left the optimizer
    assert id(tr.raw.lm_head.weight) in trainable  # the tied head still trains
    final = GPT2LMHeadModel.from_pretrained(cfg.run_dir / "final")
    assert final.config.n_layer == 4 and [t["note"][:11] for t in summary["transitions"]] == ["froze layer"] * 3


def test_a_tied_head_keeps_training_after_every_layer_froze(tmp_path):
    from progressive.run.checkpoint import list_checkpoints, load_checkpoint

    cfg = _cfg(tmp_path, "tied", train__steps=8, method__autofreeze__freeze_every=1, method__autofreeze__alpha=0.9,
               train__checkpoint_every=1, train__keep_checkpoints=20)
    Trainer(cfg).run()
    assert [r["frozen"] for r in rows(cfg.run_dir, "train")][:3] == [0, 4, 4]
    _, early = load_checkpoint(list_checkpoints(cfg.run_dir)[1])  # step 2: everything frozen since step 1
    final = GPT2LMHeadModel.from_pretrained(cfg.run_dir / "final").state_dict()
    w = early["model"]
    assert torch.equal(w["transformer.wpe.weight"], final["transformer.wpe.weight"])
    assert torch.equal(w["transformer.h.0.attn.c_attn.weight"], final["transformer.h.0.attn.c_attn.weight"])
    assert not torch.equal(w["transformer.wte.weight"], final["transformer.wte.weight"])  # = the head: it trains
    assert not torch.equal(w["transformer.ln_f.weight"], final["transformer.ln_f.weight"])


def test_autocache_gives_the_same_losses_with_fewer_flops(tmp_path):
    runs = {}
    for name, cache in (("plain", False), ("cached", True)):
        cfg = _cfg(tmp_path, name, train__steps=30, model__tie_word_embeddings=False,
                   method__autofreeze__cache__enabled=cache, method__autofreeze__cache__memory_mb=0.05,
                   method__autofreeze__cache__disk_mb=1.0)
        Trainer(cfg).run()
        runs[name] = rows(cfg.run_dir, "train")
        assert not (cfg.run_dir / "autocache").exists()  # the disk tier is removed at the end
    a, b = runs["plain"], runs["cached"]
    assert np.allclose([r["loss"] for r in a], [r["loss"] for r in b], rtol=0, atol=1e-5)
    assert b[-1]["cache_hit_rate"] > 0.3 and b[-1]["cache_disk_mb"] > 0  # the memory tier overflowed to disk
    assert b[-1]["flops"] < a[-1]["flops"]


@pytest.mark.parametrize("over, field", [
    ({"method__autofreeze__alpha": 0.0}, "method.autofreeze.alpha"),
    ({"method__autofreeze__alpha": 1.0}, "method.autofreeze.alpha"),
    ({"method__autofreeze__freeze_every": 0}, "method.autofreeze.freeze_every"),
    ({"method__autofreeze__criterion": "norm"}, "method.autofreeze.criterion"),
    ({"method__autofreeze__cache__memory_mb": -1}, "method.autofreeze.cache.memory_mb"),
    ({"method__autofreeze__cache__disk_mb": -1}, "method.autofreeze.cache.disk_mb"),
])
def test_bad_settings_are_refused_naming_the_field(tmp_path, over, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        validate(_cfg(tmp_path, "bad", **over))


@pytest.mark.parametrize("over, match", [
    ({"method__autofreeze__cache__enabled": True}, "tied to the output head"),  # GPT-2 ties by default
    ({"model__family": "bert", "data__tokenizer": "wordpiece", "method__autofreeze__cache__enabled": True,
      "model__tie_word_embeddings": False}, "re-masked"),
    ({"method__autofreeze__max_frozen": 9}, "max_frozen: 9 > the model's 4 layers"),
])
def test_a_cache_that_would_be_wrong_is_refused_before_data_loads(tmp_path, over, match):
    with pytest.raises(ConfigError, match=match):
        Trainer(_cfg(tmp_path, "refused", data__dataset=str(tmp_path / "absent.txt"), **over))


def test_gradient_statistics_survive_in_the_checkpointed_state(tmp_path):
    cfg = _cfg(tmp_path, "state", train__steps=4, method__autofreeze__criterion="relative",
               method__autofreeze__freeze_every=2)
    tr = Trainer(cfg)
    tr.run()
    state = tr.method.state_dict()
    assert state["decisions"] == 2 and torch.is_tensor(state["previous"]) and state["previous"].shape == (4,)
