"""The chunked LM loss (progressive.model.loss) against transformers' own loss, GPT-2's one-kernel GELU, and how a
run compiles (progressive.run.compiled): per-level rates without the compiling steps, graphs reused per shape, one
warning line at dynamo's recompile limit."""

import copy
import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import (
    BertConfig,
    BertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

from progressive.model import loss as L
from progressive.model.build import get_family
from progressive.run import compiled
from progressive.run.trainer import Trainer
from tests.train_utils import rows, tiny_cfg

V = 300


def _model(family: str) -> tuple[torch.nn.Module, dict]:
    torch.manual_seed(0)
    ids = torch.randint(0, V, (4, 16), generator=torch.Generator().manual_seed(1))
    if family == "gpt2":
        return GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=2, n_positions=16, bos_token_id=0,
                                          eos_token_id=0, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)), \
            {"input_ids": ids, "labels": ids}
    if family == "llama":
        return LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=2, max_position_embeddings=16, bos_token_id=0,
                                            eos_token_id=0, tie_word_embeddings=False)), \
            {"input_ids": ids, "labels": ids}
    labels = ids.clone()
    labels[torch.rand(labels.shape, generator=torch.Generator().manual_seed(2)) > 0.15] = -100
    return BertForMaskedLM(BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, max_position_embeddings=16, hidden_dropout_prob=0,
                                      attention_probs_dropout_prob=0)), {"input_ids": ids, "labels": labels}


def _loss_and_grads(model: torch.nn.Module, batch: dict, bf16: bool = False) -> tuple[float, dict]:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(**batch).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _chunked(model: torch.nn.Module, family: str) -> torch.nn.Module:
    return get_family(family).chunked_loss(copy.deepcopy(model))


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_chunked_loss_equals_transformers_loss_and_gradients_in_fp32(family, monkeypatch):
    monkeypatch.setattr(L, "CHUNK_BYTES", 7 * V * 4)  # 7 rows a chunk: 64 / 60 rows split unevenly
    model, batch = _model(family)
    ref, ref_grads = _loss_and_grads(model, batch)
    got, grads = _loss_and_grads(_chunked(model, family), batch)
    assert got == pytest.approx(ref, abs=2e-6)
    assert grads.keys() == ref_grads.keys()
    scale = max(g.abs().max().item() for g in ref_grads.values())
    assert max((grads[n] - ref_grads[n]).abs().max().item() for n in grads) <= 1e-5 * scale


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_chunked_loss_in_bf16_is_as_close_to_fp32_as_transformers_bf16_loss(family, monkeypatch):
    """Under bf16 autocast both losses round; the chunked one (matmuls in bf16, softmax in fp32) is no further from
    the fp32 truth than transformers' (matmul in bf16, upcast logits)."""
    monkeypatch.setattr(L, "CHUNK_BYTES", 9 * V * 4)
    model, batch = _model(family)
    exact, exact_grads = _loss_and_grads(model, batch)
    ref, ref_grads = _loss_and_grads(model, batch, bf16=True)
    got, grads = _loss_and_grads(_chunked(model, family), batch, bf16=True)

    def err(g: dict) -> float:
        return max((g[n] - exact_grads[n]).abs().max().item() for n in exact_grads)

    assert abs(got - exact) <= 2 * abs(ref - exact) + 1e-4
    assert err(grads) <= 2 * err(ref_grads) + 1e-6


def test_evaluation_without_grad_gives_the_same_loss_and_no_logits():
    model, batch = _model("gpt2")
    ours = _chunked(model, "gpt2")
    with torch.no_grad():
        ref, out = model(**batch), ours(**batch)
    assert out.loss.item() == pytest.approx(ref.loss.item(), abs=2e-6) and out.logits is None
    assert ours(input_ids=batch["input_ids"]).logits.shape == (4, 16, V)  # no labels: the class's own forward


def test_no_counted_label_gives_nan_as_transformers_does():
    model, batch = _model("bert")
    batch = {**batch, "labels": torch.full_like(batch["labels"], -100)}
    assert torch.isnan(model(**batch).loss) and torch.isnan(_chunked(model, "bert")(**batch).loss)


class _Largest(TorchDispatchMode):
    """The most elements any op's output held."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_no_tensor_as_large_as_the_logits_exists_in_the_chunked_step(monkeypatch):
    """The mechanism: a training step (forward and backward) never holds a (tokens x vocabulary) tensor, only
    a chunk of it; transformers' loss does."""
    monkeypatch.setattr(L, "CHUNK_BYTES", 8 * V * 4)  # 8 rows of logits a chunk
    model, batch = _model("gpt2")
    logits = batch["input_ids"].numel() * V
    for m, bound in ((model, None), (_chunked(model, "gpt2"), 8 * V)):
        with _Largest() as seen:
            m(**batch).loss.backward()
        if bound is None:
            assert seen.largest >= logits
        else:
            assert seen.largest <= max(bound, max(p.numel() for p in m.parameters())) < logits


