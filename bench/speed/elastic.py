"""Elastic pipelining (AutoPipe + AutoDP) against a fixed GPipe pipeline: a SIMULATION of the paper's 16-device
runs from per-layer times measured on this machine (a GPU when there is one; here a 2-core CPU).

    python -m bench.speed.elastic [--samples 2] [--repeats 3] [--rounds 5] [--threads 1] [--out outputs/bench_elastic]
                                  [--smoke]

What is measured: for ViT-B/16 (224 px, 197 tokens, 1000 classes), BERT-Base and BERT-Large (SQuAD-shaped:
384 tokens, a 2-way head standing in for the QA head), a 2-layer model at real width: a layer's forward +
backward and its forward alone (what a frozen layer costs), timed alternately, the smallest of --rounds;
the embeddings' and the head's forward + backward, saved activation bytes and parameter counts from the
pipeline engine's own profiler (progressive.pipeline.autopipe.profile_model). All per sample. The L layers
of the full model are copies of the measured one (all layers of these models have one shape).

What is simulated (nothing here ran on 16 devices; every number in the table is SIMULATED):
- 16 devices; the fixed baseline is GPipe with K = 8 stages x dp = 2 replicas, M = 16 micro-batches (the
  authors' table: M = 16 for K = 8, 4, 2 and 4 for K = 1), the global batch 2 x the paper's per-pipeline
  batch (800 images, 128 sequences), constant through the run (our engine's semantics).
- Bubble model of a synchronous pipeline step: T = T_prefix + (M + K - 1) * max_s t_s, with t_s the
  forward + backward time of stage s for one micro-batch of B / (dp M) samples (time linear in samples:
  compute-bound devices), stages from AutoPipe's optimal balance of measured times (embeddings on the first,
  head on the last); the idle fraction is (K - 1) / (M + K - 1). T_prefix: the frozen prefix's forward on
  stage 0 for the local batch (outside the pipeline); with AutoCache only the layers frozen since the last
  epoch run, once per epoch (the first epoch at a new depth), else nothing. Communication (activations
  between stages, the gradient all-reduce, moving state at a re-mesh) is not modelled.
- The paper's freeze schedule: alpha = 1/3 over 10 epochs, frozen depth F_e = ceil(L (1 - (2/3)^e)) at
  epoch e (AutoFreeze.bound). Epochs have equal steps, so a speed-up is the ratio of summed step times.
- K per frozen depth: "authors' rule" = parameter counts of attention/MLP sub-layers split by their greedy
  balance, K halved while the largest partition has no more parameters than at the start (frozen layers
  not counted: their code's correction subtracts 0), which gives the schedule derived from their code
  (ViT-B: F 0-4 -> K 8, 5-8 -> 4, 9-10 -> 2, 11-12 -> 1); "our rule" = progressive.pipeline's memory rule
  (AdamW state, frozen weights and activations of B / dp samples). Each variant is the paper's ablation:
  freeze only (frozen layers stay in their stage, forward only), + AutoPipe (K shrinks, freed devices
  idle), + AutoCache, + AutoDP (freed devices become replicas), all four.
The paper reports 2.83x (ViT-B, ImageNet; 2.27x without AutoCache, 1.26x AutoPipe + AutoCache without
AutoDP, 0.95x freeze only) and 2.10x (BERT-Large, SQuAD, 3 epochs there) against GPipe + DDP on 2 x 8 GPUs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from bench.lib.runs import output_folder, record
from common.cli import check_flags, run_cli
from common.io import atomic_write_json
from common.quiet import quiet_transformers
from operators.freeze import prefix_output, span_output
from progressive.pipeline.stages import set_hollow

quiet_transformers()

import torch  # noqa: E402

from common.table import format_table  # noqa: E402
from progressive.methods.autofreeze.method import bound  # noqa: E402
from progressive.pipeline import autopipe  # noqa: E402

DEVICES, K0 = 16, 8
MICROBATCHES = {8: 16, 4: 16, 2: 16, 1: 4}  # the authors' hard-coded table (pipe/auto_pipe.py)
MODELS = {  # name: shape, global batch (2 pipelines x the paper's per-pipeline batch), the paper's speed-up
    "ViT-B/16 (ImageNet)": dict(kind="vit", hidden=768, heads=12, ffn=3072, layers=12, tokens=197, labels=1000,
                                batch=800, paper="2.83x (2.27x w/o AutoCache)"),
    "BERT-Base (SQuAD-shaped)": dict(kind="bert", hidden=768, heads=12, ffn=3072, layers=12, tokens=384, labels=2,
                                     batch=128, paper="- (2.10x is BERT-Large)"),
    "BERT-Large (SQuAD-shaped)": dict(kind="bert", hidden=1024, heads=16, ffn=4096, layers=24, tokens=384,
                                      labels=2, batch=128, paper="2.10x (their run: 3 epochs)", short=3),
}
SMOKE = {"ViT tiny": dict(kind="vit", hidden=64, heads=2, ffn=256, layers=12, tokens=17, labels=10, batch=800,
                          paper="-")}


# ------------------------------------------------------------------------------------------ measuring


def build(shape: dict, layers: int = 2) -> tuple[torch.nn.Module, dict]:
    """A ``layers``-layer model at the shape's width and a batch of one sample for it (fp32, eval-free)."""
    from transformers import BertConfig, BertForSequenceClassification, ViTConfig, ViTForImageClassification

    h = dict(hidden_size=shape["hidden"], num_attention_heads=shape["heads"], intermediate_size=shape["ffn"],
             num_hidden_layers=layers, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    if shape["kind"] == "vit":
        patch = 16
        size = int(math.isqrt(shape["tokens"] - 1)) * patch
        model = ViTForImageClassification(ViTConfig(**h, image_size=size, patch_size=patch, num_labels=shape["labels"]))
        return model, {"pixel_values": torch.randn(1, 3, size, size), "labels": torch.tensor([0])}
    model = BertForSequenceClassification(BertConfig(**h, vocab_size=30522, max_position_embeddings=512,
                                                     num_labels=shape["labels"]))
    ids = torch.randint(1000, 30000, (1, shape["tokens"]))
    return model, {"input_ids": ids, "labels": torch.tensor([0])}


def layer_times(model: torch.nn.Module, batch: dict, rounds: int) -> tuple[float, float]:
    """(forward + backward ms, forward ms) of layer 1 fed layer 0's output (hollow embeddings), the two timed
    alternately so that load on a shared machine touches both alike; the smallest of ``rounds`` each."""

    h = prefix_output(model, batch, stop=1)
    both, fwd = [], []
    set_hollow(model, True)
    try:
        for r in range(rounds + 1):  # the first round warms up
            x = h.clone().requires_grad_(True)
            t0 = time.perf_counter()
            span_output(model, batch, 2, 1, x).float().sum().backward()
            t1 = time.perf_counter()
            prefix_output(model, batch, stop=2, start=1, hidden=h)
            t2 = time.perf_counter()
            if r:
                both.append((t1 - t0) * 1e3)
                fwd.append((t2 - t1) * 1e3)
    finally:
        set_hollow(model, False)
        model.zero_grad(set_to_none=True)
    return min(both), min(fwd)


def measure(shape: dict, samples: int, repeats: int, rounds: int) -> dict:
    """Per-sample costs of one layer (forward + backward, and forward alone: what a frozen layer costs), of
    the embeddings and of the head (ms), activation bytes per sample, parameter counts; the model built at 2
    layers. Times are minima over rounds (load on a shared machine only ever adds time); the embeddings' and
    the head's come from the engine's profile (a stage's time minus its layer's, so the noisier ones)."""
    torch.manual_seed(0)
    model, one = build(shape)
    batch = {k: v.repeat(samples, *([1] * (v.dim() - 1))) for k, v in one.items()}
    profs = [autopipe.profile_model(model, batch, repeats) for _ in range(2)]
    both, fwd = layer_times(model, batch, rounds)
    prof, n = profs[0], samples
    return {"layer_ms": both / n, "forward_ms": fwd / n,
            "embed_ms": min(p.embed_ms for p in profs) / n, "head_ms": min(p.head_ms for p in profs) / n,
            "layer_act": prof.layer_act[1], "head_act": prof.head_act, "layer_params": prof.layer_params[1],
            "embed_params": prof.embed_params, "head_params": prof.head_params,
            "attn_params": sum(p.numel() for name, p in model.named_parameters()  # LN + attention sub-layer
                               if ".1.attention." in name or ".1.layernorm_before." in name),
            "samples": n}


# ------------------------------------------------------------------------------------------ simulating


def profile_of(m: dict, layers: int) -> autopipe.LayerProfile:
    """The full model's per-sample profile: ``layers`` copies of the measured layer."""
    return autopipe.LayerProfile(layer_ms=[m["layer_ms"]] * layers, embed_ms=m["embed_ms"], head_ms=m["head_ms"],
                                 layer_params=[m["layer_params"]] * layers, embed_params=m["embed_params"],
                                 head_params=m["head_params"], layer_act=[m["layer_act"]] * layers,
                                 head_act=m["head_act"], samples=1)


def authors_k(m: dict, layers: int, frozen: int, k0: int = K0) -> int:
    """K after the authors' compression rule (see the module docstring) at ``frozen`` layers."""
    attn, mlp = m["attn_params"] / 1e6, (m["layer_params"] - m["attn_params"]) / 1e6  # millions, as theirs
    emb, head = m["embed_params"] / 1e6, m["head_params"] / 1e6  # (their greedy adds a variance in M^2)

    def largest(f: int, k: int) -> float:
        units = ([emb] if f == 0 else []) + [attn, mlp] * (layers - f) + [head]
        if k > len(units):  # their greedy leaves devices empty: the largest partition is one unit
            return max(units)
        sizes = autopipe.greedy_balance(units, k)
        b = autopipe.bounds_of(0, sizes)
        return max(sum(units[b[i]:b[i + 1]]) for i in range(k))

    start, k = largest(0, k0), k0
    while k > 1 and largest(frozen, k // 2) <= start:
        k //= 2
    return k


def step_ms(prof: autopipe.LayerProfile, fwd_ms: float, frozen: int, k: int, dp: int, batch: int,
            prefix_layers: float, in_place: str = "") -> float:
    """One step's ms under the bubble model: prefix forward of ``prefix_layers`` layers for the local batch,
    then (M + K - 1) x the slowest stage's micro-batch. ``in_place`` ("first" / "last"): frozen layers stay in
    their stages of the F = 0 partition, forward only ("freeze only"); with 12 layers on 8 stages, four stages
    hold two layers, the first four (our balance's tie rule) or the last four."""
    local = batch / dp
    m = MICROBATCHES[k]
    if in_place:
        costs = [fwd_ms if i < frozen else c for i, c in enumerate(prof.costs(0, "time"))]
        if frozen == prof.layers:
            costs[-1] += prof.head_ms  # the head always trains
        sizes = autopipe.balance(prof.costs(0, "time"), k)
        bounds = autopipe.bounds_of(0, sizes if in_place == "first" else sorted(sizes))
        stage = max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))
        return (m + k - 1) * stage * local / m
    costs = prof.costs(frozen, "time") or [prof.head_ms]
    k = min(k, len(costs))  # a stage holds one layer at least (the authors split layers in two)
    m = MICROBATCHES[k]
    sizes = autopipe.balance(costs, k)
    b = autopipe.bounds_of(0, sizes)
    stage = max(sum(costs[b[i]:b[i + 1]]) for i in range(k))
    return prefix_layers * fwd_ms * local + (m + k - 1) * stage * local / m


