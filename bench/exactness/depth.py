"""How exact weight-shared depth and depth growth are (operators.depth: Apollo, StackBERT, G_stack), per
supported class (random tiny models, fp32, dropout 0, eval mode).

For (N, D) in {(1, 3), (2, 5), (3, 6), (3, 12)} and both maps: a model of N distinct layers run shared at
depth D against the model grown to D layers along the same map. Columns: output error
max|diff| / max|shared| and, for every parameter of the shared model, its gradient against the sum of its
copies' gradients in the grown model (max|diff| / max|sum|); the worst case over the (N, D) pairs.

    python -m bench.exactness.depth
"""

from __future__ import annotations

import argparse
import re

import torch

import operators as ops
from bench.lib.tiny import ALL_CLASSES, LLAMA_CLASSES, Shape, main_output, make_inputs, make_model
from common.cli import run_cli

PAIRS = ((1, 3), (2, 5), (3, 6), (3, 12))


def errors(cls: type, kind: str) -> tuple[float, float]:
    """(output error, gradient-sum error), worst over PAIRS, for ``cls`` and map ``kind``."""
    out, grad = 0.0, 0.0
    for n, depth in PAIRS:
        model = make_model(Shape(cls, heads=4, head_dim=8, layers=n, ffn_mult=4,
                                 kv_heads=2 if cls in LLAMA_CLASSES else None))
        x = make_inputs(model)
        shared = ops.SharedDepth(model, kind)
        shared.set_depth(depth)
        a = main_output(model, x)
        w = torch.randn_like(a)  # a random linear read-out, so every output element has a gradient
        model.zero_grad()
        (a * w).sum().backward()
        shared.restore()
        grown = ops.grow_depth(model, depth, kind)
        b = main_output(grown, x)
        (b * w).sum().backward()
        out = max(out, ((a - b).abs().max() / a.abs().max()).item())
        src = ops.depth_map(n, depth, kind)
        copies_of, pattern = dict(grown.named_parameters()), re.compile(ops.family_of(model).layer_pattern)
        for name, p in model.named_parameters():
            if p.grad is None:  # not on the path to the output (e.g. a pooler of a bare trunk)
                continue
            hit = pattern.match(name)
            names = [f"{hit.group(1)}.{j}.{hit.group(3)}" for j in range(depth) if src[j] == int(hit.group(2))] \
                if hit else [name]
            total = sum(copies_of[c].grad for c in names)
            grad = max(grad, ((p.grad - total).abs().max() / total.abs().max().clamp_min(1e-30)).item())
    return out, grad


def main(argv: list[str] | None = None) -> None:
    """Print the tables (``argv``: sys.argv[1:] by default; the bench takes no options but --help).

    Raises:
        ValueError: any other argument, before any work (it was ignored, and the tables printed as if unasked).
    """
    ap = argparse.ArgumentParser(prog="python -m bench.exactness.depth", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    _, rest = ap.parse_known_args(argv)
    if rest:
        raise ValueError(f"unknown arguments {' '.join(rest)}: python -m bench.exactness.depth takes none "
                         "(see --help)")
    print("| class | interpolation: output err | gradient-sum err | stack: output err | gradient-sum err |")
    print("|---|---|---|---|---|")
    for cls in ALL_CLASSES:
        (oi, gi), (o_s, g_s) = errors(cls, "interpolation"), errors(cls, "stack")
        print(f"| {cls.__name__} | {oi:.1e} | {gi:.1e} | {o_s:.1e} | {g_s:.1e} |")


if __name__ == "__main__":
    raise SystemExit(run_cli(main))  # a user's error is one line (exit 2); --debug shows the traceback
