"""Time the V-cycle's level changes at GPT-2-124M with its AdamW moments, the kept copy on the host or the device.

A level change down keeps the level's weights and moments (1.5 GB at 124M) for the interpolation on the way
up, then coalesces; the way up de-coalesces, interpolates with the kept copy and maps the moments. Where the
kept copy waits decides much of the time on a GPU: pinned host memory (the only choice before) or the
device's own memory (``park_on``'s choice when it fits). Both are run here on the same model, alternating,
each timed on the device clock, after one warm-up cycle; the host's first cycle, which pins its host memory
for the first time as a training run's one change down does, is reported apart.

    python -m bench.speed.level_change               # CUDA when available, else the CPU (both places = a clone)
    python -m bench.speed.level_change --tiny        # a tiny shape on the CPU (the tests run it)
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from bench.lib.runs import output_file
from common.cli import check_flags, run_cli
from common.device import peak_memory_gb, timed
from common.io import atomic_write_json
from common.ownership import WRITTEN_BY
from common.quiet import quiet_transformers
from progressive.config import load_config
from progressive.methods import get_method
from progressive.model.build import get_family, step_flops

ROOT = Path(__file__).resolve().parents[2]
SHAPES = {"gpt2-124m": {"n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50304, "n_positions": 1024},
          "tiny": {"n_embd": 32, "n_layer": 2, "n_head": 2, "vocab_size": 64, "n_positions": 16}}


def one_cycle(shape: str, where: str, device: torch.device) -> dict[str, float]:
    """One down and one up level change of the default V-cycle (width 2, depth 2): seconds of each."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = load_config(ROOT / "configs" / "default.yaml", {"method.name": "vcycle", "train.report_to": "none"})
    fam = get_family("gpt2")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(**SHAPES[shape])).to(device)
    method = get_method(cfg, fam)
    method.park = where
    phases = method.plan(model.config, lambda c: step_flops(cfg, fam, c))

    def trained(m: torch.nn.Module) -> torch.optim.Optimizer:  # one step: AdamW's moments exist
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=device.type == "cuda")
        x = torch.randint(0, m.config.vocab_size, (2, 64 if shape == "tiny" else 256), device=device)
        x = x[:, :m.config.n_positions]
        m(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return opt

    opt = trained(model)
    with timed(device) as down:
        change = method.transition(1, phases, model, opt)
    del model, opt
    small = change.model
    small_opt = trained(small)
    with timed(device) as up:
        method.transition(2, phases, small, small_opt)
    return {"down_s": down[0], "up_s": up[0]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a tiny GPT-2 on the CPU")
    ap.add_argument("--repeats", type=int, default=3, help="timed pairs (host, device) after one warm-up pair")
    ap.add_argument("--out", default=str(ROOT / "outputs" / "bench" / "level_change.json"))
    args = ap.parse_args(argv)
    check_flags({"--repeats": args.repeats}, at_least_one=["--repeats"])

    quiet_transformers()
    out = output_file(args.out, "python -m bench.speed.level_change")
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    shape = "tiny" if args.tiny else "gpt2-124m"
    runs: dict[str, list[dict[str, float]]] = {"host": [], "device": []}
    one_cycle(shape, "device", device)  # warms the kernels up; the host's first pinning is left in:
    first = one_cycle(shape, "host", device)  # it is what a run's one change down pays
    print(f"[level_change] first time on the host: down {first['down_s']:.3f} s, up {first['up_s']:.3f} s")
    for r in range(1, args.repeats + 1):
        for where in runs:
            res = one_cycle(shape, where, device)
            runs[where].append(res)
            print(f"[level_change] repeat {r}: kept on the {where}: down {res['down_s']:.3f} s, "
                  f"up {res['up_s']:.3f} s", flush=True)
    median = {w: {k: statistics.median(x[k] for x in rs) for k in ("down_s", "up_s")} for w, rs in runs.items()}
    lines = ["| kept copy on | level change down (s) | up (s) |", "|---|---|---|",
             f"| host, the first time | {first['down_s']:.3f} | {first['up_s']:.3f} |"]
    lines += [f"| {w} (median of {args.repeats}) | {m['down_s']:.3f} | {m['up_s']:.3f} |" for w, m in median.items()]
    print(f"{shape} on {torch.cuda.get_device_name(0) if device.type == 'cuda' else 'the CPU'}, "
          "after a warm-up cycle:\n" + "\n".join(lines))
    result = {WRITTEN_BY: "growtrain python -m bench.speed.level_change", "shape": shape, "device": str(device),
              "first_host": first, "runs": runs, "median": median, "peak_memory_gb": peak_memory_gb(device),
              "table": lines}
    atomic_write_json(out, result)
    return result


if __name__ == "__main__":
    raise SystemExit(run_cli(main))  # a user's error is one line (exit 2); --debug shows the traceback
