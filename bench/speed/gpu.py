"""The prepared GPU check: what only a GPU shows, in one command that fits in 9 minutes on one H100/H200.

    python -m bench.speed.gpu              # on a GPU machine: bench/results/gpu.json (python -m bench.pages: its page)
    python -m bench.speed.gpu --smoke      # the same checks, tiny and on the CPU (tests/unit/bench/test_gpu_check.py)
    python -m bench.speed.gpu --suite full # also every correctness check (below): more than 9 minutes

The default suite measures what decides whether the V-cycle's FLOPs saving becomes a wall-clock saving, alone on
the GPU, one after the other, its results written after each (a check the time limit cuts off leaves the others'):

1. ``anchor``: the physical anchor, a bare compiled nanoGPT-style loop (bench/speed/anchor.py) at GPT-2-124M's
   full shape (12 x 768) and its V-cycle's coarse level (6 x 384), 32 x 1024 tokens, bf16, with nanoGPT's loss and
   with this project's chunked one: what the device does at each shape with nothing of ours in the way;
2. ``compare_124m``: ``--compare baseline,vcycle`` at GPT-2-124M (480 steps of 32 x 1024), compiled (the GPU
   default), each level's model TFLOP/s without the steps that compiled, the run's FLOPs-weighted MFU, and the
   FLOPs and the compile-free wall-clock saved;
3. ``compare_350m``: the same at GPT-2-350M (24 x 1024, 480 steps of 16 x 1024), where the coarse level is wider.

``--suite full`` (or ``--only`` naming them) adds the correctness checks: alone, the README's run (``python
train.py``'s V-cycle, the reference of the identity checks) and the harness against a bare loop of the same
transformers model (``throughput``, bench/speed/throughput.py); then side by side, ``--jobs`` at a time on the one
GPU: SIGTERM then ``--resume`` (the final loss must equal the README run's, bit for bit), ``accelerate launch`` with
launch/accelerate/1gpu.yaml (equal too) and fsdp.yaml (level changes, stopped and resumed), the eager V-cycle
through its level changes, every recipe in configs/ at full length, and the eval CLIs on the checkpoints they
trained; last, ``compare_eager_124m`` (the comparison with ``--train.compile false``).

The GPU image may hold only torch, accelerate, transformers and their own needs, with no network: the check
names what is missing in one line. Nothing here needs datasets, lm-eval or wandb.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.cli import check_flags, comma_list, run_cli
from common.device import peak_flops
from common.io import atomic_write_json
from progressive.run.faults import SIGNAL_ENV

ROOT = Path(__file__).resolve().parents[2]
NEEDED = {"torch": "torch", "accelerate": "accelerate", "transformers": "transformers", "tokenizers": "tokenizers",
          "safetensors": "safetensors", "numpy": "numpy", "yaml": "PyYAML", "PIL": "pillow", "tqdm": "tqdm",
          "matplotlib": "matplotlib"}
GPT2_124M = ["--model.family", "gpt2", "--model.hidden_size", "768", "--model.num_layers", "12", "--model.num_heads",
             "12", "--model.dropout", "0.0", "--data.tokenizer", "gpt2", "--data.seq_len", "1024",
             "--train.mixed_precision", "bf16", "--train.lr", "6e-4", "--train.log_every", "10"]
# GPT-2-350M ("medium"): its coarse level (12 x 512) is wider than 124M's (6 x 384)
GPT2_350M = [*GPT2_124M[:2], "--model.hidden_size", "1024", "--model.num_layers", "24", "--model.num_heads", "16",
             *GPT2_124M[8:-4], "--train.lr", "3e-4", "--train.log_every", "10"]
COMPARES = {"124m": (GPT2_124M, 32), "350m": (GPT2_350M, 16)}  # (shape, batch of 1,024 tokens)
# --smoke: every command on the CPU, a few steps, small data, no figures (drawing one costs a run seconds)
SMOKE = ["--train.cpu", "true", "--train.threads", "1", "--train.steps", "12", "--train.eval_every", "6",
         "--train.eval_batches", "1", "--train.checkpoint_every", "6", "--train.plots", "false"]
# --smoke's shape for the default recipe and the 124M comparison: process start-up, not steps, is what is left
SMOKE_124M = ["--model.hidden_size", "32", "--model.num_layers", "2", "--model.num_heads", "2", "--data.seq_len", "32"]
SMOKE_STEPS = {"apollo": "40"}  # recipes whose stages need more than SMOKE's steps
STOP_AT = {False: 400, True: 16}  # the default V-cycle's step to stop at: after both level changes (GPU: 30, 330)
DECIDE = ("anchor", "compare_124m", "compare_350m")  # the default suite; the others with --suite full or --only
RECIPES_AFTER = {"autofreeze_sst2": "bert_mlm", "autofreeze_cifar10": "deit_cifar10"}  # init_from another's final/


@dataclass
class Check:
    """The state of one check run: where its runs go, its command lines' extras, its deadline."""

    smoke: bool
    out: Path
    deadline: float
    jobs: int
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)
    ran: str = ""  # when and under what (``_ran``), recorded with every result
    compare_steps: int = 480  # the baseline's steps in the comparisons

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def env(self) -> dict[str, str]:
        return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1", **self.extra_env}

    def run(self, name: str, argv: list[str], env: dict[str, str] | None = None, ok: tuple[int, ...] = (0,),
            timeout: float = 420) -> subprocess.CompletedProcess:
        """Run ``argv`` in the repository, its output kept in <out>/logs/<name>.log; raises on another exit code."""
        logs = self.out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        limit = min(timeout, self.left())
        if limit < 5:
            raise TimeoutError("not run: the check's time budget is spent")
        try:
            proc = subprocess.run(argv, cwd=ROOT, env={**self.env(), **(env or {})}, capture_output=True, text=True,
                                  timeout=limit)
        except subprocess.TimeoutExpired as e:
            (logs / f"{name}.log").write_text(f"$ {' '.join(argv)}\n[timed out after {limit:.0f} s]\n"
                                              f"{_text(e.stdout)}\n{_text(e.stderr)}")
            raise TimeoutError(f"{name}: cut off after {limit:.0f} s (the check's time budget)") from None
        (logs / f"{name}.log").write_text(f"$ {' '.join(argv)}\n[exit {proc.returncode}]\n{proc.stdout}\n{proc.stderr}")
        if proc.returncode not in ok:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
            raise RuntimeError(f"{name}: exit {proc.returncode}: {tail}")
        return proc

    def train(self, name: str, *extra: str, config: str | None = None, launcher: list[str] | None = None,
              env: dict[str, str] | None = None, ok: tuple[int, ...] = (0,),
              fresh: bool = True) -> subprocess.CompletedProcess:
        """``train.py`` (under ``launcher`` if given) writing <out>/<name>; --smoke adds its CPU settings."""
        argv = (launcher or [sys.executable]) + ["train.py"] + (["--config", config] if config else []) + \
            ["--name", name, "--output_dir", str(self.out), "--train.progress", "false",
             "--train.with_baseline", "false"] + \
            (["--overwrite"] if fresh else ["--resume"]) + (SMOKE if self.smoke else []) + \
            (SMOKE_124M if self.smoke and config is None else []) + list(extra)  # the default recipe, smaller
        return self.run(name if fresh else f"{name}-resume", argv, env=env, ok=ok)


