"""Clear errors, raised before any output is written; and the CLI on checkpoint folders."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from tiny_models import Shape, main_output, make_inputs, make_model
from transformers import (
    BertForMaskedLM,
    GPT2LMHeadModel,
    LlamaForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)

import operators as ops
from operators.cli import main as cli


def test_width_factor_not_dividing_heads_names_the_field():
    m = make_model(Shape(GPT2LMHeadModel, heads=2, head_dim=6, layers=2, ffn_mult=2))
    with pytest.raises(ops.OperatorError, match=r"width factor 3 does not divide GPT2Config\.n_head=2"):
        ops.coalesce(m, width=3)


def test_width_factor_not_dividing_kv_heads_names_the_field():
    m = make_model(Shape(LlamaForCausalLM, heads=4, head_dim=4, layers=2, ffn_mult=2, kv_heads=1))
    with pytest.raises(ops.OperatorError, match=r"num_key_value_heads=1"):
        ops.coalesce(m, width=2)


def test_depth_factor_not_dividing_layers_names_the_field():
    m = make_model(Shape(BertForMaskedLM, heads=2, head_dim=4, layers=3, ffn_mult=2))
    with pytest.raises(ops.OperatorError, match=r"depth factor 2 does not divide BertConfig\.num_hidden_layers=3"):
        ops.coalesce(m, width=1, depth=2)


def test_ffn_and_hidden_checked_on_config_alone():
    cfg = make_model(Shape(GPT2LMHeadModel, heads=2, head_dim=4, layers=2, ffn_mult=2)).config
    cfg.n_inner = 15
    with pytest.raises(ops.OperatorError, match="n_inner=15"):
        ops.validate_resize(cfg, width=2)
    small = ops.resized_config(cfg.__class__(n_embd=16, n_head=2, n_layer=4), width=2, depth=2)
    assert (small.n_embd, small.n_head, small.n_layer) == (8, 1, 2)


def test_unsupported_class_lists_supported_families():
    t5 = T5ForConditionalGeneration(T5Config(d_model=16, d_ff=32, num_layers=1, num_heads=2, vocab_size=32))
    with pytest.raises(ops.OperatorError,
                       match=r"unsupported model class T5ForConditionalGeneration.*gpt2:.*bert:.*vit:.*llama:"):
        ops.coalesce(t5)


@pytest.mark.parametrize("alpha", [-0.1, 1.5, float("nan")])
def test_alpha_outside_unit_interval_is_rejected(alpha):
    m = make_model(Shape(GPT2LMHeadModel, heads=2, head_dim=4, layers=2, ffn_mult=2))
    with pytest.raises(ops.OperatorError, match="alpha must be in"):
        ops.interpolate(m, m, alpha)


def test_interpolate_mismatched_shapes_names_the_parameter():
    a = make_model(Shape(GPT2LMHeadModel, heads=2, head_dim=4, layers=2, ffn_mult=2))
    b = ops.decoalesce(a, width=2)
    with pytest.raises(ops.OperatorError, match=r"shape mismatch for 'transformer\.wte\.weight'"):
        ops.interpolate(a, b, 0.5)


def test_identity_depth_rejected_for_post_ln_bert():
    m = make_model(Shape(BertForMaskedLM, heads=2, head_dim=4, layers=2, ffn_mult=2))
    with pytest.raises(ops.OperatorError, match="post-LN"):
        ops.decoalesce(m, width=2, depth=2, depth_mode="identity")


@pytest.mark.parametrize("kwargs,match", [({"width": 0}, "width factor"), ({"pairing": "random"}, "pairing"),
                                          ({"depth_mode": "stack"}, "depth_mode")])
def test_bad_arguments_are_rejected(kwargs, match):
    m = make_model(Shape(GPT2LMHeadModel, heads=2, head_dim=4, layers=2, ffn_mult=2))
    with pytest.raises(ops.OperatorError, match=match):
        ops.decoalesce(m, **kwargs)


# ---- CLI --------------------------------------------------------------------------------------------
@pytest.fixture
def ckpt(tmp_path):
    m = make_model(Shape(LlamaForCausalLM, heads=4, head_dim=4, layers=2, ffn_mult=2, kv_heads=2))
    m.save_pretrained(tmp_path / "base")
    (tmp_path / "base" / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    return m, tmp_path


def test_cli_decoalesce_writes_checkpoint_with_tokenizer_files(ckpt):
    m, tmp = ckpt
    assert cli(["decoalesce", str(tmp / "base"), str(tmp / "big"), "--width", "2", "--depth", "2",
                "--depth-mode", "identity"]) == 0
    assert (tmp / "big" / "tokenizer_config.json").is_file()
    big = LlamaForCausalLM.from_pretrained(tmp / "big").eval()
    assert big.config.hidden_size == 32 and big.config.num_hidden_layers == 4
    x = make_inputs(m)
    with torch.no_grad():
        ref, out = main_output(m, x), main_output(big, x)
    assert ((out - ref).abs().max() / ref.abs().max()).item() <= 1e-5


def test_cli_coalesce_then_interpolate_with_decoalesce(ckpt):
    m, tmp = ckpt
    assert cli(["coalesce", str(tmp / "base"), str(tmp / "small"), "--width", "2"]) == 0
    assert cli(["interpolate", str(tmp / "base"), str(tmp / "small"), str(tmp / "mix"),
                "--alpha", "0", "--width", "2"]) == 0
    mix = LlamaForCausalLM.from_pretrained(tmp / "mix")
    for name, t in m.state_dict().items():
        assert torch.equal(mix.state_dict()[name], t), name


@pytest.mark.parametrize("argv_tail,match", [
    (["coalesce", "{tmp}/missing", "{tmp}/out"], "checkpoint folder not found"),
    (["coalesce", "{tmp}/base", "{tmp}/out", "--width", "3"], "does not divide"),
    (["interpolate", "{tmp}/base", "{tmp}/base", "{tmp}/out", "--alpha", "2"], "alpha must be in"),
    (["interpolate", "{tmp}/base", "{tmp}/nowts", "{tmp}/out", "--alpha", "0.5"], "no weights in"),
])
def test_cli_errors_write_nothing(ckpt, capsys, argv_tail, match):
    _, tmp = ckpt
    (tmp / "nowts").mkdir()
    (tmp / "nowts" / "config.json").write_text((tmp / "base" / "config.json").read_text())
    assert cli([a.format(tmp=tmp) for a in argv_tail]) == 2
    assert match in capsys.readouterr().err
    assert not (tmp / "out").exists()
    assert not [p for p in tmp.iterdir() if p.name.startswith(".out")]


def test_cli_replaces_only_its_own_output_and_only_with_the_flag(ckpt, capsys):
    _, tmp = ckpt
    (tmp / "out").mkdir()  # an empty folder loses nothing: it is used
    assert cli(["coalesce", str(tmp / "base"), str(tmp / "out")]) == 0
    assert cli(["coalesce", str(tmp / "base"), str(tmp / "out")]) == 2
    assert "already exists (written by python -m operators): pass --overwrite" in capsys.readouterr().err
    assert cli(["coalesce", str(tmp / "base"), str(tmp / "out"), "--overwrite"]) == 0
    assert (tmp / "out" / "config.json").is_file() and (tmp / "out" / ".growtrain-output").is_file()


@pytest.mark.parametrize("out, needle", [
    ("mine", "was not created by python -m operators (no .growtrain-output marker); it is never deleted"),
    ("run", "contains the input"),        # the run folder that holds the checkpoint being read
    ("run/final", "is the input"),
    (".", "contains the input"),
])
def test_cli_never_deletes_a_folder_it_did_not_write_nor_its_input(ckpt, capsys, monkeypatch, out, needle):
    _, tmp = ckpt
    (tmp / "mine").mkdir()
    (tmp / "mine" / "thesis.tex").write_text("years of work")
    (tmp / "run").mkdir()
    (tmp / "run" / ".growtrain-run").write_text("created by train.py")
    (tmp / "run" / "metrics.jsonl").write_text("{}\n")
    shutil.copytree(tmp / "base", tmp / "run" / "final")
    monkeypatch.chdir(tmp)
    before = sorted(str(p) for p in tmp.rglob("*"))
    src = "run/final" if out != "mine" else "base"
    assert cli(["coalesce", src, out, "--overwrite"]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and err.count("\n") == 0 and err.startswith("error: ")
    assert sorted(str(p) for p in tmp.rglob("*")) == before
    assert (tmp / "mine" / "thesis.tex").read_text() == "years of work"


# ---- found in review: config semantics the weights alone do not show ---------------------------------
def test_frozen_parameters_stay_frozen_through_every_operator():
    m = make_model(Shape(GPT2LMHeadModel, heads=2, head_dim=4, layers=2, ffn_mult=2))
    m.transformer.wpe.weight.requires_grad_(False)
    m.transformer.h[1].attn.c_attn.weight.requires_grad_(False)
    small = ops.coalesce(m, 2, 2)  # small layer 0 = mean of layers 0 and 1: follows layer 0 (trainable)
    assert [n for n, p in small.named_parameters() if not p.requires_grad] == ["transformer.wpe.weight"]
    mixed = ops.interpolate(m, m, 0.5)
    assert sorted(n for n, p in mixed.named_parameters() if not p.requires_grad) == \
        ["transformer.h.1.attn.c_attn.weight", "transformer.wpe.weight"]
    big = ops.decoalesce(m, 1, 2)  # adjacent: large layers 2, 3 come from small layer 1
    assert [p.requires_grad for p in (big.transformer.h[i].attn.c_attn.weight for i in range(4))] == \
        [True, True, False, False]


def test_depth_coalescing_refuses_to_merge_layers_of_different_kinds():
    from transformers import Qwen2ForCausalLM

    m = make_model(Shape(Qwen2ForCausalLM, heads=2, head_dim=4, layers=4, ffn_mult=2))
    m.config.layer_types = ["full_attention", "sliding_attention"] * 2
    with pytest.raises(ops.OperatorError, match=r"layer_types: depth_pairing 'adjacent' would merge layers \[0, 1\]"):
        ops.coalesce(m, width=1, depth=2)
    small = ops.coalesce(m, width=1, depth=2, depth_pairing="stride")
    assert ops.decoalesce(small, 1, 2, depth_pairing="stride").config.layer_types == m.config.layer_types


def test_layer_index_dependent_attention_scale_refuses_depth_changes():
    m = make_model(Shape(GPT2LMHeadModel, heads=2, head_dim=4, layers=2, ffn_mult=2))
    m.config.scale_attn_by_inverse_layer_idx = True
    with pytest.raises(ops.OperatorError, match="scale_attn_by_inverse_layer_idx"):
        ops.decoalesce(m, width=1, depth=2, depth_mode="identity")
    ops.decoalesce(m, width=2)  # width alone is still exact and allowed


def test_vit_and_deit_base_models_resize_with_their_pooler():
    from transformers import DeiTModel, ViTModel

    for cls in (ViTModel, DeiTModel):
        m = make_model(Shape(cls, heads=4, head_dim=4, layers=2, ffn_mult=2))
        small = ops.coalesce(m, 2, 2)
        assert small.config.pooler_output_size == 8 and small.pooler.dense.weight.shape == (8, 8)


def test_map_optimizer_state_validates_direction_and_factors():
    m = make_model(Shape(GPT2LMHeadModel, heads=2, head_dim=4, layers=2, ffn_mult=2))
    st = {"transformer.wte.weight": {"exp_avg": torch.zeros(61, 8)}}
    with pytest.raises(ops.OperatorError, match="direction"):
        ops.map_optimizer_state(st, m, "decoalese")
    with pytest.raises(ops.OperatorError, match="does not divide"):
        ops.map_optimizer_state(st, m, "coalesce", width=3)


def test_alpha_accepts_numpy_and_tensor_scalars():
    import numpy as np

    m = make_model(Shape(GPT2LMHeadModel, heads=2, head_dim=4, layers=2, ffn_mult=2))
    for a in (np.float32(0.5), torch.tensor(0.5)):
        ops.interpolate(m, m, a)


def test_cli_copies_only_tokenizer_and_processor_files(ckpt):
    _, tmp = ckpt
    for junk in ("optimizer.pt", "trainer_state.json", "model-00001-of-00002.safetensors"):
        (tmp / "base" / junk).write_text("stale")
    (tmp / "base" / "preprocessor_config.json").write_text("{}")
    assert cli(["coalesce", str(tmp / "base"), str(tmp / "small")]) == 0
    names = sorted(p.name for p in (tmp / "small").iterdir())
    assert names == [".growtrain-output", "config.json", "generation_config.json", "model.safetensors",
                     "preprocessor_config.json", "tokenizer_config.json"]


def test_cli_interpolate_with_a_smaller_model_asks_for_the_factors(ckpt, capsys):
    _, tmp = ckpt
    assert cli(["coalesce", str(tmp / "base"), str(tmp / "small")]) == 0
    assert cli(["interpolate", str(tmp / "base"), str(tmp / "small"), str(tmp / "mix"), "--alpha", "0.5"]) == 2
    assert "--width/--depth" in capsys.readouterr().err


# ---- sizes bounded before anything is built ----------------------------------------------------------
def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: "), err
    return err


@pytest.mark.parametrize("op", ["decoalesce", "interpolate"])
def test_cli_refuses_a_grown_model_larger_than_memory_before_building_it(ckpt, capsys, op):
    """``decoalesce --width 100000`` allocated until it died (a 643 GB tensor: the process's end, or the
    machine's)."""
    _, tmp = ckpt
    args = [str(tmp / "base"), str(tmp / "out")] if op == "decoalesce" else [
        str(tmp / "base"), str(tmp / "base"), str(tmp / "out"), "--alpha", "0.5"]
    assert cli([op, *args, "--width", "100000"]) == 2
    err = _one_error_line(capsys)
    assert re.fullmatch(r"error: --width 100000 --depth 1: the de-coalesced LlamaForCausalLM would hold "
                        r"[\d,]{17,} parameters, [\d,]{19,} bytes in float32; with the [\d,]+ bytes of the model\(s\) "
                        r"it is made from, more than the [\d,]+ bytes of memory available here; choose smaller "
                        r"factors", err), err
    assert not (tmp / "out").exists()


def test_cli_bounds_the_grown_model_by_the_memory_available_exactly(ckpt, capsys, monkeypatch):
    from common import hf_folder

    m, tmp = ckpt
    with torch.device("meta"):
        big = type(m)(ops.resized_config(m.config, 2, 2, "decoalesce"))
    n = sum(p.numel() for p in big.parameters())
    held = 4 * sum(p.numel() for p in m.parameters())  # the input, in memory beside it
    monkeypatch.setattr(hf_folder, "available_memory", lambda: 4 * n + held - 1)
    assert cli(["decoalesce", str(tmp / "base"), str(tmp / "out"), "--depth", "2"]) == 2
    assert f"the de-coalesced LlamaForCausalLM would hold {n:,} parameters, {4 * n:,} bytes in float32; with the " \
           f"{held:,} bytes of the model(s) it is made from, more than the {4 * n + held - 1:,} bytes" \
           in _one_error_line(capsys)
    monkeypatch.setattr(hf_folder, "available_memory", lambda: 4 * n + held)
    assert cli(["decoalesce", str(tmp / "base"), str(tmp / "out"), "--depth", "2"]) == 0


def test_cli_refuses_a_depth_factor_past_the_layers_it_builds_before_building_them(ckpt, capsys, monkeypatch):
    """``--depth 1000000``: even an empty (meta) model of two million layers takes hours and gigabytes to build."""
    import operators.cli

    def built(*a, **k):
        raise AssertionError("the grown model was built")

    monkeypatch.setattr(operators.cli, "model_bytes", built)
    _, tmp = ckpt
    assert cli(["decoalesce", str(tmp / "base"), str(tmp / "out"), "--depth", "3000"]) == 2
    assert "--width 2 --depth 3000: the de-coalesced model would have 6,000 layers, past the 4,096 this " \
           "project builds" in _one_error_line(capsys)
