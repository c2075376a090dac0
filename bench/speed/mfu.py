"""What it takes to raise MFU at GPT-2-124M: one bare training step under each setting, and where a step's device
time goes.

    python -m bench.speed.mfu                  # on a GPU: every setting, then a profile of the first (--budget_s)
    python -m bench.speed.mfu --only compiled,autotune --profile autotune
    python -m bench.speed.mfu --smoke          # the same code, tiny and eager on the CPU (the tests run it)

The harness runs at the bare loop's speed on a GPU (bench.speed.throughput: 0.996x compiled), so what is left
between it and the hardware is the model's step itself. Each setting trains transformers' GPT2LMHeadModel (the
project's GPT-2 and its SDPA attention) on random tokens, in bf16 autocast with the project's AdamW groups and
clipping, for ``--steps`` steps after ``--warmup``
(compilation included in the warm-up), in 4 synchronized windows: a step's time is the median window's mean. MFU =
model FLOPs (progressive.model.flops, as the trainer counts them) per second / the GPU's peak dense bf16 FLOPs
(common.device.PEAK_BF16_TFLOPS, or ``--peak_tflops``).
The profile groups the device's kernels of ``--profile``'s setting into matmuls, attention, fused elementwise
(Triton), the optimizer and the rest, so the next change is aimed at the largest share.
It first says whether this torch, compiling transformers' GPT-2, hands SDPA a materialised causal mask, which rules
out the flash kernel (torch 2.11's dynamo, by its source, folds ``torch.compiler.is_exporting()`` to True, and then
transformers keeps the mask; torch 2.13 does not). Every setting but ``plain_sdpa`` uses the project's attention
(progressive.model.attention), which builds no mask there. No setting starts after ``--budget_s``;
bench/results/mfu.json is written after
every setting, so a run stopped in one keeps the others (``--smoke`` writes outputs/mfu/mfu.json, never into
bench/results/).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from common.cli import check_flags, run_cli
from common.device import Stopwatch, peak_flops, peak_memory_gb
from common.io import atomic_write_json
from common.quiet import quiet_transformers
from progressive.config import TrainConfig
from progressive.model.attention import CAUSAL_SDPA, compiled_sdpa_masks
from progressive.model.flops import model_flops
from progressive.run.accelerator import build_optimizer

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Setting:
    """One way to run the step: batch, torch.compile's mode (None: eager), the AdamW implementation, clipping,
    ``mask``: transformers' own SDPA, which may build the causal mask (False: the project's,
    progressive.model.attention),
    ``regional``: compile each transformer block on its own (the mask and the LM head stay eager)."""

    batch: int = 32
    compile: str | None = "default"
    optimizer: str = "fused"
    clip: bool = True
    mask: bool = False
    regional: bool = False
    what: str = ""


SETTINGS = {  # in the order they run: what the project runs, then the likeliest gains first
    "compiled": Setting(what="the project's settings (compile, fused AdamW, clipping, batch 32)"),
    "plain_sdpa": Setting(mask=True, what="transformers' own SDPA (under compile, torch 2.11 builds a mask: no flash)"),
    "eager": Setting(compile=None, what="no compile"),
    "regional": Setting(regional=True, what="each block compiled on its own; mask creation and LM head eager"),
    "autotune": Setting(compile="max-autotune-no-cudagraphs", what="inductor benchmarks GEMM and Triton configs"),
    "cudagraphs": Setting(compile="reduce-overhead", what="CUDA graphs for forward and backward (AdamW and clipping "
                                                         "stay eager)"),
    "batch64": Setting(batch=64, what="twice the batch"),
    "noclip": Setting(clip=False, what="no gradient clipping (its norm is a full pass over the gradients)"),
    "foreach": Setting(optimizer="foreach", what="foreach AdamW instead of fused"),
    "batch16": Setting(batch=16, what="half the batch"),
}
GPT2_124M = {"n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "vocab_size": 50304}
TINY = {"n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 32, "vocab_size": 128}
WINDOWS = 4  # the timed steps in this many synchronized windows; a step's time is the median window's mean
KERNELS = (("attention", ("flash", "fmha", "attention", "sdpa")),  # tested in order on a kernel's lower-case name
           ("matmul", ("triton_tem_",)),  # inductor's GEMM templates (max-autotune)
           ("fused elementwise (Triton)", ("triton_",)),  # before "mm": fused kernels keep "addmm" in their names
           ("matmul", ("gemm", "cutlass", "cublas", "nvjet", "sm90_xmma", "matmul", "addmm", "mm")),
           ("clipping", ("lpnorm", "norm_kernel")),
           ("optimizer", ("adam", "multi_tensor", "foreach")))


@dataclass
class Lab:
    """One run of the lab: the shape, the device, and what was measured so far."""

    shape: dict[str, int]
    device: torch.device
    steps: int
    warmup: int
    seq: int
    peak: float | None
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def build(self, s: Setting) -> tuple[Callable[[torch.Tensor], torch.Tensor], torch.optim.Optimizer,
                                         torch.nn.Module]:
        """(a training step on a batch of token ids -> loss, its optimizer, the model), fresh from seed 0."""
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        config = GPT2Config(**self.shape, n_inner=4 * self.shape["n_embd"], resid_pdrop=0.0, embd_pdrop=0.0,
                            attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                            attn_implementation="sdpa" if s.mask else CAUSAL_SDPA)
        model = GPT2LMHeadModel(config).to(self.device)
        opt = build_optimizer(model, TrainConfig(optimizer=s.optimizer), 6e-4, self.device)
        mode = None if s.compile == "default" else s.compile
        forward = model
        if s.compile and s.regional:
            for block in model.transformer.h:
                block.compile(mode=mode)
        elif s.compile:
            forward = torch.compile(model, mode=mode)
        amp = (torch.autocast(self.device.type, dtype=torch.bfloat16) if self.device.type == "cuda"
               else contextlib.nullcontext())

        def step(ids: torch.Tensor) -> torch.Tensor:
            with amp:
                loss = forward(input_ids=ids, labels=ids).loss
            loss.backward()
            if s.clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        return step, opt, model

    def batches(self, s: Setting, n: int) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(1)
        return [torch.randint(0, self.shape["vocab_size"], (s.batch, self.seq), generator=g).to(self.device)
                for _ in range(n)]

    def measure(self, s: Setting) -> dict[str, Any]:
        """Tokens/s and MFU of ``s`` over ``steps`` steps after ``warmup`` (compilation is in the warm-up)."""

        torch._dynamo.reset()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        step, _, model = self.build(s)
        data = self.batches(s, self.warmup + self.steps)
        clock = Stopwatch(self.device)
        for ids in data[:self.warmup]:
            loss = step(ids)
        warm_s = clock.lap()
        laps, timed = [], data[self.warmup:]
        n = min(WINDOWS, len(timed))
        for w in range(n):  # a sync per window, not per step: the host queues the next step as the harness does
            chunk = timed[w * len(timed) // n:(w + 1) * len(timed) // n]
            for ids in chunk:
                loss = step(ids)
            laps.append(clock.lap() / len(chunk))
        sec = statistics.median(laps)
        tokens = s.batch * self.seq
        flops = model_flops(model.config, s.batch, self.seq)
        out = {"setting": s.what, "batch": s.batch, "compile": s.compile, "optimizer": s.optimizer, "clip": s.clip,
               "step_ms": round(1e3 * sec, 3), "tok_s": round(tokens / sec), "tflops": round(flops / sec / 1e12, 1),
               "mfu": round(flops / sec / self.peak, 4) if self.peak else None, "warmup_s": round(warm_s, 1),
               "mem_gb": round(peak_memory_gb(self.device), 2), "loss": round(float(loss), 4)}
        del step, model
        return out

    def profile(self, s: Setting) -> dict[str, Any]:
        """Device time of a few steps of ``s`` by kind of kernel (share of the total), and the top kernels."""
        from torch.profiler import ProfilerActivity, profile

        torch._dynamo.reset()
        step, _, _ = self.build(s)
        data = self.batches(s, self.warmup + 3)
        for ids in data[:self.warmup]:
            step(ids)
        gpu = self.device.type == "cuda"
        acts = [ProfilerActivity.CUDA] if gpu else [ProfilerActivity.CPU]
        with profile(activities=acts) as prof:
            for ids in data[self.warmup:]:
                step(ids)
            Stopwatch(self.device).lap()
        times: dict[str, float] = {}  # kernels on a GPU (not the CPU ops that launched them: counted twice)
        for e in prof.key_averages():
            t = e.self_device_time_total if gpu else e.self_cpu_time_total
            if t > 0 and e.device_type.name == ("CUDA" if gpu else "CPU"):
                times[e.key] = times.get(e.key, 0.0) + t
        total = sum(times.values()) or 1.0
        shares = dict.fromkeys([k for k, _ in KERNELS] + ["other"], 0.0)
        for name, t in times.items():
            shares[_kind(name)] += t / total
        top = sorted(times.items(), key=lambda kv: -kv[1])[:12]
        attention = sorted({n for n in times if _kind(n) == "attention"})
        return {"shares": {k: round(v, 4) for k, v in shares.items()},
                "attention_kernels": [n[:120] for n in attention],  # flash, or a masked (efficient / math) kernel
                "top": [{"kernel": k[:120], "share": round(t / total, 4)} for k, t in top],
                "device_ms_per_step": round(total / 1e3 / len(data[self.warmup:]), 3)}


def mask_under_compile() -> bool:
    """Whether transformers' GPT-2, compiled by this torch, passes SDPA a materialised mask (no flash kernel) rather
    than ``is_causal=True``: traced on a tiny model on the CPU, a few seconds."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(**TINY, bos_token_id=0, eos_token_id=0))
    return any(compiled_sdpa_masks(model, torch.zeros(1, 8, dtype=torch.long))[1])


