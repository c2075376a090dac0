"""progressive.pipeline without processes: AutoPipe's partition (optimal against brute force, the authors'
greedy rule against their own logged partition), the K-halving memory rule with given sizes, micro-batch
candidates, stage modules that compute exactly the full model's loss and gradients for every family, and
the config checks that refuse a pipeline that cannot work."""

import copy
import itertools
import random
from types import SimpleNamespace

import pytest
import torch

from operators import head_is_tied
from operators.freeze import prefix_output
from progressive.config import ConfigError, diff, load_config, to_dict, validate
from progressive.pipeline.autopipe import (
    LayerProfile,
    balance,
    bounds_of,
    choose_stages,
    greedy_balance,
    microbatch_candidates,
    stage_memory,
)
from progressive.pipeline.checks import check_config, check_world
from progressive.pipeline.mesh import Layout
from progressive.pipeline.stages import StageModule, holding, materialise, parameter_groups, set_hollow


def _largest(costs, sizes):
    b = bounds_of(0, sizes)
    return max(sum(costs[b[i]:b[i + 1]]) for i in range(len(sizes)))


def test_balance_minimises_the_largest_stage_exactly_and_greedy_is_never_better():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 9)
        k = rng.randint(1, n)
        costs = [rng.choice([0.5, 1.0, 2.0, 3.0, 7.0]) for _ in range(n)]
        brute = min(_largest(costs, [b - a for a, b in zip((0,) + cut, cut + (n,))])
                    for cut in itertools.combinations(range(1, n), k - 1))
        sizes, greedy = balance(costs, k), greedy_balance(costs, k)
        assert len(sizes) == len(greedy) == k and sum(sizes) == sum(greedy) == n and min(sizes + greedy) >= 1
        assert _largest(costs, sizes) == pytest.approx(brute)
        assert _largest(costs, greedy) >= brute - 1e-9
    assert balance([1.0] * 12, 8) == [2, 2, 2, 2, 1, 1, 1, 1]  # ties: the earliest stages take the most
    with pytest.raises(ValueError, match="cannot split 3 units into 4"):
        balance([1.0] * 3, 4)


def test_greedy_rule_reproduces_the_authors_logged_vit_b_partition_and_optimal_balance_beats_it():
    """PipeTransformer issue #3 logged this K=8 partition of ViT-B/16 (CIFAR-100 head) into embeddings, 24
    attention/MLP sub-layers, final norm and head: {4,2,3,3,3,3,4,5} sub-layers, {10.19, 7.09, 11.81, 9.45,
    11.81, 9.45, 14.18, 11.89} M parameters (docs/papers.md, PipeTransformer)."""
    emb, attn, mlp, norm, head = 742_656, 2_363_904, 4_723_968, 1_536, 768 * 100 + 100
    units = [emb] + [attn, mlp] * 12 + [norm, head]
    sizes = greedy_balance([u / 1e6 for u in units], 8)
    assert sizes == [4, 2, 3, 3, 3, 3, 4, 5]
    b = bounds_of(0, sizes)
    assert [round(sum(units[b[i]:b[i + 1]]) / 1e6, 2) for i in range(8)] == [10.19, 7.09, 11.81, 9.45, 11.81,
                                                                            9.45, 14.18, 11.89]
    assert _largest(units, balance(units, 8)) / 1e6 == pytest.approx(11.89, abs=0.01)  # 16% below greedy's 14.18


def _profile(layers=4, params=100, act=0.0, head_act=0.0):
    return LayerProfile(layer_ms=[1.0] * layers, embed_ms=0.0, head_ms=0.0, layer_params=[params] * layers,
                        embed_params=0, head_params=0, layer_act=[act] * layers, head_act=head_act, samples=1)


