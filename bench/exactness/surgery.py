"""Measure how exact the operators are, per supported class (random tiny models, fp32, dropout 0).

Columns: width de-coalescing (k=2) output error max|diff|/max|ref|; the same with depth x2 in mode
"identity" (pre-LN families); coalesce(decoalesce(m)) == m bit for bit; mapped-gradient error
max|G g_small - g_large| / max|g_large| after an exact de-coalesce.

Second table, the asymmetric (symmetry-breaking) width split at split_noise 0.1 and 1.0, seed 0: output
error; coalesce(decoalesce(m)) error max|back - m| / max|m| over tensors (fp32 rounding of W/k + N);
max|M^T g_large - g_small| / max|g_small| (coalescing the large gradient); and the symmetry-breaking
part max|g_large - G g_small| / max|g_large|, which the symmetric split keeps at rounding level.

    python -m bench.exactness.surgery
"""

from __future__ import annotations

import argparse

import torch

import operators as ops
from bench.lib.tiny import ALL_CLASSES, BERT_CLASSES, Shape, main_output, make_inputs, make_model
from common.cli import run_cli
from operators import maps


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
        g.update({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    mapped = ops.map_optimizer_state({n: {"exp_avg": g} for n, g in gs.items()}, small, "decoalesce")
    scale = max(g.abs().max().item() for g in gl.values())
    return max((st["exp_avg"] - gl[n]).abs().max().item() for n, st in mapped.items()) / scale


def _grads(m, x, w) -> dict:
    m.zero_grad()
    (main_output(m, x) * w).sum().backward()
    return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def asym_row(small, has_head: bool) -> str:
    errs = [out_err(small, ops.decoalesce(small, 2, width_split="asymmetric", split_noise=s, seed=0))
            for s in (0.1, 1.0)]
    large = ops.decoalesce(small, 2, width_split="asymmetric", split_noise=0.1, seed=0)
    back = ops.coalesce(large, 2).state_dict()
    rt = max((back[n] - t).abs().max().item() / max(t.abs().max().item(), 1e-30) for n, t in small.state_dict().items())
    cols = [f"{e:.1e}" for e in errs] + [f"{rt:.1e}"]
    if not has_head:
        return " | ".join(cols + ["-", "-"])
    x = make_inputs(small)
    with torch.no_grad():
        w = torch.randn_like(main_output(small, x))
    gs, gl = _grads(small, x, w), _grads(large, x, w)
    merged = ops.map_optimizer_state({n: {"exp_avg": g} for n, g in gl.items()}, large, "coalesce")
    mapped = ops.map_optimizer_state({n: {"exp_avg": g} for n, g in gs.items()}, small, "decoalesce")
    s_scale = max(g.abs().max().item() for g in gs.values())
    l_scale = max(g.abs().max().item() for g in gl.values())
    dual = max((merged[n]["exp_avg"] - g).abs().max().item() for n, g in gs.items()) / s_scale
    rest = max((g - mapped[n]["exp_avg"]).abs().max().item() for n, g in gl.items()) / l_scale
    return " | ".join(cols + [f"{dual:.1e}", f"{rest:.1e}"])


def main(argv: list[str] | None = None) -> None:
    """Print the tables (``argv``: sys.argv[1:] by default; the bench takes no options but --help).

    Raises:
        ValueError: any other argument, before any work (it was ignored, and the tables printed as if unasked).
    """
    ap = argparse.ArgumentParser(prog="python -m bench.exactness.surgery", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    _, rest = ap.parse_known_args(argv)
    if rest:
        raise ValueError(f"unknown arguments {' '.join(rest)}: python -m bench.exactness.surgery takes none "
                         "(see --help)")
    print("| class | tied | width decoalesce err | + depth identity err | round trip exact | grad map err |")
    print("|---|---|---|---|---|---|")
    asym = []
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
            has_head = cls.__name__.endswith(("LMHeadModel", "ForMaskedLM", "Classification", "CausalLM",
                                              "WithTeacher"))  # base models (ViTModel...) have no logits
            g = f"{grad_err(small, ops.decoalesce(small, width=2)):.1e}" if has_head else "-"
            print(f"| {cls.__name__} | {tied_now} | {w:.1e} | {d} | {exact} | {g} |")
            asym.append(f"| {cls.__name__} | {tied_now} | {asym_row(small, has_head)} |")
    print("\nAsymmetric width split (seed 0):\n")
    print("| class | tied | output err, noise 0.1 | output err, noise 1.0 | round trip err | M^T g_L vs g_s | "
          "g_L - G g_s (symmetry breaking) |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(asym))
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
    raise SystemExit(run_cli(main))  # a user's error is one line (exit 2); --debug shows the traceback
