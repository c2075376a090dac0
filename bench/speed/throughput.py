"""Throughput of the harness (progressive.run.trainer) against a bare PyTorch loop on the same model and batches.

    python -m bench.speed.throughput                     # CPU: the default GPT-2 shape, 3 alternating repeats
    python -m bench.speed.throughput --gpu               # + GPU section (auto when CUDA is available): eager and
                                                         # compiled
    python -m bench.speed.throughput --knobs             # fused vs foreach AdamW, bf16 autocast, torch.compile

Both loops train the baseline method's model from the same seed on the same global batches (progressive.data
.batch_indices), with the same AdamW implementation, LR schedule, clipping and precision. The bare loop has no
Accelerate, no hooks, no logging. Timing starts after ``--warmup`` steps and covers every later step end to
end (harness: batch building, method hooks, FLOPs accounting, metrics row, loss sync; evaluation and
checkpoints are scheduled outside the window). Runs alternate harness/bare to share machine noise; the table
gives each run and the medians; ratio = harness tokens/s / bare tokens/s (target >= 0.97, i.e. <= 3% overhead).
On a shared machine wall-clock ratios are noisy; the ratio of tokens per CPU-second of the process (the work
each loop needs, insensitive to other processes) is reported next to it.
Every time is device time (common.device: synchronized before the clock is read), and the losses are compared
at the same steps (each harness row is the mean of the steps since the previous row; so is the bare loop's).
GPU section: GPT-2-124M shape (12L/768/12h, seq 1024), bf16, eager and compiled (``--gpu_compile``), tokens/s
and MFU = achieved model FLOPs/s (progressive.model.flops, training = 3x forward) / the GPU's peak dense bf16
FLOPs/s (common.device.PEAK_BF16_TFLOPS). ``--gpu_tiny`` runs that section's code on a tiny shape on the CPU
(python -m bench.speed.gpu --smoke).
Knobs section: the harness alone (train.py, the baseline method) with each throughput setting, one process
per run (Accelerate keeps precision and compile settings per process), variants alternating over repeats:
tokens/s over the steps after ``--warmup`` (from metrics.jsonl's training wall-clock, which leaves out
evaluation and checkpoint I/O) and, with compile, the first step's seconds (compilation included).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.lib.runs import output_file
from common.cli import check_flags, run_cli
from common.device import Stopwatch, peak_flops
from common.io import atomic_write_json
from common.ownership import WRITTEN_BY
from common.quiet import quiet_transformers
from common.table import format_table
from progressive import data as pdata
from progressive.cli import parse
from progressive.config import load_config
from progressive.methods import Method
from progressive.model.build import DataInfo, get_family, guess_data_info, step_flops
from progressive.model.loss import chunks
from progressive.run.accelerator import build_optimizer, build_scheduler
from progressive.run.compiled import compile_model, compiles
from progressive.run.loop import TrainingRun
from progressive.run.start import Start
from progressive.run.tracking import read_metrics
from progressive.run.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]


def _cfg(overrides: dict, out: str):

    over = {"output_dir": out, "method.name": "baseline", "train.eval_every": 10**6, "train.checkpoint_every": 10**6,
            "train.progress": False, "train.report_to": "none"}
    return load_config(ROOT / "configs" / "default.yaml", {**over, **overrides})


def harness(cfg, warmup: int) -> tuple[tuple[float, float], list[tuple[int, float]]]:
    """Run the Trainer for cfg.train.steps; (tokens/s, tokens per CPU-second) over the steps after ``warmup``,
    and the logged (step, loss) rows."""

    stamps, clock = [], Stopwatch("cuda" if torch.cuda.is_available() and not cfg.train.cpu else "cpu")
    after_step = TrainingRun._after_step

    def stamped(run, lr, epoch_before):
        # Stamps before the bookkeeping of step `warmup` and of the last step: the window holds steps
        # warmup+1 .. last with all their per-step overhead, and none of the final evaluation.
        if run.c.step in (warmup, cfg.train.steps):
            clock.lap()
            stamps.append((time.perf_counter(), time.process_time()))
        after_step(run, lr, epoch_before)

    TrainingRun._after_step = stamped  # for this one run (nothing subclasses the loop), put back after it
    try:
        Trainer(cfg, Start("fresh", overwrite=True)).run()
    finally:
        TrainingRun._after_step = after_step
    tokens = cfg.train.batch_size * cfg.data.seq_len * (cfg.train.steps - warmup)
    rows = [r for r in map(json.loads, (cfg.run_dir / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "train"]
    return _rates(tokens, stamps), [(r["step"], r["loss"]) for r in rows]


def loss_gap(rows: list[tuple[int, float]], losses: list[float]) -> float:
    """Largest |harness row loss - mean of the bare loop's losses over the same steps| (a row at step s is the
    mean of the steps since the previous row: steps prev+1 .. s, i.e. ``losses[prev:s]``)."""
    gap, prev = 0.0, 0
    for step, loss in rows:
        window = losses[prev:step]
        gap, prev = max(gap, abs(loss - sum(window) / len(window))), step
    return gap


def _rates(tokens: int, stamps: list[tuple[float, float]]) -> tuple[float, float]:
    """(tokens per wall-clock second, tokens per CPU second of this process) between the two stamps."""
    return tokens / (stamps[1][0] - stamps[0][0]), tokens / (stamps[1][1] - stamps[0][1])


def bare(cfg, warmup: int) -> tuple[float, list[float]]:
    """The same training with nothing but torch: model, AdamW, LambdaLR, autocast, clipping."""
    from accelerate.utils import set_seed

    t = cfg.train
    dev = torch.device("cuda" if torch.cuda.is_available() and not t.cpu else "cpu")
    if t.threads:
        torch.set_num_threads(t.threads)
    set_seed(t.seed)
    fam = get_family(cfg.model.family)
    tok = pdata.build_tokenizer(cfg.data)
    train = pdata.load_token_blocks(cfg.data, tok).train
    info = DataInfo(cfg.model.vocab_size or len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    phase = Method(cfg, fam).plan(fam.build_config(cfg.model, info, cfg.data.seq_len), lambda c: 1)[0]
    set_seed(t.seed)
    model = fam.build_model(phase.config).to(dev)
    if chunks(t, phase.config.vocab_size if fam.head else 0, cfg.data.seq_len, compiled_whole=compiles(cfg)):
        fam.chunked_loss(model)  # the harness's loss (progressive.model.loss), so both loops compute the same
    opt = build_optimizer(model, t, phase.peak_lr, dev)
    sched = build_scheduler(opt, phase)
    amp = (torch.autocast(dev.type, dtype=torch.bfloat16) if t.mixed_precision == "bf16"
           else contextlib.nullcontext())
    if compiles(cfg):
        model = compile_model(model)
    clock, stamps, losses = Stopwatch(dev), [], []
    for step in range(t.steps):
        if step == warmup:
            clock.lap()
            stamps.append((time.perf_counter(), time.process_time()))
        ids = torch.from_numpy(train[pdata.batch_indices(len(train), t.batch_size, t.seed, step)].astype("int64"))
        ids = ids.to(dev, non_blocking=True)
        with amp:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if t.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.max_grad_norm)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())  # no host sync inside the loop: the bare loop's best case
    clock.lap()
    stamps.append((time.perf_counter(), time.process_time()))
    tokens = t.batch_size * cfg.data.seq_len * (t.steps - warmup)
    return _rates(tokens, stamps), [v.item() for v in losses]


def section(name: str, overrides: dict, warmup: int, repeats: int, peak: float | None) -> dict:
    """Alternate harness and bare runs ``repeats`` times; returns per-run and median numbers."""

    runs = []
    with tempfile.TemporaryDirectory() as out:
        for r in range(repeats):
            (h, hc), hl = harness(_cfg({**overrides, "name": f"h{r}"}, out), warmup)
            (b, bc), bl = bare(_cfg({**overrides, "name": f"b{r}"}, out), warmup)
            runs.append({"repeat": r, "harness_tok_s": h, "bare_tok_s": b, "ratio": h / b, "cpu_time_ratio": hc / bc,
                         "max_loss_diff": loss_gap(hl, bl)})
            print(f"[{name}] repeat {r}: harness {h:,.0f} tok/s, bare {b:,.0f} tok/s, ratio {h / b:.3f} "
                  f"(per CPU-second: {hc / bc:.3f}); max |loss diff| {runs[-1]['max_loss_diff']:.2g}", flush=True)
        cfg = _cfg(overrides, out)
    med = {k: statistics.median(r[k] for r in runs)
           for k in ("harness_tok_s", "bare_tok_s", "ratio", "cpu_time_ratio")}
    result = {"section": name, "overrides": overrides, "runs": runs, "median": med}
    if peak:

        fam = get_family(cfg.model.family)
        config = fam.build_config(cfg.model, guess_data_info(cfg), cfg.data.seq_len)
        per_token = step_flops(cfg, fam, config) / (cfg.train.batch_size * cfg.data.seq_len)
        result["mfu"] = {k: med[k] * per_token / peak for k in ("harness_tok_s", "bare_tok_s")}
        result["peak_flops"] = peak
    return result


KNOBS = {
    "fp32, fused AdamW": {"train.optimizer": "fused"},
    "fp32, foreach AdamW": {"train.optimizer": "foreach"},
    "bf16 autocast": {"train.mixed_precision": "bf16"},
    "torch.compile": {"train.compile": True},
    "torch.compile + bf16": {"train.compile": True, "train.mixed_precision": "bf16"},
}


def knobs(steps: int, warmup: int, repeats: int, extra: dict, out: str, config: Path | None = None) -> dict:
    """Each knob variant as its own train.py process, alternating; median tokens/s after ``warmup`` steps."""

    base = {"method.name": "baseline", "train.steps": steps, "train.eval_every": 10**6,
            "train.checkpoint_every": 10**6, "train.progress": False, "train.threads": 2, "train.compile": False,
            **extra}
    runs: dict[str, list[dict]] = {k: [] for k in KNOBS}
    for r in range(repeats):
        for name, over in KNOBS.items():
            args = [f"--{k}={v}" for k, v in {**base, **over, "name": f"{len(runs[name])}-{abs(hash(name))}",
                                              "output_dir": out}.items()]
            recipe = ["--config", str(config)] if config else []
            proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *recipe, *args, "--overwrite"],
                                  capture_output=True, text=True, cwd=ROOT)
            if proc.returncode != 0:
                raise RuntimeError(f"{name}: train.py failed: {proc.stderr[-1500:]}")
            rows = read_metrics(Path(out) / f"{len(runs[name])}-{abs(hash(name))}" / "metrics.jsonl", "train")
            a, b = rows[warmup - 1], rows[-1]
            tok_s = (b["tokens"] - a["tokens"]) / (b["wall"] - a["wall"])
            runs[name].append({"tok_s": tok_s, "compile_s": rows[-1].get("compile_s", 0.0), "loss": b["loss"]})
            print(f"[knobs] repeat {r}: {name}: {tok_s:,.0f} tok/s", flush=True)
    base_tok = statistics.median(x["tok_s"] for x in runs["fp32, fused AdamW"])
    table = [{"setting": name, "tok/s (median)": round(statistics.median(x["tok_s"] for x in rs)),
              "vs fp32 fused": round(statistics.median(x["tok_s"] for x in rs) / base_tok, 3),
              "compile s (first step)": round(statistics.median(x["compile_s"] for x in rs), 1),
              "final loss": round(rs[0]["loss"], 4)} for name, rs in runs.items()]
    return {"section": "knobs", "runs": runs, "table": table}


def main(argv: list[str] | None = None) -> dict:
    """Run the CPU section (and the GPU section when CUDA is there or --gpu); print and save the table."""
    quiet_transformers()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=25, help="steps per run (CPU section)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps at the start of each run")
    ap.add_argument("--repeats", type=int, default=3, help="alternating harness/bare runs (median reported)")
    ap.add_argument("--gpu", action="store_true", help="run the GPU section (default: when CUDA is available)")
    ap.add_argument("--gpu_steps", type=int, default=40)
    ap.add_argument("--gpu_batch", type=int, default=16, help="GPT-2-124M section: sequences of 1024 per step")
    ap.add_argument("--gpu_compile", choices=["no", "yes", "both"], default="both",
                    help="GPU section: eager, torch.compile, or both (each its own process: Accelerate's compile "
                         "setting holds per process)")
    ap.add_argument("--gpu_vocab", type=int, default=50257, help="GPU section: vocabulary (50304: padded to 64)")
    ap.add_argument("--gpu_tiny", action="store_true", help="run the GPU section's code on a tiny shape on the CPU")
    ap.add_argument("--peak_tflops", type=float, default=None, help="GPU peak bf16 TFLOP/s for MFU")
    ap.add_argument("--skip_cpu", action="store_true")
    ap.add_argument("--knobs", action="store_true", help="the throughput settings side by side (one process each)")
    ap.add_argument("--knob_steps", type=int, default=60, help="steps per knobs run (its first --warmup untimed)")
    ap.add_argument("--out", default=str(ROOT / "outputs" / "bench" / "throughput.json"))
    args, rest = ap.parse_known_args(argv)
    counts = ["--steps", "--repeats", "--gpu_steps", "--gpu_batch", "--gpu_vocab", "--knob_steps", "--peak_tflops"]
    check_flags({f: getattr(args, f[2:]) for f in [*counts, "--warmup"]}, at_least_one=counts,
                not_negative=["--warmup"])

    config, extra, _ = parse(rest)  # --config / --dotted.key value for the knobs runs, as with train.py

    out = output_file(Path(args.out).with_name("throughput_knobs.json") if args.knobs else args.out,
                      "python -m bench.speed.throughput")
    results = []
    if args.knobs:

        with tempfile.TemporaryDirectory() as out:
            k = knobs(args.knob_steps, args.warmup, args.repeats, extra, out, config)
        print(format_table(k["table"]))
        atomic_write_json(out, {WRITTEN_BY: "growtrain python -m bench.speed.throughput", **k})
        return k
    if not args.skip_cpu:
        results.append(section("cpu", {"train.steps": args.steps, "train.cpu": True, "train.threads": 2},
                               args.warmup, args.repeats, None))
    if args.gpu or args.gpu_tiny or torch.cuda.is_available():
        for compiled in {"no": [False], "yes": [True], "both": [False, True]}[args.gpu_compile]:
            results.append(_in_own_process(args, compiled))
    lines = ["| section | harness tok/s | bare tok/s | ratio (median) | overhead | ratio per CPU-second "
             "| MFU harness |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        m = r["median"]
        mfu = f"{r['mfu']['harness_tok_s']:.1%}" if "mfu" in r else "-"
        lines.append(f"| {r['section']} | {m['harness_tok_s']:,.0f} | {m['bare_tok_s']:,.0f} | {m['ratio']:.3f} | "
                     f"{1 - m['ratio']:+.1%} | {m['cpu_time_ratio']:.3f} | {mfu} |")
    print("\n".join(lines))
    atomic_write_json(out, {WRITTEN_BY: "growtrain python -m bench.speed.throughput", "results": results,
                            "table": lines})
    print(f"saved {args.out}")
    return {"results": results, "table": lines}


GPT2_124M = {"model.hidden_size": 768, "model.num_layers": 12, "model.num_heads": 12, "data.tokenizer": "gpt2",
             "data.seq_len": 1024, "train.mixed_precision": "bf16", "train.log_every": 10, "train.lr": 6e-4}
TINY = {"model.hidden_size": 64, "model.num_layers": 2, "model.num_heads": 2, "data.seq_len": 64,
        "train.log_every": 2, "train.cpu": True, "train.threads": 1}


def gpu_section(args: argparse.Namespace, compiled: bool) -> dict:
    """GPT-2-124M (or ``--gpu_tiny``'s shape), bf16, eager or compiled: harness vs bare, synced."""
    shape = TINY if args.gpu_tiny else {**GPT2_124M, "model.vocab_size": args.gpu_vocab}
    over = {**shape, "train.batch_size": args.gpu_batch, "train.steps": args.gpu_steps, "train.compile": compiled}
    name = f"{'tiny (CPU)' if args.gpu_tiny else 'gpu gpt2-124m'} {'compiled' if compiled else 'eager'}"
    device = "cpu" if args.gpu_tiny else "cuda"
    return section(name, over, args.warmup, args.repeats, peak_flops(device, args.peak_tflops))


def _in_own_process(args: argparse.Namespace, compiled: bool) -> dict:
    """``gpu_section`` in a child process (Accelerate keeps one compile setting per process); its result."""

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "section.json"
        argv = [sys.executable, "-m", "bench.speed.throughput", "--_section", "compiled" if compiled else "eager",
                "--_section_out", str(out), "--warmup", str(args.warmup), "--repeats", str(args.repeats),
                "--gpu_steps", str(args.gpu_steps), "--gpu_batch", str(args.gpu_batch), "--gpu_vocab",
                str(args.gpu_vocab)] + (["--gpu_tiny"] if args.gpu_tiny else []) + \
            (["--peak_tflops", str(args.peak_tflops)] if args.peak_tflops else [])
        proc = subprocess.run(argv, cwd=ROOT, text=True, stdout=sys.stdout, stderr=subprocess.PIPE)
        if proc.returncode != 0:
            raise RuntimeError(f"the {'compiled' if compiled else 'eager'} section failed:\n{proc.stderr[-3000:]}")
        return json.loads(out.read_text())


def _section_child(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    for flag in ("--_section", "--_section_out", "--peak_tflops"):
        ap.add_argument(flag)
    for flag in ("--warmup", "--repeats", "--gpu_steps", "--gpu_batch", "--gpu_vocab"):
        ap.add_argument(flag, type=int)
    ap.add_argument("--gpu_tiny", action="store_true")
    args = ap.parse_args(argv)
    args.peak_tflops = float(args.peak_tflops) if args.peak_tflops else None
    quiet_transformers()
    atomic_write_json(Path(args._section_out), gpu_section(args, args._section == "compiled"))


if __name__ == "__main__":
    if "--_section" in sys.argv:
        _section_child(sys.argv[1:])
    else:
        raise SystemExit(run_cli(main))  # a user's error is one line (exit 2); --debug shows the traceback