def test_k_halves_only_when_the_halved_pipelines_largest_stage_fits_the_starting_memory():
    p = _profile()  # weights only: 16 B per trainable parameter, 4 per frozen one held by stage 0
    budget = max(stage_memory(p, 0, (0, 1, 2, 3, 4), local_batch=4))
    assert budget == 16 * 100
    k, why = choose_stages(p, 1, 4, world=4, batch=4, budget=budget, kind="uniform")
    assert k == 2 and why[0] == "K 4 -> 2: only 3 active layers for 4 stages"  # one layer per stage at least
    assert why[1].startswith("K stays 2: K 1 would need")  # 3 layers x 1600 B + 400 B frozen > 1600 B
    assert stage_memory(p, 1, (1, 3, 4), local_batch=2) == [2 * 1600 + 400, 1600]
    assert choose_stages(p, 3, 2, world=4, batch=4, budget=budget, kind="uniform")[0] == 1
    # activations dominate: a halved pipeline has twice the layers per stage but half the local batch
    act = _profile(params=1, act=1000.0)
    budget = max(stage_memory(act, 0, (0, 1, 2, 3, 4), local_batch=4))
    k, why = choose_stages(act, 2, 4, world=4, batch=4, budget=budget, kind="uniform")
    assert k == 1 and why[-1].startswith("K 2 -> 1: its largest stage needs")


def test_microbatch_candidates_are_multiples_of_k_that_divide_the_local_batch():
    assert microbatch_candidates(4, 8) == [4, 8]
    assert microbatch_candidates(2, 4) == [2, 4]
    assert microbatch_candidates(1, 2) == [1, 2]
    assert microbatch_candidates(4, 2) == [2]  # fewer samples than stages: the largest divisor below K
    assert microbatch_candidates(3, 8) == [2]