def _text(x: Any) -> str:
    return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")


def summary(c: Check, name: str) -> dict[str, Any]:
    """A finished run's summary.json plus its throughput (medians over its train rows after the first)."""
    s = json.loads((c.out / name / "summary.json").read_text())
    rows = [json.loads(line) for line in (c.out / name / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"][1:]
    out = {k: s[k] for k in ("final_val_loss", "train_wall_s", "steps", "flops") if k in s}
    for key in ("tok_s", "mfu", "tflops", "mem_gb", "batch_ms", "wait_ms"):
        vals = sorted(r[key] for r in train if r.get(key) is not None)
        if vals:
            out[f"{key}_median"] = vals[len(vals) // 2]
    # each phase's model TFLOP/s without its compiling steps (progressive.run.summary.phase_rows): where a V-cycle's
    # wall saving falls short of its FLOPs saving, this says which level runs the device below the full model's rate
    out["phases"] = [{"phase": p["phase"], "shape": p["shape"], "tflops": p.get("tflops")} for p in s.get("phases", [])]
    last = train[-1] if train else {}
    rate, peak = (_rate(last) if last else None), _peak()
    if last.get("compile_s") is not None:
        out["compile_s"] = last["compile_s"]
    if rate and peak:
        out["mfu_run"] = round(rate * 1e12 / peak, 4)  # FLOPs-weighted over the run (a median of rows is not)
    out["transitions_s"] = [t["seconds"] for t in s.get("transitions", [])]
    if any("operators_s" in t for t in s.get("transitions", [])):
        out["transitions_operators_s"] = [t.get("operators_s") for t in s["transitions"]]
        out["transitions_rebuild_s"] = [t.get("rebuild_s") for t in s["transitions"]]
    return out


def _peak() -> float | None:
    """This GPU's peak dense bf16 FLOP/s (common.device), None on a CPU."""
    import torch

    return peak_flops("cuda") if torch.cuda.is_available() else None


def same(a: float, b: float) -> dict[str, Any]:
    return {"identical": a == b, "diff": abs(a - b)}


# ----------------------------------------------------------------------------------------------- the checks

def check_readme_run(c: Check) -> dict[str, Any]:
    t0 = time.monotonic()
    proc = c.train("default")
    precision = next((line.split("precision: ", 1)[1] for line in proc.stderr.splitlines()
                      if "precision: " in line), None)
    return {**summary(c, "default"), "total_s": round(time.monotonic() - t0, 1), "precision": precision}


def check_sigterm_resume(c: Check) -> dict[str, Any]:

    stop = STOP_AT[c.smoke]
    proc = c.train("sigterm", env={SIGNAL_ENV: f"{stop}:SIGTERM"}, ok=(75,))
    c.train("sigterm", fresh=False)
    ref = c.results["readme_run"]["final_val_loss"]
    got = summary(c, "sigterm")["final_val_loss"]
    return {"stopped_exit": proc.returncode, "stopped_at_step": stop, "final_val_loss": got, **same(got, ref),
            "ok": got == ref}


def _accelerate(config: str, smoke: bool, processes: int = 1) -> list[str]:
    extra = ["--cpu", "--mixed_precision", "no"] if smoke else []
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", f"launch/accelerate/{config}",
            "--num_processes", str(processes), *extra]


def check_accelerate_1gpu(c: Check) -> dict[str, Any]:
    c.train("accelerate-1gpu", launcher=_accelerate("1gpu.yaml", c.smoke))
    got, ref = summary(c, "accelerate-1gpu")["final_val_loss"], c.results["readme_run"]["final_val_loss"]
    return {"final_val_loss": got, **same(got, ref), "ok": got == ref}


def check_accelerate_fsdp(c: Check) -> dict[str, Any]:
    if c.smoke:
        return {"skipped": "needs a GPU: Accelerate applies its FSDP plugin on GPUs only "
                           "(tests/unit/run/test_fsdp.py covers the plugin and the sharded path on CPU)"}

    launcher = _accelerate("fsdp.yaml", False)
    c.train("fsdp", launcher=launcher)
    full = summary(c, "fsdp")
    # torchrun (under accelerate launch) reports a worker's exit 75 as its own exit 1: the checkpoint tells
    stopped = c.train("fsdp-stopped", launcher=launcher, env={SIGNAL_ENV: f"{STOP_AT[False]}:SIGTERM"}, ok=(75, 1))
    worker_stopped = stopped.returncode == 75 or "exitcode  : 75" in stopped.stderr + stopped.stdout
    if not worker_stopped or (c.out / "fsdp-stopped" / "summary.json").exists():
        raise RuntimeError(f"fsdp-stopped: exit {stopped.returncode} without the worker's stop (75)")
    c.train("fsdp-stopped", launcher=launcher, fresh=False)
    resumed = summary(c, "fsdp-stopped")
    ref = c.results["readme_run"]["final_val_loss"]
    return {"final_val_loss": full["final_val_loss"], "level_changes": len(full["transitions_s"]),
            "level_change_s": full["transitions_s"], "stopped_launcher_exit": stopped.returncode,
            "resumed_final_val_loss": resumed["final_val_loss"],
            "resume": same(resumed["final_val_loss"], full["final_val_loss"]),
            "vs_readme_run": same(full["final_val_loss"], ref), "tok_s_median": full.get("tok_s_median"),
            "ok": resumed["final_val_loss"] == full["final_val_loss"] and len(full["transitions_s"]) == 2}


def check_compile_levels(c: Check) -> dict[str, Any]:
    if c.smoke:
        return {"skipped": "compiling on the CPU takes minutes (tests/unit/model/test_compile.py covers compile "
                           "through level changes on CPU)"}
    c.train("compiled", "--train.compile", "true")
    s = json.loads((c.out / "compiled" / "summary.json").read_text())
    rows = [json.loads(line) for line in (c.out / "compiled" / "metrics.jsonl").read_text().splitlines()]
    got, ref = s["final_val_loss"], c.results["readme_run"]["final_val_loss"]
    return {"final_val_loss": got, "vs_eager": same(got, ref), "train_wall_s": s["train_wall_s"],
            "compile_s": rows[-1].get("compile_s"), "level_changes": len(s.get("transitions", [])),
            "tok_s_median": summary(c, "compiled").get("tok_s_median"),
            # compiled kernels round differently from eager ones in bf16: the loss is not expected to match
            "ok": len(s.get("transitions", [])) == 2 and got == got and abs(got - ref) < 0.2}


def recipe_names() -> list[str]:
    """Every recipe in configs/ but the README's (run above) and the tests' own."""
    return sorted(p.stem for p in (ROOT / "configs").glob("*.yaml") if p.stem not in ("default", "tiny_test"))


def check_recipe(c: Check, name: str) -> dict[str, Any]:
    extra: list[str] = []
    if name in RECIPES_AFTER:
        extra += ["--model.init_from", str(c.out / f"recipe-{RECIPES_AFTER[name]}" / "final")]
    if c.smoke and "cifar10" in name:
        extra += ["--data.max_images", "256"]
    if c.smoke and name in SMOKE_STEPS:
        extra += ["--train.steps", SMOKE_STEPS[name]]
    launcher = None
    if name == "elastic_vit_tiny":  # the elastic pipeline: 4 CPU processes (gloo), as the recipe says
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4"]
    c.train(f"recipe-{name}", *extra, config=f"configs/{name}.yaml", launcher=launcher)
    return summary(c, f"recipe-{name}")


def check_eval(c: Check, name: str) -> dict[str, Any]:
    out = c.out / f"eval-{name}.json"
    if name == "zeroshot":
        argv = [sys.executable, "-m", "eval.zeroshot", str(c.out / "default" / "final"), "--output", str(out),
                "--limit", "200" if c.smoke else "30000",  # words of each task: ~500 LAMBADA passages
                "--tasks", "lambada,ptb"] + (["--cpu"] if c.smoke else [])
        # (WikiText's detokenizer is lm-evaluation-harness's own, which the GPU image does not have)
    elif name == "glue":
        argv = [sys.executable, "-m", "eval.glue", "--checkpoint", str(c.out / "recipe-bert_mlm" / "final"),
                "--tasks", "sst2,rte", "--quick", "--output", str(out)] + \
            (["--cpu", "--max_train_samples", "64", "--max_eval_samples", "32"] if c.smoke else [])
    else:
        argv = [sys.executable, "-m", "eval.deit_transfer",
                "--checkpoint", str(c.out / "recipe-deit_cifar10" / "final"), "--quick", "--output", str(out)] + \
            (["--cpu", "--max_train_samples", "64", "--max_eval_samples", "32"] if c.smoke else [])
    c.run(f"eval-{name}", argv)
    got = json.loads(out.read_text())
    if name == "zeroshot":
        return {task: {k: v for k, v in r.items() if isinstance(v, (int, float))} for task, r in got["results"].items()}
    if name == "glue":
        return {task: r["mean"] for task, r in got["tasks"].items()}
    return {"top1": got["top1"], "n_train": got["n_train"], "n_eval": got["n_eval"]}


def check_throughput(c: Check) -> dict[str, Any]:
    out = c.out / "throughput.json"
    argv = [sys.executable, "-m", "bench.speed.throughput", "--skip_cpu", "--repeats", "1", "--gpu_compile", "both",
            "--out", str(out)]
    argv += ["--gpu_tiny", "--gpu_steps", "8", "--warmup", "2", "--gpu_batch", "4", "--gpu_compile", "no"] if c.smoke \
        else ["--gpu", "--gpu_steps", "30", "--warmup", "10", "--gpu_batch", "32", "--gpu_vocab", "50304"]
    c.run("throughput", argv)
    rows = json.loads(out.read_text())["results"]
    return {r["section"]: {**{k: round(v, 4) for k, v in r["median"].items()},
                           "mfu_harness": r.get("mfu", {}).get("harness_tok_s"),
                           "mfu_bare": r.get("mfu", {}).get("bare_tok_s"),
                           "max_loss_diff": max(x["max_loss_diff"] for x in r["runs"])} for r in rows}


def check_anchor(c: Check) -> dict[str, Any]:
    """The bare compiled nanoGPT-style loop at the full and the coarse shape of GPT-2-124M (bench/speed/anchor.py)."""
    out = c.out / "anchor.json"
    argv = [sys.executable, "-m", "bench.speed.anchor", "--out", str(out), "--warmup", "3", "--steps", "12"] + \
        (["--smoke"] if c.smoke else [])
    c.run("anchor", argv)
    return {f"{r['shape']} {r['loss_fn']}": {k: v for k, v in r.items() if k not in ("shape", "loss_fn")}
            for r in json.loads(out.read_text())["rows"]}


def _rate(last: dict[str, Any]) -> float | None:
    """A run's model TFLOP/s per device over all its training steps but those that compiled (its last train row)."""
    seconds = last["wall"] - last.get("compile_s", 0.0)
    flops = last["flops"] - last.get("compile_flops", 0)
    return flops / seconds / 1e12 if seconds > 0 else None


def check_compare(c: Check, size: str, eager: bool = False) -> dict[str, Any]:
    """``--compare baseline,vcycle`` at GPT-2-``size``: FLOPs and wall-clock saved (compile-free first, where it
    compiled), each level's TFLOP/s without its compiling steps, the coarse level's rate over the full model's,
    FLOPs-weighted MFU, the level changes' seconds. ``eager``: with ``--train.compile false``."""
    name = f"compare-{size}" + ("-eager" if eager else "")
    shape, batch = COMPARES[size]
    shape = SMOKE_124M if c.smoke else shape + ["--model.vocab_size", "50304", "--train.batch_size", str(batch),
                                                "--train.steps", str(c.compare_steps), "--train.eval_every", "20",
                                                "--train.checkpoint_every", "1000"]
    c.run(name, [sys.executable, "train.py", "--compare", "baseline,vcycle", "--name", name,
                 "--output_dir", str(c.out), "--overwrite", "--train.progress", "false"]
          + (SMOKE if c.smoke else []) + shape + (["--train.compile", "false"] if eager else []))
    table = json.loads((c.out / name / "compare.json").read_text())["results"]
    vc, base = summary(c, f"{name}/vcycle"), summary(c, f"{name}/baseline")
    rows = {r["method"]: r for r in table}
    levels = {p["phase"]: p["tflops"] for p in vc["phases"]}
    full = base["phases"][0]["tflops"]
    coarse = min((v for v in levels.values() if v), default=None)
    out = {"table": table, "level_change_s": vc["transitions_s"],
           "level_change_operators_s": vc.get("transitions_operators_s"),
           "level_change_rebuild_s": vc.get("transitions_rebuild_s"),
           "baseline_tflops": full, "vcycle_level_tflops": levels,
           "coarse_over_full": round(coarse / full, 3) if coarse and full else None,
           "baseline_mfu": base.get("mfu_run"), "vcycle_mfu": vc.get("mfu_run"),
           "compile_s": {"baseline": base.get("compile_s"), "vcycle": vc.get("compile_s")},
           "flops_saved_%": rows["vcycle"]["flops_saved_%"]}
    if "wall_saved_excl_compile_%" in rows["vcycle"]:
        out["wall_saved_excl_compile_%"] = rows["vcycle"]["wall_saved_excl_compile_%"]
    out["wall_saved_%"] = rows["vcycle"]["wall_saved_%"]
    return out


# ----------------------------------------------------------------------------------------------- the driver

def environment() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0)
                            if torch.cuda.is_available() else f"CPU ({platform.processor() or platform.machine()})"}
    for mod in ("accelerate", "transformers", "tokenizers", "numpy"):
        info[mod] = __import__(mod).__version__
    return info


