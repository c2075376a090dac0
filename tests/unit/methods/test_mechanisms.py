"""Each method's mechanism, pinned where the method applies it (not only in the operator it calls): switching
the mechanism off in the method's code makes one of these fail.

- Apollo's depth sharing: the step's sampled depth really runs, along the map, on the layers it names.
- Apollo's optimizer state across growth: mapped (every copy), first_copy (the lowest copy only), authors
  (moments stay with the layer index), reset.
- AutoFreeze's gradient criterion: a freeze the bound alone would not make.
- The V-cycle's interpolation: the weights after going up are (1 - alpha) kept + alpha de-coalesced.
"""

import numpy as np
import pytest
import torch

from operators import depth_map, named_optimizer_state
from progressive.methods import get_method
from progressive.model.build import get_family, guess_data_info, step_flops
from tests.train_utils import tiny_cfg


def _method(cfg):
    fam = get_family(cfg.model.family)
    base = fam.config_for(cfg.model, guess_data_info(cfg), cfg.data.seq_len)
    method = get_method(cfg, fam)
    phases = method.plan(base, lambda c: step_flops(cfg, fam, c))
    return method, phases, fam


def _apollo(tmp_path, **over):
    base = dict(model__num_layers=4, train__steps=40, method__apollo__layers=[1, 2, 4],
                method__apollo__boundaries=[0.1, 0.25])
    return tiny_cfg(tmp_path, method="apollo", **{**base, **over})


def _layer_list(model):
    return model.transformer.h


def test_apollo_runs_the_sampled_depth_on_the_layers_the_map_names(tmp_path):
    method, phases, fam = _method(_apollo(tmp_path))
    stage = phases[1]  # 2 distinct layers, sampled depths 2..4
    model = fam.build_model(stage.config)
    plain = list(_layer_list(model))
    n = len(plain)
    start = phases[0].steps
    step = next(s for s in range(start, start + stage.steps) if int(method.depths(s, 0, n)[0, 0]) != n)
    method.phase = 1  # the trainer's, before every step
    depth = method.before_micro_batch(step, 0, model)
    assert depth != n
    ran = list(_layer_list(model))
    assert len(ran) == depth and model.config.n_layer == depth
    assert all(a is plain[i] for a, i in zip(ran, depth_map(n, depth, method.ap.map)))  # the same modules, shared
    ids = torch.randint(0, 100, (2, 8))
    with torch.no_grad():
        shared = model(input_ids=ids).logits
    method.after_step(step, model)
    assert list(_layer_list(model)) == plain and model.config.n_layer == n  # the plain model again
    with torch.no_grad():
        assert not torch.allclose(model(input_ids=ids).logits, shared)  # the depth changed what was computed


@pytest.mark.parametrize("setting", ["mapped", "first_copy", "reset"])
def test_apollo_hands_the_grown_model_the_optimizer_state_its_setting_names(tmp_path, setting):
    method, phases, fam = _method(_apollo(tmp_path, method__apollo__optimizer_state=setting,
                                          method__apollo__map="stack"))
    small = fam.build_model(phases[1].config)  # 2 layers, growing to 4 (stack: layer j <- j mod 2)
    opt = torch.optim.AdamW(small.parameters(), lr=1e-3)
    small(input_ids=torch.randint(0, 100, (2, 8)), labels=torch.randint(0, 100, (2, 8))).loss.backward()
    opt.step()
    before = named_optimizer_state(small, opt)
    change = method.transition(2, phases, small, opt)
    if setting == "reset":
        assert change.optimizer_state is None
        return
    state = change.optimizer_state
    key = "transformer.h.{}.mlp.c_fc.weight"
    assert torch.equal(state[key.format(0)]["exp_avg"], before[key.format(0)]["exp_avg"])  # the first copy
    assert torch.equal(state[key.format(1)]["exp_avg_sq"], before[key.format(1)]["exp_avg_sq"])
    if setting == "mapped":  # the second copies (layers 2, 3 <- 0, 1) inherit the same moments
        assert torch.equal(state[key.format(2)]["exp_avg"], before[key.format(0)]["exp_avg"])
        assert torch.equal(state[key.format(3)]["exp_avg_sq"], before[key.format(1)]["exp_avg_sq"])
    else:  # first_copy: the second copies start fresh
        assert key.format(2) not in state and key.format(3) not in state
    assert "transformer.wte.weight" in state  # outside the layers every parameter keeps its moments