def test_layout_coordinates_are_row_major_over_dp_then_pp():
    lay = Layout(frozen=2, bounds=(2, 3, 4), dp=2, microbatches=4)
    assert lay.k == 2 and lay.world == 4 and lay.sizes() == [1, 1]
    assert [lay.coords(r) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert Layout.from_dict(lay.as_dict()) == lay


CLASSES = ["GPT2LMHeadModel", "GPT2ForSequenceClassification", "BertForMaskedLM", "BertForSequenceClassification",
           "ViTForImageClassification", "DeiTForImageClassification", "LlamaForCausalLM", "Qwen2ForCausalLM"]


@pytest.mark.parametrize("name", CLASSES)
def test_stages_compute_the_full_models_loss_and_gradients_bit_for_bit(name):
    """Chained in one process (activations passed as a pipeline would send them), the stages of several
    partitions, with and without a frozen prefix, give exactly the HF model's loss and gradients."""
    from tests.unit.model.test_flops import FAMILIES, _inputs

    torch.manual_seed(0)
    model = FAMILIES[name]()
    model.config.tie_word_embeddings = False  # a pipeline refuses a tied head (first and last stage at once)
    model = type(model)(model.config).eval()  # eval: no dropout, so the two runs draw nothing
    assert not head_is_tied(model)
    inputs = _inputs(model)
    n = len(next(iter(inputs.values())))
    labels = inputs["input_ids"] if "input_ids" in inputs and "Classification" not in name else \
        torch.randint(0, model.config.num_labels, (n,))
    batch = {**inputs, "labels": labels}
    ref = copy.deepcopy(model)
    ref(**batch).loss.backward()
    grads = {k: p.grad for k, p in ref.named_parameters()}
    groups = parameter_groups(model)
    L = len(groups[1])
    for frozen, bounds in [(0, (0, 1, L)), (1, (1, 2, L)), (0, (0, L)), (L, (L, L))]:
        stages = []
        for s in range(len(bounds) - 1):
            m = copy.deepcopy(model)
            h = holding(groups, frozen, bounds, s)
            materialise(m, {}, h.keep, h.train, torch.device("cpu"))
            set_hollow(m, not h.first)
            assert {k for k, p in m.named_parameters() if p.device.type != "meta"} == h.keep
            stages.append(StageModule(m, h))
        x = prefix_output(stages[0].model, batch, stop=frozen) if frozen else None
        ins, outs = [], []
        for st in stages:
            ins.append(x)
            outs.append(st(*(() if x is None else (x,)), **batch))
            x = None if st.last else outs[-1].detach().requires_grad_(True)
        outs[-1].backward()
        for i in range(len(stages) - 2, -1, -1):
            outs[i].backward(ins[i + 1].grad)
        assert torch.equal(outs[-1], ref(**batch).loss.detach()), (frozen, bounds)
        for st in stages:
            for k, p in st.model.named_parameters():
                if p.requires_grad and grads[k] is not None:
                    assert torch.equal(p.grad, grads[k]), (frozen, bounds, k)


def _cfg(**over):
    base = {"model.family": "gpt2", "model.num_layers": 4, "model.tie_word_embeddings": False,
            "data.tokenizer": "bpe", "data.vocab_size": 384, "method.name": "autofreeze",
            "parallel.pipeline": "elastic", "parallel.stages": 4, "train.batch_size": 8}
    return load_config(None, {**base, **over})


def _check(cfg):
    from progressive.model.build import get_family, guess_data_info

    validate(cfg)
    family = get_family(cfg.model.family)
    check_config(cfg, family, family.config_for(cfg.model, guess_data_info(cfg), cfg.data.seq_len))


@pytest.mark.parametrize("over, field", [
    ({"parallel.pipeline": "pipedream"}, r"parallel\.pipeline: one of none, fixed, elastic"),
    ({"parallel.microbatches": 0}, r"parallel\.microbatches: 'auto' or a number >= 1"),
    ({"parallel.schedule": "zb"}, r"parallel\.schedule: one of gpipe, 1f1b"),
    ({"parallel.balance": "flops"}, r"parallel\.balance: one of time, params, uniform"),
    ({"method.name": "vcycle"}, r"method\.name: 'vcycle' changes the model's shape"),
    ({"method.name": "baseline"}, r"parallel\.pipeline: elastic shortens the pipeline as AutoFreeze"),
    ({"parallel.stages": 3}, r"parallel\.stages: an elastic pipeline halves K .* power of two, got 3"),
    ({"parallel.stages": 8}, r"parallel\.stages: 8 stages > the model's 4 layers"),
    ({"train.grad_accum": 2}, r"train\.grad_accum: the pipeline splits each batch"),
    ({"train.mixed_precision": "fp16"}, r"train\.mixed_precision: fp16 needs a gradient scaler"),
    ({"train.compile": True}, r"train\.compile: the pipeline engine runs its stages uncompiled"),
    ({"model.tie_word_embeddings": True}, r"model\.tie_word_embeddings: the input embedding .* untied"),
])
def test_a_pipeline_that_cannot_work_is_refused_naming_the_field(over, field):
    with pytest.raises(ConfigError, match=field):
        _check(_cfg(**over))


def test_world_size_batch_and_microbatches_are_checked_against_every_reachable_layout():
    _check(_cfg())
    check_world(_cfg(), 4)
    with pytest.raises(ConfigError, match=r"parallel\.stages: 4 stages do not divide the 6 processes"):
        check_world(_cfg(), 6)
    with pytest.raises(ConfigError, match=r"train\.batch_size: 6 does not split over 4 data-parallel replicas"):
        check_world(_cfg(**{"train.batch_size": 6}), 4)  # elastic reaches dp = world = 4
    check_world(_cfg(**{"train.batch_size": 6, "parallel.pipeline": "fixed", "parallel.stages": 2}), 4)
    with pytest.raises(ConfigError, match=r"parallel\.microbatches: 3 micro-batches do not split the local batch 8"):
        check_world(_cfg(**{"parallel.microbatches": 3}), 4)


def test_runs_saved_before_the_parallel_section_existed_still_resume():
    saved = to_dict(load_config(None, {}))
    del saved["parallel"]
    assert diff(saved, to_dict(load_config(None, {}))) == []
    assert diff(saved, to_dict(load_config(None, {"parallel.pipeline": "fixed"}))) == [
        "parallel.pipeline: '<absent>' -> 'fixed'"]


def test_a_training_step_receives_into_buffers_that_require_gradients():
    """torch 2.11 keeps the receive buffers of a fresh schedule's first call: after an evaluation they do not
    require gradients and the backward sends none (the elastic recipe failed so). The step sets the flag first;
    integer buffers (token ids) and what is not a buffer are left alone."""

    from progressive.pipeline.runtime import _receive_gradients

    hidden, ids = torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)
    root = SimpleNamespace(meta=torch.zeros(2))  # a first stage's placeholder: no buffer
    stage = SimpleNamespace(args_recv_info={0: (SimpleNamespace(buffer=hidden), SimpleNamespace(buffer=ids)),
                                            1: (root,)})
    _receive_gradients(stage)
    assert hidden.requires_grad and not ids.requires_grad
    _receive_gradients(SimpleNamespace())  # a stage before its first call has none