def missing_packages() -> list[str]:
    return [pip for mod, pip in NEEDED.items() if importlib.util.find_spec(mod) is None]


def plan(c: Check) -> list[tuple[str, list[tuple[str, Callable[[], dict]]]]]:
    """The stages: (how they run, [(check name, thunk)]). Chained recipes run in one task, in order."""
    chains: dict[str, list[str]] = {}
    for name in recipe_names():  # a recipe that starts from another's checkpoint runs after it, in its task
        head = RECIPES_AFTER.get(name, name)
        chains.setdefault(head, [head])
        if name != head:
            chains[head].append(name)
    evals_after = {"bert_mlm": "glue", "deit_cifar10": "deit_transfer"}

    def chain(names: list[str]) -> Callable[[], dict]:
        def go() -> dict:
            out = {}
            for n in names:
                out[f"recipe:{n}"] = _guarded(c, f"recipe:{n}", lambda n=n: check_recipe(c, n))
                if n in evals_after and out[f"recipe:{n}"].get("ok", True):
                    e = evals_after[n]
                    out[f"eval:{e}"] = _guarded(c, f"eval:{e}", lambda e=e: check_eval(c, e))
            return out
        return go

    side = [("sigterm_resume", lambda: check_sigterm_resume(c)), ("accelerate_1gpu", lambda: check_accelerate_1gpu(c)),
            ("accelerate_fsdp", lambda: check_accelerate_fsdp(c)), ("compile_levels", lambda: check_compile_levels(c)),
            ("eval:zeroshot", lambda: check_eval(c, "zeroshot"))]
    side += [(f"chain:{head}", chain(names)) for head, names in chains.items()]
    return [("alone", [("anchor", lambda: check_anchor(c)), ("compare_124m", lambda: check_compare(c, "124m")),
                       ("compare_350m", lambda: check_compare(c, "350m"))]),
            ("alone", [("readme_run", lambda: check_readme_run(c)), ("throughput", lambda: check_throughput(c))]),
            ("side by side", side),
            ("alone", [("compare_eager_124m", lambda: check_compare(c, "124m", eager=True))])]