def test_apollo_authors_rule_keeps_moments_with_the_layer_index_not_the_weights(tmp_path):
    method, phases, fam = _method(_apollo(tmp_path, method__apollo__optimizer_state="authors"))
    small = fam.build_model(phases[1].config)  # 2 layers -> 4, interpolation map: layer j <- j // 2
    opt = torch.optim.AdamW(small.parameters(), lr=1e-3)
    small(input_ids=torch.randint(0, 100, (2, 8)), labels=torch.randint(0, 100, (2, 8))).loss.backward()
    opt.step()
    before = named_optimizer_state(small, opt)
    change = method.transition(2, phases, small, opt)
    key = "transformer.h.{}.mlp.c_fc.weight"
    weights = dict(change.model.named_parameters())
    assert torch.equal(weights[key.format(1)], dict(small.named_parameters())[key.format(0)])  # layer 1 <- 0
    state = change.optimizer_state
    assert torch.equal(state[key.format(1)]["exp_avg"], before[key.format(1)]["exp_avg"])  # but keeps its own
    assert not torch.equal(state[key.format(1)]["exp_avg"], before[key.format(0)]["exp_avg"])
    assert key.format(2) not in state and key.format(3) not in state  # new positions start at step 0


def test_autofreeze_gradient_criterion_decides_a_freeze_the_bound_alone_would_not(tmp_path):
    cfg = tiny_cfg(tmp_path, method="autofreeze", model__num_layers=8, train__steps=20,
                   method__autofreeze__freeze_every=5, method__autofreeze__criterion="argmin",
                   method__autofreeze__alpha=0.5)
    method, _, _ = _method(cfg)
    # layer 1 moved least: the criterion says freeze layers 0..1 (C = 2) where the bound allows 4
    norms = np.array([5.0, 0.1, 4.0, 3.0, 6.0, 7.0, 8.0, 9.0])
    for _ in range(5):
        method.record(norms)
    old, new, b, c = method.decide(4)
    assert (old, b, c) == (0, 4, 2) and new == 2 and method.frozen == 2
    logged = method.log_fields()  # every metrics row says which of the two bound the latest decision
    assert (logged["freeze_bound"], logged["freeze_criterion"], logged["freeze_decisions"]) == (4, 2, 1)
    again, _, _ = _method(cfg)
    again.load_state_dict(method.state_dict())  # and a resumed run logs the same
    assert again.log_fields() == logged
    # with the criterion "bound" the same statistics freeze what the bound allows
    cfg_b = tiny_cfg(tmp_path, method="autofreeze", model__num_layers=8, train__steps=20,
                     method__autofreeze__freeze_every=5, method__autofreeze__criterion="bound",
                     method__autofreeze__alpha=0.5)
    plain, _, _ = _method(cfg_b)
    for _ in range(5):
        plain.record(norms)
    assert plain.decide(4)[1] == 4


@pytest.mark.parametrize("alpha", [0.25, 0.75])
def test_vcycle_interpolation_moves_the_weights_as_alpha_says(tmp_path, alpha):
    from operators import coalesce, decoalesce

    levels = [{"alpha": alpha, "down": {"fraction": 0.2}, "up": {}},
              {"width": 2, "depth": 2, "down": {"fraction": 0.4}}]
    method, phases, fam = _method(tiny_cfg(tmp_path, method="vcycle", method__vcycle__levels=levels,
                                           method__vcycle__optimizer_state="reset"))
    torch.manual_seed(0)
    big = fam.build_model(phases[0].config)
    opt = torch.optim.AdamW(big.parameters())
    small = method.transition(1, phases, big, opt).model  # down: keeps the big weights, coalesces
    kept = {k: v.clone() for k, v in big.state_dict().items()}
    with torch.no_grad():
        for p in small.parameters():
            p.add_(0.01 * torch.randn_like(p))  # the coarse level trained
    lv = method.vc.levels[1]
    seed = (method.cfg.train.seed if method.vc.split_seed is None else method.vc.split_seed) + 0
    large = decoalesce(small, lv.width, lv.depth, lv.pairing, lv.depth_pairing, method.vc.depth_mode,
                       method.vc.width_split, method.vc.split_noise, seed)
    up = method.transition(2, phases, small, torch.optim.AdamW(small.parameters())).model.state_dict()
    de = large.state_dict()
    for k in ("transformer.h.0.mlp.c_fc.weight", "transformer.wte.weight"):
        expected = (1 - alpha) * kept[k] + alpha * de[k]
        assert torch.allclose(up[k], expected, atol=1e-6), k
    assert coalesce  # imported with decoalesce: the operator pair the method composes
