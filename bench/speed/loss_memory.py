"""Peak host memory and time of one training step at GPT-2-124M's shape on a CPU: transformers' loss or the chunked one.

    python -m bench.speed.loss_memory                 # 12 x 768, vocabulary 50,304, 4 x 1,024 tokens, fp32 and bf16
    python -m bench.speed.loss_memory --smoke         # a tiny shape (the test suite)

Each (loss, precision) runs in a process of its own, one thread: it builds the model and the batch, reads its
resident set, runs one forward and backward (no optimizer: its state is the same either way), and reports the peak
resident set above that reading (``ru_maxrss``) and the step's seconds. ``--chunk_mb`` sizes the chunk so that the
logits split as they do on a GPU batch (32 x 1,024 tokens of 6.6 GB split into 7 chunks of 1 GiB; here 4 x 1,024
tokens of 786 MiB into 7 of 128 MiB). Results: bench/results/loss_memory.json (``--smoke``: outputs/bench/).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from bench.lib.runs import machine
from common.cli import check_flags, run_cli
from common.io import atomic_write_json
from progressive.model import loss as L

ROOT = Path(__file__).resolve().parents[2]


def child(a: argparse.Namespace) -> dict:
    """One step in this process; its peak memory above the model and batch, and its seconds."""
    import psutil
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(1)
    torch.manual_seed(0)
    L.CHUNK_BYTES = a.chunk_mb << 20
    model = GPT2LMHeadModel(GPT2Config(vocab_size=a.vocab, n_embd=a.width, n_layer=a.layers,
                                       n_head=max(1, a.width // 64), n_positions=a.seq, bos_token_id=0,
                                       eos_token_id=0, resid_pdrop=0.0,
                                       embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_pytorch_tanh"))
    if a.loss == "chunked":
        L.install(model, "lm_head", None, shift=True)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=torch.Generator().manual_seed(0))
    before = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"loss_fn": a.loss, "precision": a.precision, "peak_above_model_mb": round((peak - before) / 2**20),
            "step_s": round(seconds, 2), "loss": round(loss.item(), 5)}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--chunk_mb", type=int, default=128)
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--loss", default="model", help=argparse.SUPPRESS)
    ap.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    sizes = ["--layers", "--width", "--vocab", "--seq", "--batch", "--chunk_mb"]
    check_flags({f: getattr(a, f[2:]) for f in sizes}, at_least_one=sizes)
    if not set(a.precisions.split(",")) <= {"fp32", "bf16"}:
        raise ValueError(f"--precisions {a.precisions}: give fp32, bf16 or fp32,bf16")
    if a.smoke:
        a.layers, a.width, a.vocab, a.seq, a.batch, a.chunk_mb, a.precisions = 1, 64, 8192, 64, 2, 1, "fp32"
    if a._child:
        print(json.dumps(child(a)))
        return []
    rows = []
    shape = ["--layers", str(a.layers), "--width", str(a.width), "--vocab", str(a.vocab), "--seq", str(a.seq),
             "--batch", str(a.batch), "--chunk_mb", str(a.chunk_mb)]
    for precision in a.precisions.split(","):
        for loss in ("model", "chunked"):
            proc = subprocess.run([sys.executable, "-m", "bench.speed.loss_memory", "--_child", "--loss", loss,
                                   "--precision", precision, *shape], cwd=ROOT, capture_output=True, text=True,
                                  env={"OMP_NUM_THREADS": "1", **__import__("os").environ})
            if proc.returncode != 0:
                raise RuntimeError(f"{loss} {precision}: {proc.stderr[-1500:]}")
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"[bench.speed.loss_memory] {rows[-1]}", flush=True)
    logits_mb = a.batch * a.seq * a.vocab * 4 / 2**20
    out = Path(a.out) if a.out else (ROOT / "outputs" / "bench" / "loss_memory.json" if a.smoke
                                     else ROOT / "bench" / "results" / "loss_memory.json")
    out.parent.mkdir(parents=True, exist_ok=True)

    atomic_write_json(out, {"written_by": "growtrain python -m bench.speed.loss_memory", "machine": machine(),
                            "shape": f"{a.layers}x{a.width}, vocabulary {a.vocab}, {a.batch} x {a.seq} tokens",
                            "fp32_logits_mb": round(logits_mb), "chunk_mb": a.chunk_mb, "results": rows})
    print(f"wrote {out}")
    return rows


if __name__ == "__main__":
    raise SystemExit(run_cli(main))  # a user's error is one line (exit 2); --debug shows the traceback