def selected(name: str, only: list[str], suite: str = "decide") -> bool:
    """Whether check ``name`` runs: it starts with a prefix in ``only``; with no ``only``, it is in the suite (the
    default one: ``DECIDE``; "full": every check)."""
    if only:
        return any(name.startswith(o) for o in only)
    return suite == "full" or name in DECIDE


def _guarded(c: Check, name: str, fn: Callable[[], dict]) -> dict[str, Any]:
    """Run one check; its result (``ok`` false with the error when it raised), recorded and written at once."""
    t0 = time.monotonic()
    try:
        res = fn()
        res = {"ok": None if "skipped" in res else res.pop("ok", True), **res}
    except Exception as e:
        res = {"ok": False, "error": str(e)[-2000:]}
    res["seconds"] = round(time.monotonic() - t0, 1)
    res["ran"] = c.ran
    if not name.startswith("chain:"):
        c.results[name] = res
        print(f"[bench.speed.gpu] {name}: {'ok' if res['ok'] else 'skipped' if res['ok'] is None else 'FAILED'} "
              f"({res['seconds']} s)", flush=True)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="every check tiny, on the CPU (the test suite runs it)")
    ap.add_argument("--budget_s", type=float, default=560.0, help="stop starting work after this many seconds")
    ap.add_argument("--suite", choices=["decide", "full"], default="decide",
                    help="decide: the anchor and the two comparisons (9 minutes); full: also the correctness checks")
    ap.add_argument("--jobs", type=int, default=6, help="stage 3: checks at a time on the one GPU")
    ap.add_argument("--only", default=None, help="comma list of name prefixes of the checks to run: anchor, "
                    "compare_124m, compare_350m, readme_run, throughput, sigterm_resume, accelerate_1gpu, "
                    "accelerate_fsdp, compile_levels, eval:zeroshot, chain:<recipe> (a recipe and what needs its "
                    "checkpoint), compare_eager_124m")
    ap.add_argument("--compare_steps", type=int, default=480, help="the comparisons: the baseline's steps; the "
                    "V-cycle spends the same FLOPs (at 160 the 124M V-cycle did not reach the baseline's loss)")
    ap.add_argument("--workdir", default=str(ROOT / "outputs" / "gpu"), help="where the runs go")
    ap.add_argument("--results", default=None, help="gpu.json (default bench/results/gpu.json; --smoke: in --workdir)")
    args = ap.parse_args(argv)
    check_flags({"--budget_s": args.budget_s, "--jobs": args.jobs, "--compare_steps": args.compare_steps},
                at_least_one=["--jobs", "--compare_steps"], not_negative=["--budget_s"])
    missing = missing_packages()
    if missing:
        print(f"bench.speed.gpu: missing Python packages: {', '.join(missing)} (pip install {' '.join(missing)})",
              file=sys.stderr)
        return 2
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("bench.speed.gpu: no CUDA device here; run it on a GPU machine, or --smoke on a CPU", file=sys.stderr)
        return 2
    work = Path(args.workdir)
    results = Path(args.results) if args.results else (
        work / "gpu.json" if args.smoke else ROOT / "bench/results/gpu.json")
    c = Check(smoke=args.smoke, out=work, deadline=time.monotonic() + args.budget_s, jobs=args.jobs,
              compare_steps=args.compare_steps)
    try:  # an empty list read as not given ran the whole suite; a prefix that names no check ran nothing
        only = comma_list("--only", args.only) if args.only is not None else []
    except ValueError as e:
        print(f"bench.speed.gpu: {e}", file=sys.stderr)
        return 2
    names = sorted(n for _, checks in plan(c) for n, _ in checks)
    unknown = [o for o in only if not any(n.startswith(o) for n in names)]
    if unknown:
        print(f"bench.speed.gpu: --only {','.join(unknown)}: no check's name starts so; the checks: {', '.join(names)}",
              file=sys.stderr)
        return 2
    env = environment()
    started = time.strftime("%Y-%m-%d")
    known = set(names) | {f"recipe:{r}" for r in recipe_names()} | \
        {"eval:glue", "eval:deit_transfer"}
    if results.is_file() and (only or args.suite != "full"):  # checks not run now keep their results, each
        before = json.loads(results.read_text())  # with the date and versions it ran under (checks since removed go)
        ran_then = _ran(before["date"], before["environment"])
        c.results.update({n: {"ran": ran_then, **r} for n, r in before.get("checks", {}).items() if n in known})
    c.ran = _ran(started, env)

    def write() -> None:
        data = {"written_by": "python -m bench.speed.gpu" + (" --smoke" if args.smoke else ""), "date": started,
                "environment": env, "budget_s": args.budget_s, "checks": c.results}
        atomic_write_json(results, data)

    signal.signal(signal.SIGTERM, lambda *_: (write(), sys.exit(124)))
    for how, checks in plan(c):
        checks = [(n, f) for n, f in checks if selected(n, only, args.suite)]
        if how == "alone":
            for name, fn in checks:
                _guarded(c, name, fn)
                write()
        else:  # the CPU cores shared between the jobs, so that none starves the others' host work
            c.extra_env = {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // c.jobs))}
            with ThreadPoolExecutor(max_workers=c.jobs) as pool:
                for fut in [pool.submit(_guarded, c, n, f) for n, f in checks]:
                    fut.result()
                    write()
    write()
    failed = [n for n, r in c.results.items() if r["ok"] is False]
    print(f"bench.speed.gpu: {len(c.results) - len(failed)} of {len(c.results)} checks ok or skipped; wrote {results} "
          "(its page: python -m bench.pages)"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def _ran(date: str, env: dict[str, Any]) -> str:
    """When and under what a check ran: ``--only`` re-runs leave checks from earlier runs beside new ones."""
    return f"{date}, torch {env['torch']}, accelerate {env['accelerate']}, transformers {env['transformers']}"



if __name__ == "__main__":
    raise SystemExit(run_cli(main))  # a user's error is one line (exit 2); --debug shows the traceback
