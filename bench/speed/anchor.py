"""The physical anchor: a bare nanoGPT-style GPT-2 training loop, compiled, at the shapes a V-cycle trains.

    python -m bench.speed.anchor --shapes 12x768,6x384          # GPT-2-124M and its coarse level, 32 x 1024, bf16
    python -m bench.speed.anchor --smoke                        # a tiny shape on the CPU, eager (the test suite)

What the device does at a shape with nothing of this project in the way: a plain module (token and position
embeddings, pre-LN blocks with one fused QKV projection and PyTorch's SDPA with ``is_causal``, a tanh-GELU MLP,
the final LayerNorm and the tied head), fused AdamW, gradient clipping, bf16 autocast, ``torch.compile``, random
tokens. Both losses are timed: nanoGPT's (``F.cross_entropy`` over the whole logits) and the chunked one this
project trains with (progressive.model.loss). Rates use this project's FLOPs count (progressive.model.flops, of the
transformers GPT-2 of the same shape), so they compare with the harness's rows directly; the windows are
synchronized (common.device.Stopwatch), after ``--warmup`` steps that include compilation.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from common.cli import check_flags, run_cli
from common.device import Stopwatch, peak_flops
from progressive.model.flops import model_flops
from progressive.model.loss import linear_cross_entropy


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))  # (B, h, T, dh)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers: int, d: int, heads: int, vocab: int, seq: int, loss: str) -> None:
        super().__init__()
        self.loss = loss
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2's
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        h, y = self.ln_f(x)[:, :-1], idx[:, 1:]  # position t predicts token t + 1
        if self.loss == "chunked":
            return linear_cross_entropy(h, self.head.weight, None, y)
        logits = self.head(h)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def step_flops(layers: int, d: int, heads: int, vocab: int, batch: int, seq: int) -> int:
    """This project's count of one training step (GPT2LMHeadModel of the same shape)."""
    from transformers import GPT2Config

    config = GPT2Config(n_layer=layers, n_embd=d, n_head=heads, vocab_size=vocab, n_positions=seq)
    return model_flops(config, batch, seq, training=True, arch="GPT2LMHeadModel")


def measure(layers: int, d: int, heads: int, loss: str, a: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Train ``--warmup`` + ``--steps`` steps of one shape and loss; the timed window's rates."""
    torch.manual_seed(0)
    model = GPT(layers, d, heads, a.vocab, a.seq, loss).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device.type == "cuda")
    step = torch.compile(model) if a.compile else model
    idx = torch.randint(0, a.vocab, (a.batch, a.seq), device=device, generator=None)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.bf16)
    clock, first = Stopwatch(device), 0.0
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            clock.lap()
        with amp:
            out = step(idx)
        out.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i == 0:
            first = clock.lap()  # compilation and the first step
    seconds = clock.lap()
    flops = step_flops(layers, d, heads, a.vocab, a.batch, a.seq) * a.steps
    peak = peak_flops(device, a.peak_tflops)
    res = {"shape": f"{layers}x{d}", "loss_fn": loss, "batch": a.batch, "seq": a.seq, "vocab": a.vocab,
           "ms_per_step": round(1e3 * seconds / a.steps, 2), "tok_s": round(a.batch * a.seq * a.steps / seconds),
           "tflops": round(flops / seconds / 1e12, 2), "first_step_s": round(first, 1),
           "final_loss": round(out.item(), 4)}
    if peak:
        res["mfu"] = round(flops / seconds / peak, 4)
    del model, opt, step
    if device.type == "cuda":
        res["mem_gb"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.empty_cache()
    return res


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="12x768,6x384", help="LAYERSxWIDTH,... (64-wide heads)")
    ap.add_argument("--losses", default="ce,chunked", help="ce (nanoGPT's), chunked (this project's), or both")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation included)")
    ap.add_argument("--peak_tflops", type=float, default=None)
    ap.add_argument("--smoke", action="store_true", help="a tiny shape on the CPU, eager, fp32")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    a = ap.parse_args(argv)
    check_flags({"--batch": a.batch, "--seq": a.seq, "--vocab": a.vocab, "--steps": a.steps,
                 "--peak_tflops": a.peak_tflops, "--warmup": a.warmup},
                at_least_one=["--batch", "--seq", "--vocab", "--steps", "--peak_tflops"], not_negative=["--warmup"])
    if not all(re.fullmatch(r"[1-9][0-9]*x[1-9][0-9]*", s) for s in a.shapes.split(",")):
        raise ValueError(f"--shapes {a.shapes}: give LAYERSxWIDTH,... (e.g. 12x768,6x384)")
    if not set(a.losses.split(",")) <= {"ce", "chunked"}:
        raise ValueError(f"--losses {a.losses}: give ce, chunked or ce,chunked")
    device = torch.device("cuda" if torch.cuda.is_available() and not a.smoke else "cpu")
    a.compile, a.bf16 = not a.smoke, not a.smoke
    if a.smoke:
        a.shapes, a.batch, a.seq, a.vocab, a.steps, a.warmup = "2x32,1x16", 2, 16, 64, 2, 1
    rows = []
    for shape in a.shapes.split(","):
        layers, d = (int(x) for x in shape.split("x"))
        for loss in a.losses.split(","):
            t0 = time.monotonic()
            rows.append(measure(layers, d, max(1, d // 64) if not a.smoke else 2, loss, a, device))
            print(f"[bench.speed.anchor] {json.dumps(rows[-1])} ({time.monotonic() - t0:.0f} s)", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"device": str(torch.cuda.get_device_name(0)) if device.type == "cuda"
                                           else "cpu", "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    raise SystemExit(run_cli(main))  # a user's error is one line (exit 2); --debug shows the traceback