def simulate(m: dict, shape: dict, epochs: int = 10, alpha: float = 1 / 3) -> dict:
    """Summed step ms over the epochs, per variant, and the K schedules."""
    L, batch = shape["layers"], shape["batch"]
    prof = profile_of(m, L)
    fwd = m["forward_ms"]
    frozen = [bound(L, alpha, e) for e in range(epochs)]  # decision T = e at the start of epoch e
    budget = max(autopipe.stage_memory(prof, 0, autopipe.partition(prof, 0, K0, "time"), batch // (DEVICES // K0)))
    ours, k = [], K0
    for f in frozen:
        if f:
            k, _ = autopipe.choose_stages(prof, f, k, DEVICES, batch, budget, "time")
        ours.append(k)
    theirs = [authors_k(m, L, f) for f in frozen]
    dp0 = DEVICES // K0
    fixed = sum(step_ms(prof, fwd, 0, K0, dp0, batch, 0) for _ in frozen)
    total = {
        "fixed GPipe (K 8 x dp 2)": fixed,
        "freeze only (2-layer stages first)": sum(step_ms(prof, fwd, f, K0, dp0, batch, 0, "first") for f in frozen),
        "freeze only (2-layer stages last)": sum(step_ms(prof, fwd, f, K0, dp0, batch, 0, "last") for f in frozen),
        "+ AutoPipe (freed devices idle)": sum(step_ms(prof, fwd, f, k, dp0, batch, f) for f, k in zip(frozen, theirs)),
        "+ AutoPipe + AutoCache": sum(step_ms(prof, fwd, f, k, dp0, batch, f - p) for f, p, k in
                                      zip(frozen, [0] + frozen, theirs)),
        "+ AutoPipe + AutoDP": sum(step_ms(prof, fwd, f, k, DEVICES // k, batch, f) for f, k in zip(frozen, theirs)),
        "all four (authors' K rule)": sum(step_ms(prof, fwd, f, k, DEVICES // k, batch, f - p) for f, p, k in
                                          zip(frozen, [0] + frozen, theirs)),
        "all four (our K rule)": sum(step_ms(prof, fwd, f, k, DEVICES // k, batch, f - p) for f, p, k in
                                     zip(frozen, [0] + frozen, ours)),
    }
    speedup = {v: round(fixed / t, 2) for v, t in total.items()}
    if "short" in shape and epochs != shape["short"]:  # the paper's own run length for this setting
        short = simulate(m, {k: v for k, v in shape.items() if k != "short"}, shape["short"], alpha)
        speedup[f"all four (authors' K rule), {shape['short']} epochs"] = short["speedup"]["all four (authors' K rule)"]
    return {"frozen": frozen, "k_authors": theirs, "k_ours": ours, "speedup": speedup,
            "bubble_fixed": round((K0 - 1) / (MICROBATCHES[K0] + K0 - 1), 3)}


def main(argv: list[str] | None = None) -> None:
    """The bench's command line (``argv``: sys.argv[1:] by default).

    Raises:
        ValueError: a count < 1, before any work.
    """
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2, help="samples per measured micro-batch")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per profile (median)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds of a layer (the smallest is kept)")
    ap.add_argument("--threads", type=int, default=1, help="1: on a shared CPU, 2 threads contend and time worse")
    ap.add_argument("--out", default="outputs/bench_elastic")
    ap.add_argument("--results", default=None, help="also write RESULTS/elastic.json (bench/results: what "
                                                    "python -m bench.pages renders)")
    ap.add_argument("--smoke", action="store_true", help="a tiny width, one repeat (CI)")
    ap.add_argument("--measured", help="an elastic.json written before: simulate from its measurements again")
    args = ap.parse_args(argv)
    counts = ["--samples", "--repeats", "--rounds", "--threads"]
    check_flags({f: getattr(args, f[2:]) for f in counts}, at_least_one=counts)
    torch.set_num_threads(args.threads)
    models = SMOKE if args.smoke else MODELS
    device = (torch.cuda.get_device_name() if torch.cuda.is_available()
              else f"CPU, {args.threads} thread{'s' if args.threads != 1 else ''}")
    rows, results = [], []
    before = {r["model"]: r["measured"] for r in json.loads(Path(args.measured).read_text())["results"]} \
        if args.measured else {}
    for name, shape in models.items():
        m = before.get(name) or measure(shape, args.samples, 1 if args.smoke else args.repeats,
                                        1 if args.smoke else args.rounds)
        sim = simulate(m, shape)
        results.append({"model": name, "measured": m, **sim, "paper": shape["paper"]})
        for variant, s in sim["speedup"].items():
            rows.append({"model": name, "variant": variant, "simulated speed-up": f"{s:.2f}x",
                         "paper": shape["paper"] if variant.startswith("all four (authors") else ""})
        print(f"{name}: measured on {device}: layer {m['layer_ms']:.1f} ms fwd+bwd / {m['forward_ms']:.1f} ms fwd per "
              f"sample, embeddings {m['embed_ms']:.1f}, head {m['head_ms']:.1f}; frozen per epoch {sim['frozen']}; "
              f"K (authors' rule) {sim['k_authors']}; K (our rule) {sim['k_ours']}; fixed-pipeline bubble "
              f"{sim['bubble_fixed']:.0%}", file=sys.stderr)
    print(format_table(rows, ["model", "variant", "simulated speed-up", "paper"]))

    out = output_folder(args.out, "python -m bench.speed.elastic", ["elastic.json"])

    payload = {"device": device, "devices": DEVICES, "k0": K0, "results": results,
               "command": " ".join(["python -m bench.speed.elastic", *sys.argv[1:]])}
    atomic_write_json(out / "elastic.json", payload)
    if args.results:

        record(args.results, "elastic", payload, "python -m bench.speed.elastic")
    print(f"written: {out / 'elastic.json'} (every speed-up is simulated; see the module docstring)", file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(run_cli(main))  # a user's error is one line (exit 2); --debug shows the traceback