def _kind(kernel: str) -> str:
    low = kernel.lower()
    return next((k for k, keys in KERNELS if any(x in low for x in keys)), "other")


def _smoke(s: Setting) -> Setting:
    """``s`` for --smoke: an eighth of the batch, eager (inductor on a CPU compiles C++ for minutes)."""
    return replace(s, batch=max(1, s.batch // 8), compile=None, regional=False,
                   what=s.what + " (smoke: eager, batch / 8)")


def _out_path(out: str | None, smoke: bool) -> Path:
    """Where the results go: ``out``, else bench/results/mfu.json, or for --smoke a work folder's file. A smoke
    run's CPU figures never land in bench/results/ (the README's numbers come from there).

    Raises:
        ValueError: --smoke with an ``out`` inside bench/results/.
    """
    results = ROOT / "bench" / "results"
    if out is None:
        return ROOT / "outputs" / "mfu" / "mfu.json" if smoke else results / "mfu.json"
    path = Path(out)
    if smoke and path.resolve().is_relative_to(results.resolve()):
        raise ValueError(f"--out {out}: --smoke measures nothing and writes no file into {results}; "
                         "leave --out out (outputs/mfu/mfu.json) or name a folder outside it")
    return path


def main(argv: list[str] | None = None) -> dict[str, Any]:

    quiet_transformers()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None, help=f"comma list of settings: {', '.join(SETTINGS)} (default: all)")
    ap.add_argument("--profile", default="compiled", help="the setting to profile ('none': no profile)")
    ap.add_argument("--steps", type=int, default=20, help=f"timed steps per setting, in {WINDOWS} synchronized windows")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    ap.add_argument("--budget_s", type=float, default=420, help="start no setting after this many seconds")
    ap.add_argument("--peak_tflops", type=float, default=None, help="the GPU's peak bf16 TFLOP/s (default: table)")
    ap.add_argument("--smoke", action="store_true", help="tiny, eager, on the CPU: the code path, not a measurement")
    ap.add_argument("--out", default=None, help="the results file (default bench/results/mfu.json; --smoke: "
                    "outputs/mfu/mfu.json, never bench/results/)")
    args = ap.parse_args(argv)
    check_flags({"--steps": args.steps, "--warmup": args.warmup, "--budget_s": args.budget_s,
                 "--peak_tflops": args.peak_tflops}, at_least_one=["--steps", "--peak_tflops"],
                not_negative=["--warmup", "--budget_s"])
    args.out = _out_path(args.out, args.smoke)
    names = [n for n in (args.only or ",".join(SETTINGS)).split(",") if n]
    unknown = [n for n in names + ([args.profile] if args.profile != "none" else []) if n not in SETTINGS]
    if unknown:
        raise ValueError(f"unknown setting(s) {', '.join(unknown)}: choose from {', '.join(SETTINGS)}")
    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda and not args.smoke:
        raise ValueError("bench.speed.mfu needs a CUDA GPU (--smoke runs its code on the CPU)")
    dev = torch.device("cuda" if cuda else "cpu")
    lab = Lab(TINY if args.smoke else GPT2_124M, dev, args.steps, args.warmup, 32 if args.smoke else 1024,
              peak_flops(dev, args.peak_tflops))
    env = {"device": torch.cuda.get_device_name(dev) if cuda else "cpu (smoke)", "torch": torch.__version__,
           "peak_tflops": lab.peak / 1e12 if lab.peak else None, "shape": lab.shape, "seq_len": lab.seq,
           "steps": args.steps, "warmup": args.warmup, "date": time.strftime("%Y-%m-%d"),
           "sdpa_mask_under_compile": mask_under_compile()}
    print(f"{env['device']}, torch {torch.__version__}: compiled GPT-2 gives SDPA "
          f"{'a materialised mask (no flash kernel)' if env['sdpa_mask_under_compile'] else 'is_causal=True'}")
    out: dict[str, Any] = {"written_by": "python -m bench.speed.mfu", "environment": env, "settings": lab.results}
    t0 = time.monotonic()
    for name in names:
        if time.monotonic() - t0 > args.budget_s:
            lab.results[name] = {"skipped": f"--budget_s {args.budget_s:.0f} s spent"}
            continue
        try:
            lab.results[name] = lab.measure(_smoke(SETTINGS[name]) if args.smoke else SETTINGS[name])
        except Exception as e:  # one setting's failure (out of memory, a compile error) is a result, not the end
            lab.results[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        r = lab.results[name]
        print(f"{name:>11}: " + (f"{r['step_ms']:8.2f} ms/step  {r['tok_s']:>9,} tok/s  "
                                 f"MFU {r['mfu'] if r['mfu'] is None else format(r['mfu'], '.1%')}  "
                                 f"(warm-up {r['warmup_s']} s, {r['mem_gb']} GB)" if "tok_s" in r else str(r)),
              flush=True)
        atomic_write_json(args.out, out)
    if args.profile != "none" and time.monotonic() - t0 <= args.budget_s:
        s = SETTINGS[args.profile]
        try:
            out["profile"] = {"setting": args.profile, **lab.profile(_smoke(s) if args.smoke else s)}
            for k, v in out["profile"]["shares"].items():
                print(f"  {k:>28}: {v:.1%}")
            print("  attention kernels: " + ", ".join(out["profile"]["attention_kernels"]))
        except Exception as e:  # as for a setting: the failure is the result
            out["profile"] = {"setting": args.profile, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        atomic_write_json(args.out, out)
    print(f"saved {args.out}")
    return out


if __name__ == "__main__":
    raise SystemExit(run_cli(main))  # a user's error is one line (exit 2); --debug shows the traceback