def test_the_model_stays_a_plain_transformers_model(tmp_path):
    model, batch = _model("gpt2")
    ours = _chunked(model, "gpt2")
    assert type(ours) is GPT2LMHeadModel and L.installed(ours) and not L.installed(model)
    ours.save_pretrained(tmp_path)
    back = GPT2LMHeadModel.from_pretrained(tmp_path)
    assert not L.installed(back)
    assert back(**batch).loss.item() == pytest.approx(model(**batch).loss.item(), abs=1e-6)
    assert get_family("gpt2", "classify").head is None  # a classifier's loss stays the model's


def test_auto_chunks_where_a_micro_batch_of_logits_exceeds_a_chunk():
    class T:
        loss, batch_size, grad_accum = "auto", 32, 1

    assert L.chunks(T, 50304, 1024)  # GPT-2-124M at 32 x 1024: 6.6 GB of fp32 logits
    assert not L.chunks(T, 4096, 128)  # the README's run: 67 MB
    T.grad_accum = 8
    assert not L.chunks(T, 50304, 1024, processes=8)  # one sequence a micro-batch: 206 MB
    T.loss = "chunked"
    assert L.chunks(T, 4096, 128)


def test_gpt2_trains_with_the_one_kernel_tanh_gelu_which_equals_gelu_new_to_rounding(tmp_path):
    """Trained weights (a short run of the tiny GPT-2) give the same logits under both activation names."""
    cfg = tiny_cfg(tmp_path, method="baseline", train__steps=6, train__eval_every=100)
    Trainer(cfg).run()
    model = GPT2LMHeadModel.from_pretrained(cfg.run_dir / "final")
    assert model.config.activation_function == "gelu_pytorch_tanh"
    ids = torch.randint(0, model.config.vocab_size, (4, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        tanh = model(input_ids=ids).logits
        model.config.activation_function = "gelu_new"
        from transformers.activations import ACT2FN

        for block in model.transformer.h:
            block.mlp.act = ACT2FN["gelu_new"]
        new = model(input_ids=ids).logits
    assert 0 < (tanh - new).abs().max().item() <= 1e-5 * tanh.abs().max().item()


def test_a_run_with_the_chunked_loss_trains_what_the_model_loss_trains(tmp_path):
    """Through the V-cycle's level changes (a new model each time): the same losses to fp32 rounding."""
    runs = {}
    for loss in ("model", "chunked"):
        cfg = tiny_cfg(tmp_path / loss, train__loss=loss, train__steps=8, train__eval_every=4)
        trainer = Trainer(cfg)
        trainer.run()
        assert L.installed(trainer.raw) == (loss == "chunked")  # the last level's model computed its loss here
        runs[loss] = rows(cfg.run_dir, "train")
    assert [r["phase"] for r in runs["model"]] == [r["phase"] for r in runs["chunked"]]
    assert len({r["phase"] for r in runs["model"]}) == 3
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(runs["model"], runs["chunked"])) <= 1e-5


# ---------------------------------------------------------------------------------------------- compiling


def test_compile_auto_is_on_only_where_a_gpu_trains(monkeypatch, tmp_path):
    cfg = tiny_cfg(tmp_path)
    assert cfg.train.compile == "auto" and not compiled.compiles(cfg)  # this CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert compiled.compiles(cfg)
    assert not compiled.compiles(tiny_cfg(tmp_path, train__cpu=True))
    assert not compiled.compiles(tiny_cfg(tmp_path, parallel__pipeline="fixed"))
    assert compiled.compiles(tiny_cfg(tmp_path, train__compile=True, train__cpu=True))


def _graphs_for(models: list[torch.nn.Module], ids: torch.Tensor) -> list[int]:
    out = []
    for m in models:
        before = compiled.graphs_compiled()
        compiled.compile_model(m, backend="eager")(input_ids=ids, labels=ids).loss.backward()
        out.append(compiled.graphs_compiled() - before)
    return out


def _gpt2(width: int, layers: int) -> torch.nn.Module:
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=width, n_layer=layers, n_head=2, n_positions=8,
                                      bos_token_id=0, eos_token_id=0))


@pytest.mark.slow
def test_each_shape_compiles_once_and_a_shape_that_comes_back_reuses_its_graph(settled_dynamo):
    """A V-cycle's levels: full, coarse, full again (a new module object of the first shape): two graphs, static
    (no graph with symbolic sizes for the second shape)."""
    torch._dynamo.reset()
    ids = torch.randint(0, 64, (2, 8))
    full, coarse, again = _graphs_for([_gpt2(32, 2), _gpt2(16, 1), _gpt2(32, 2)], ids)
    assert full >= 1 and coarse >= 1 and again == 0
    assert torch._dynamo.config.automatic_dynamic_shapes is False


class _Stack(torch.nn.Module):
    """A stand-in for a model with freeze states: layers of which the first ``frozen`` train no more."""

    def __init__(self, frozen: int, layers: int = 12) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(layers))
        for layer in self.layers[:frozen]:
            layer.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x.sum()


