"""Measure how exact the operators are, per supported class (random tiny models, fp32, dropout 0).

Columns: width de-coalescing (k=2) output error max|diff|/max|ref|; the same with depth x2 in mode
"identity" (pre-LN families); coalesce(decoalesce(m)) == m bit for bit; mapped-gradient error
max|G g_small - g_large| / max|g_large| after an exact de-coalesce.

    python bench/operators_exactness.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402
from tiny_models import ALL_CLASSES, BERT_CLASSES, Shape, main_output, make_inputs, make_model  # noqa: E402

import operators as ops  # noqa: E402
from operators import maps  # noqa: E402


def out_err(small, large, k=2) -> float:
    x = make_inputs(small)
    with torch.no_grad():
        ref, out = main_output(small, x), main_output(large, x)
    if out.shape != ref.shape:
        ref = ref.index_select(-1, maps.small_of(ref.shape[-1] * k, k, "stride"))
    return ((out - ref).abs().max() / ref.abs().max()).item()


def grad_err(small, large) -> float:
    x = make_inputs(small)
    with torch.no_grad():
        w = torch.randn_like(main_output(small, x))
    gs, gl = {}, {}
    for m, g in ((small, gs), (large, gl)):
        m.zero_grad()
        (main_output(m, x) * w).sum().backward()
        g.update({n: p.grad.clone() for n, p in m.named_parameters()})
    mapped = ops.map_optimizer_state({n: {"exp_avg": g} for n, g in gs.items()}, small, "decoalesce")
    scale = max(g.abs().max().item() for g in gl.values())
    return max((st["exp_avg"] - gl[n]).abs().max().item() for n, st in mapped.items()) / scale


def main() -> None:
    print("| class | tied | width decoalesce err | + depth identity err | round trip exact | grad map err |")
    print("|---|---|---|---|---|---|")
    for cls in ALL_CLASSES:
        for tied in (True, False):
            if not tied and cls.__name__ not in ("GPT2LMHeadModel", "LlamaForCausalLM"):
                continue
            small = make_model(Shape(cls, heads=4, head_dim=8, layers=2, ffn_mult=4, kv_heads=2, tied=tied))
            tied_now = ops.head_is_tied(small)
            w = out_err(small, ops.decoalesce(small, width=2))
            d = "n/a (post-LN)" if cls in BERT_CLASSES else \
                f"{out_err(small, ops.decoalesce(small, width=2, depth=2, depth_mode='identity')):.1e}"
            back = ops.coalesce(ops.decoalesce(small, 2, 2), 2, 2)
            exact = all(torch.equal(a, b) for a, b in zip(small.state_dict().values(), back.state_dict().values()))
            has_head = cls.__name__ not in ("GPT2Model", "BertModel")
            g = f"{grad_err(small, ops.decoalesce(small, width=2)):.1e}" if has_head else "-"
            print(f"| {cls.__name__} | {tied_now} | {w:.1e} | {d} | {exact} | {g} |")
    # Contrast: the authors' placement of the 1/k for a tied GPT-2 head (on the shared embedding, which
    # also halves the pre-LN residual stream) instead of on ln_f.
    from transformers import GPT2LMHeadModel

    small = make_model(Shape(GPT2LMHeadModel, heads=4, head_dim=8, layers=2, ffn_mult=4))
    large = ops.decoalesce(small, width=2)
    with torch.no_grad():
        large.transformer.ln_f.weight.mul_(2)
        large.transformer.ln_f.bias.mul_(2)
        large.transformer.wte.weight.mul_(0.5)
        large.transformer.wpe.weight.mul_(0.5)
    print(f"\nGPT-2 tied head with the 1/k on the embeddings (authors' placement): err {out_err(small, large):.1e}")


if __name__ == "__main__":
    main()
