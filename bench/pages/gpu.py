"""docs/results/gpu.md: the GPU check's page from bench/results/gpu.json (``python -m bench.speed.gpu`` writes it).

The goals first (what the wall-clock work aims at, from whatever ran), then every check with its numbers, then the
comparisons' tables. The paragraphs are templates (bench/pages/templates/gpu*.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.pages.text import DOCS, RESULTS, fill
from common.table import format_table

COMPARES = (("compare_124m", "GPT-2-124M, compiled"), ("compare_350m", "GPT-2-350M, compiled"),
            ("compare_eager_124m", "GPT-2-124M, eager"))


def pages(results: Path = RESULTS, docs: Path = DOCS) -> dict[Path, str]:
    """{docs/gpu.md: its text} ({} where no GPU check is recorded)."""
    path = results / "gpu.json"
    return {docs / "gpu.md": render(json.loads(path.read_text()))} if path.is_file() else {}


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return ", ".join(_fmt(x) for x in v)
    return str(v)


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def render(data: dict[str, Any]) -> str:
    """docs/results/gpu.md from gpu.json's ``data``: the goals first, then every check with its numbers."""
    env, checks = data["environment"], data["checks"]
    runs: dict[str, list[str]] = {}
    for name, r in checks.items():
        runs.setdefault(r.get("ran", ""), []).append(name)
    mixed = ""
    if len(runs) > 1:  # some checks kept from an earlier run (``--only``)
        mixed = fill("gpu_mixed", runs="; ".join(f"{', '.join(names)} ({ran or 'date not recorded'})"
                                                 for ran, names in runs.items())) + "\n\n"
    goal_rows = [{"goal": g, "measured": v, "met": m} for g, v, m in goals(checks, env.get("device", ""))]
    check_rows = []
    for name, r in checks.items():
        status = "ok" if r["ok"] else "skipped" if r["ok"] is None else "**failed**"
        nums = "; ".join(f"{k} {_fmt(v)}" for k, v in r.items() if k not in ("ok", "seconds", "table", "ran")
                         and not isinstance(v, dict))
        nested = "; ".join(f"{k}: " + ", ".join(f"{a} {_fmt(b)}" for a, b in _flat(v).items())
                           for k, v in r.items() if isinstance(v, dict))
        check_rows.append({"check": name, "status": status, "seconds": str(r["seconds"]),
                           "numbers": "; ".join(x for x in (nums, nested) if x)})
    compares = "".join("\n\n" + fill("gpu_compare", how=how, table=format_table(checks[name]["table"]))
                       for name, how in COMPARES if checks.get(name, {}).get("table"))
    return fill("gpu", device=env["device"], written_by=data["written_by"], date=data["date"], torch=env["torch"],
                cuda=env["cuda"], accelerate=env["accelerate"], transformers=env["transformers"], python=env["python"],
                mixed=mixed, goals=format_table(goal_rows, ["goal", "measured", "met"]),
                checks=format_table(check_rows, ["check", "status", "seconds", "numbers"]), compares=compares) + "\n"


# MFU goals by device (GPT-2-124M, seq 1024, bf16, compiled): llm.c's 471k tokens/s per H100 is 40.7% in this
# project's FLOPs count; an H200 has the same peak and 1.4x the memory bandwidth
MFU_GOAL = {"H100": 0.42, "H200": 0.45}


def goals(checks: dict[str, Any], device: str = "") -> list[tuple[str, str, str]]:
    """(goal, measured, met) for the targets of the wall-clock work, from whatever ran."""
    out = []
    anchor = checks.get("anchor", {})
    c124 = checks.get("compare_124m", {})
    bare = anchor.get("12x768 chunked", {}).get("tflops")
    if bare and c124.get("baseline_tflops"):
        ratio = c124["baseline_tflops"] / bare
        out.append(("harness >= 0.97x the bare compiled loop (GPT-2-124M, the same loss)", f"{ratio:.3f} "
                    f"({c124['baseline_tflops']:.0f} vs {bare:.0f} TFLOP/s)", _yes(ratio >= 0.97)))
    goal = next((g for k, g in MFU_GOAL.items() if k in device), None)
    if c124.get("baseline_mfu") is not None:
        out.append((f"MFU >= {goal:.0%} (GPT-2-124M, seq 1024, bf16, compiled)" if goal else
                    "MFU (GPT-2-124M, seq 1024, bf16, compiled)", f"{c124['baseline_mfu']:.1%}",
                    _yes(c124["baseline_mfu"] >= goal) if goal else "n/a"))
    for name in ("compare_124m", "compare_350m"):
        cmp = checks.get(name, {})
        size = name.split("_")[1].upper()
        if cmp.get("coarse_over_full") is not None:
            out.append((f"coarse level's FLOP/s >= 0.9x the full model's (GPT-2-{size})",
                        f"{cmp['coarse_over_full']:.2f}",
                        _yes(cmp["coarse_over_full"] >= 0.9)))
        f = cmp.get("flops_saved_%")
        w = cmp.get("wall_saved_excl_compile_%", cmp.get("wall_saved_%"))
        goal_text = f"V-cycle compile-free wall-clock saving >= 0.8x its FLOPs saving (GPT-2-{size})"
        if isinstance(f, (int, float)) and isinstance(w, (int, float)):
            out.append((goal_text, f"{w:+.1f}% wall vs {f:+.1f}% FLOPs", _yes((w >= 0.8 * f) if f > 0 else (w >= f))))
        elif f is not None:
            out.append((goal_text, f"FLOPs saved: {f}", "n/a"))
    full, coarse = anchor.get("12x768 chunked", {}).get("tflops"), anchor.get("6x384 chunked", {}).get("tflops")
    if full and coarse:
        out.append(("(the anchor's own coarse / full FLOP/s: what the device allows)", f"{coarse / full:.2f}", "-"))
    if c124.get("level_change_s"):
        worst = max(c124["level_change_s"])
        out.append(("a V-cycle level change <= 1 s (GPT-2-124M)", f"{worst:.2f} s (slowest)", _yes(worst <= 1.0)))
    return out or [("(nothing measured)", "-", "-")]


def _yes(b: bool) -> str:
    return "yes" if b else "**no**"
