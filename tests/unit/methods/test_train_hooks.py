"""The method hooks carry other methods without trainer changes: a toy method that runs a layer subset on
some steps (Apollo-style FLOPs accounting) and freezes a prefix at an epoch end (AutoFreeze-style)."""

import torch
from transformers import GPT2LMHeadModel

from operators import named_optimizer_state
from progressive.methods import Method, ModelChange, StepPlan
from progressive.model.build import get_family, step_flops
from progressive.run.trainer import Trainer
from tests.train_utils import rows, tiny_cfg


class ToyShallowThenFreeze(Method):
    """Odd steps run only layer 0; at the first epoch end, freeze the position embedding and layer 0."""

    name = "toy"

    def __init__(self, cfg, family):
        super().__init__(cfg, family)
        self.epochs, self.snapshot, self._full = [], None, None

    def before_step(self, step, model):
        if step % 2 == 1:
            self._full = model.transformer.h
            model.transformer.h = torch.nn.ModuleList(list(self._full)[:1])
            return StepPlan(n_layers=1)
        return StepPlan()

    def after_step(self, step, model):
        if self._full is not None:
            model.transformer.h, self._full = self._full, None

    def on_epoch_end(self, epoch, model, optimizer):
        self.epochs.append(epoch)
        if len(self.epochs) > 1:
            return None
        for p in list(model.transformer.h[0].parameters()) + list(model.transformer.wpe.parameters()):
            p.requires_grad_(False)
        self.snapshot = {n: t.clone() for n, t in model.state_dict().items() if n.startswith("transformer.h.0.")}
        return ModelChange(model, named_optimizer_state(model, optimizer), "froze wpe + layer 0")


def test_layer_subset_and_epoch_end_freezing_plug_in_through_hooks(tmp_path, registered_method):
    registered_method("toy", ToyShallowThenFreeze)
    # ~90 training blocks of 32 tokens, batch 8: an epoch ends after 11 steps
    cfg = tiny_cfg(tmp_path, method="toy", data__max_tokens=3000, train__steps=16, train__eval_every=100)
    tr = Trainer(cfg)
    tr.run()
    assert tr.method.epochs == [0]
    train = rows(cfg.run_dir, "train")
    fam = get_family("gpt2")
    config = GPT2LMHeadModel.from_pretrained(cfg.run_dir / "final").config
    deltas = [b["flops"] - a["flops"] for a, b in zip([{"flops": 0}] + train, train)]
    assert deltas[0] == step_flops(cfg, fam, config) and deltas[1] == step_flops(cfg, fam, config, n_layers=1)
    assert deltas[1] < deltas[0]
    final = GPT2LMHeadModel.from_pretrained(cfg.run_dir / "final").state_dict()
    assert tr.method.snapshot and all(torch.equal(final[n], t) for n, t in tr.method.snapshot.items())
    assert not torch.equal(final["transformer.h.1.attn.c_attn.weight"],
                           tr.method.snapshot["transformer.h.0.attn.c_attn.weight"])
    trainable = {id(p) for g in tr.opt.optimizer.param_groups for p in g["params"]}
    assert id(tr.raw.transformer.h[0].attn.c_attn.weight) not in trainable


class ToyRepeat(Method):
    """Micro-batch 0 runs layers [0, 0, 1] (a shared layer repeated: 3 applications of 2 distinct layers),
    micro-batch 1 the plain model; reports a field for the log."""

    name = "toy_repeat"

    def __init__(self, cfg, family):
        super().__init__(cfg, family)
        self._full = None

    def before_micro_batch(self, step, index, model):
        if index == 0:
            self._full = model.transformer.h
            model.transformer.h = torch.nn.ModuleList([self._full[0], self._full[0], self._full[1]])
            return 3
        model.transformer.h = self._full
        return None

    def after_step(self, step, model):
        model.transformer.h, self._full = self._full, None

    def log_fields(self):
        return {"depth0": 3}


def test_micro_batch_hook_counts_repeated_layer_applications_exactly_and_log_fields_reach_the_rows(
        tmp_path, registered_method):
    registered_method("toy_repeat", ToyRepeat)
    cfg = tiny_cfg(tmp_path, method="toy_repeat", train__steps=3, train__grad_accum=2, train__eval_every=100)
    tr = Trainer(cfg)
    tr.run()
    train = rows(cfg.run_dir, "train")
    config = GPT2LMHeadModel.from_pretrained(cfg.run_dir / "final").config
    fam = get_family("gpt2")
    base, one = step_flops(cfg, fam, config, n_layers=0), step_flops(cfg, fam, config, n_layers=1)
    full = step_flops(cfg, fam, config)
    assert full == base + 2 * one - 2 * base  # linear in layers: the premise of the count
    deltas = [b["flops"] - a["flops"] for a, b in zip([{"flops": 0}] + train, train)]
    assert deltas == [((base + 3 * (one - base)) + full) // 2] * 3
    assert all(r["depth0"] == 3 for r in train)
    assert len(tr.raw.transformer.h) == 2  # the model is plain again after every step
