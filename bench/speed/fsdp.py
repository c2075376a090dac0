"""FSDP2 against DDP on CPU processes (gloo): step time, peak memory per process, and the time of a level
change, for a V-cycle on GPT-2-small shapes scaled to fit a 2-core machine (6 layers x 384, 6 heads, vocab
4096, sequence 128; GPT-2 small is 12 x 768, vocab 50257).

    python -m bench.speed.fsdp [--nproc 2] [--steps 30] [--threads 1] [--out outputs/bench_fsdp] [--results DIR]
                               [--smoke]

Both modes run the same config through ``train.py`` under torchrun (one process per core, 1 thread each),
back to back; the only difference is ``train.fsdp``. Reported per mode: the median training step (the
trainer's own wall-clock per step, steps right after a level change left out), the seconds of each level
change (gather, operators, re-shard and re-prepare; the checkpoint written after it not included), each
process's peak resident memory (``ru_maxrss``, which includes Python, torch and the data), and the bytes of
weights, gradients and AdamW moments each process holds at the full size (counted: fp32, 16 bytes per
parameter, divided by the processes under FSDP2). On CPU with gloo FSDP2 pays an all-gather per block in
forward and backward and a reduce-scatter per block, where DDP pays one bucketed all-reduce: FSDP2 is a
memory tool; on one node of GPUs its collectives overlap with compute.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
from pathlib import Path

from progressive.cli import _main
from progressive.config import dump_yaml, load_config
from progressive.run.tracking import read_metrics

ROOT = Path(__file__).resolve().parents[2]

from bench.lib.runs import output_folder, publish  # noqa: E402
from common.cli import check_flags, run_cli  # noqa: E402
from common.io import atomic_write_text  # noqa: E402

SHAPE = {"model.family": "gpt2", "model.hidden_size": 384, "model.num_layers": 6, "model.num_heads": 6,
         "data.tokenizer": "bpe", "data.vocab_size": 4096, "data.seq_len": 128, "train.batch_size": 16}
SMOKE = {"model.hidden_size": 32, "model.num_layers": 2, "model.num_heads": 2, "data.vocab_size": 384,
         "data.seq_len": 32, "data.max_tokens": 40000, "train.batch_size": 8}
LEVELS = [{"alpha": 0.25, "down": {"fraction": 0.3, "warmup": 0.3}, "up": {}},
          {"width": 2, "depth": 2, "down": {"fraction": 0.4, "lr_scale": 2.0}}]


def _config(mode: str, args: argparse.Namespace, out: Path) -> Path:

    over = {**SHAPE, **(SMOKE if args.smoke else {}), "name": mode, "output_dir": str(out / "runs"),
            "method.name": "vcycle", "method.vcycle.levels": LEVELS, "train.steps": args.steps,
            "train.cpu": True, "train.threads": args.threads, "train.fsdp": mode == "fsdp2", "train.lr": 1e-3,
            "train.eval_every": 10_000, "train.eval_batches": 1, "train.checkpoint_every": 10_000,
            "train.progress": False, "data.cache_dir": str(ROOT / ".cache" / "data")}
    cfg = load_config(None, over)
    path = out / f"{mode}.yaml"
    atomic_write_text(path, dump_yaml(cfg))
    return path


def _worker(config: str, rss_dir: str) -> None:
    """One process of a torchrun: train.py's main, then this process's peak resident memory."""

    code = _main(["--config", config, "--overwrite"])
    rank = os.environ.get("RANK", "0")
    Path(rss_dir, f"rank{rank}.json").write_text(json.dumps({"max_rss_mb": resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss / 1024}))
    raise SystemExit(code)


def _measure(mode: str, args: argparse.Namespace, out: Path) -> dict:

    path = _config(mode, args, out)
    rss = out / f"rss_{mode}"
    rss.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.nproc),
           "-m", "bench.speed.fsdp", "--worker", str(path), str(rss)]
    print(f"  {mode}: {' '.join(cmd[1:])}", file=sys.stderr)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"error: the {mode} run failed (exit {proc.returncode})")
    run = out / "runs" / mode
    summary = json.loads((run / "summary.json").read_text())
    train = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]
    changed = {t["step"] for t in summary["transitions"]}
    steps = [b["wall"] - a["wall"] for a, b in zip(train, train[1:])
             if a["step"] not in changed and b["step"] - 1 not in changed]
    params = summary.get("params") or _params(run)
    per_rank = 16 * params / (args.nproc if mode == "fsdp2" else 1)
    return {"mode": mode, "processes": args.nproc, "median step s": round(statistics.median(steps), 4),
            "level changes s": [round(t["seconds"], 3) for t in summary["transitions"]],
            "peak RSS per process MB": round(max(json.loads(p.read_text())["max_rss_mb"]
                                                 for p in rss.glob("*.json")), 1),
            "weights+grads+AdamW per process MB (counted)": round(per_rank / 2**20, 2),
            "final train loss": train[-1]["loss"]}


def _params(run: Path) -> int:
    from safetensors import safe_open

    with safe_open(run / "final" / "model.safetensors", "pt") as f:
        total = 0
        for k in f.keys():
            shape = f.get_slice(k).get_shape()
            n = 1
            for d in shape:
                n *= d
            total += n
    return total


def main(argv: list[str] | None = None) -> None:
    """The bench's command line (``argv``: sys.argv[1:] by default; ``--worker MODE CONFIG``: one measured process).

    Raises:
        ValueError: a count < 1, before any work.
    """
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        _worker(argv[1], argv[2])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=2, help="processes (one per core; more measure contention)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="outputs/bench_fsdp")
    ap.add_argument("--results", default=None, help="also record the results here (bench/results)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: check the script runs (numbers mean nothing)")
    args = ap.parse_args(argv)
    check_flags({"--nproc": args.nproc, "--steps": args.steps, "--threads": args.threads},
                at_least_one=["--nproc", "--steps", "--threads"])
    if args.smoke:
        args.steps = min(args.steps, 6)
    out = output_folder(args.out, "python -m bench.speed.fsdp",
                        ["runs", "rss_ddp", "rss_fsdp2", "ddp.yaml", "fsdp2.yaml", "fsdp.*"])
    rows = [_measure(mode, args, out) for mode in ("ddp", "fsdp2")]

    import torch

    payload = {"device": f"CPU ({platform.processor() or platform.machine()}), {args.nproc} processes x "
                         f"{args.threads} thread", "torch": torch.__version__, "steps": args.steps,
               "shape": {**SHAPE, **(SMOKE if args.smoke else {})}, "results": rows,
               "command": " ".join(["python -m bench.speed.fsdp", *sys.argv[1:]])}
    text = publish(out, "fsdp", payload, args.results, "python -m bench.speed.fsdp")
    print(text)


if __name__ == "__main__":
    raise SystemExit(run_cli(main))  # a user's error is one line (exit 2); --debug shows the traceback