def _stack_graphs(count: int) -> list[int]:
    out = []
    for k in range(count):
        before = compiled.graphs_compiled()
        compiled.compile_model(_Stack(k), backend="eager")(torch.ones(2, 8)).backward()
        out.append(compiled.graphs_compiled() - before)
    return out


def test_every_variant_of_a_run_compiles_past_dynamos_default_limit_of_8(settled_dynamo):
    """AutoFreeze's freeze states are variants of one code object: all 11 get their graph (dynamo's default limit
    of 8 sent the ninth and later ones on eagerly, silently)."""
    torch._dynamo.reset()
    assert all(c >= 1 for c in _stack_graphs(11))


def test_hitting_the_recompile_limit_prints_one_line(monkeypatch, capsys, settled_dynamo):
    torch._dynamo.reset()
    compiled.settle_dynamo()
    said = []
    monkeypatch.setattr(compiled._settled[0], "say", said.append)
    monkeypatch.setattr(compiled._settled[0], "said", False)
    monkeypatch.setattr(compiled, "RECOMPILE_LIMIT", 2)
    with settled_dynamo.patch(recompile_limit=2):  # not monkeypatch: pytest 9.2's undo deleted the setting
        counts = _stack_graphs(4)
    assert counts[-1] == 0 and len(said) == 1 and said[0].startswith("warning: torch.compile hit")
    assert "\n" not in said[0] and "torch._dynamo hit" not in capsys.readouterr().err


def test_per_level_rates_leave_out_the_steps_that_compiled():
    from progressive.run.summary import phase_rows

    class Phase:
        def __init__(self, name, config):
            self.name, self.config, self.steps, self.peak_lr = name, config, 2, 1e-3

    config = GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=8)
    rows_ = [  # phase 0: a 10 s compiling step then 1 s for 1e12 FLOPs; phase 1: reused graph, 2e12 in 1 s
        {"kind": "train", "phase": 0, "tokens": 10, "flops": 1e12, "wall": 10.0, "compile_s": 10.0,
         "compile_flops": 1e12, "compile_tokens": 5, "loss": 1.0},
        {"kind": "train", "phase": 0, "tokens": 20, "flops": 2e12, "wall": 11.0, "compile_s": 10.0,
         "compile_flops": 1e12, "compile_tokens": 5, "loss": 1.0},
        {"kind": "train", "phase": 1, "tokens": 40, "flops": 4e12, "wall": 12.0, "compile_s": 10.0,
         "compile_flops": 1e12, "compile_tokens": 5, "loss": 1.0}]
    out = phase_rows(get_family("gpt2"), [Phase("L0", config), Phase("L1", config)], rows_)
    assert [p["tflops"] for p in out] == [1.0, 2.0] and [p["compile_s"] for p in out] == [10.0, 0.0]


@pytest.mark.slow
def test_a_compiled_run_reports_its_compile_time_and_rates_without_it(tmp_path, monkeypatch, settled_dynamo):
    """The trainer's own compile (eager backend here: the mechanism, not inductor's kernels): the first step
    of each new shape is compile time, the returning full level's is not, and the rows' rates leave it out."""
    monkeypatch.setattr(compiled, "BACKEND", "eager")
    torch._dynamo.reset()
    cfg = tiny_cfg(tmp_path, train__compile=True, train__steps=8, train__eval_every=100, train__log_every=1)
    Trainer(cfg).run()
    train = rows(cfg.run_dir, "train")
    by_phase = {}
    for r in train:
        by_phase.setdefault(r["phase"], []).append(r)
    firsts = [rs[0] for rs in by_phase.values()]
    # compile time grew in the first two levels' first steps, not when the full model came back
    assert firsts[0]["compile_s"] > 0 and firsts[1]["compile_s"] > firsts[0]["compile_s"]
    assert firsts[2]["compile_s"] == by_phase[1][-1]["compile_s"]
    assert firsts[1]["compile_flops"] > firsts[0]["compile_flops"] > 0
    assert "tflops" not in firsts[0]  # a window of only the compiling step has no rate

    phases = json.loads((cfg.run_dir / "summary.json").read_text())["phases"]
    assert all(p["tflops"] and p["tflops"] > 0 for p in phases) and phases[2]["compile_s"] == 0.0


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    yield
    torch._dynamo.reset()


@pytest.mark.slow
def test_the_loss_memory_bench_runs_tiny_and_writes_outside_the_results(tmp_path):
    """``python -m bench.speed.loss_memory --smoke``: both losses in their own processes, the same loss."""

    from bench.speed import loss_memory

    out = tmp_path / "loss_memory.json"
    rows_ = loss_memory.main(["--smoke", "--out", str(out)])
    assert [r["loss_fn"] for r in rows_] == ["model", "chunked"] and rows_[0]["loss"] == pytest.approx(rows_[1]["loss"])
    assert json.loads(out.read_text())["results"] == rows_
