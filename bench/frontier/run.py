"""One compute-optimal frontier for every method, on held-out data.

    python -m bench.frontier                 # the whole grid (hours on 2 CPU cores); resumes where it stopped
    python -m bench.frontier --smoke         # a tiny grid in seconds (the test suite runs it)
    python -m bench.frontier --report        # rewrite savings.csv and the plot from the rows alone
    python -m bench.pages                    # then the pages (docs/results/frontier.md) from them

What runs (``FULL`` in bench/lib/grid.py; every run on the bundled corpus with a test split nothing is tuned on):
1. **The baseline at four sizes** (2x32, 2x64, 4x96 and the default 4x128; 4 heads) at three budgets spanning
   4x in FLOPs (75, 150, 300 steps of the default model), each size trained for as many steps as the budget
   buys, with its own full LR schedule; baseline-only reference cells extend the envelope past the methods'
   range: every size at 37, 2x32, 2x64 and 4x128 at 600 (the envelope is over every size that ran), and sizes
   below the smallest method size, 2x16 at 37, 75 and 150 and 1x16 at 37 and 75 (the budgets where a smaller
   model gains most), to see whether the envelope is bracketed from below. **LR sweep** per size and budget on seed 0,
   factor 2 apart, from
   {1e-3, 2e-3, 4e-3}, extended while the best is at an edge: the LR with the lowest *validation* loss is
   the tuned one. Seeds 1 and 2 run at the tuned LR.
2. **Every method** at the default target (4x128) and at the envelope's size at each budget (chosen on
   seed-0 validation loss), three seeds: seed 0 at the tuned LR of the target's own size, the others at the
   method's own tuned LR (``method_sweep``: the same until a check below wins on seed 0; where one ran, extended
   at an edge as a baseline's sweep is): the V-cycle (this
   project's default recipe and the paper's), Apollo with each optimizer rule (the authors', first_copy,
   mapped), StackBERT- and G_stack-style stacking, and a combination no paper has: the V-cycle whose depth
   de-coalescing is G_stack's stacking (``vcycle_gstack``: coarse layers i and i + L/2 merge, so going up
   copies the coarse stack on top of itself).
3. **Zero-shot** (LAMBADA, WikiText-2, PTB from the bundled files) for seed 0 at the largest budget.
4. **The methods' own tuning** (``checks``, bench.lib.grid.Check), last: the recipe's V-cycle with its coarse
   level at 4x (its own), 2x and 1x the target's LR at 4x128@75, 4x128@150 and 2x32@300, and every method at 0.5x
   and 2x its LR at 4x128@150, three seeds each. The LR whose seed-0 run has the lowest validation loss is the
   method's (bench.lib.envelope.method_lr), as a baseline's is; the page shows every factor.

Every finished run is a row of ``bench/results/frontier.csv``, with the code version that trained it
(``code_version``: the short git commit, "+dirty" when the code differed from it, "unknown" outside a checkout,
"unknown (before versioning)" for the rows made before rows recorded it), which is also the cache: a row already
there is not run again (``--retime SIZE`` runs rows again for their wall-clock only: bench/frontier/retime.py;
``--reproduce KEY`` trains a row again with today's code into a folder of its own and prints both losses).
Validation loss is over the whole validation split and test loss over the whole test split, once, at the end
of each run. Savings against the envelope and the same-size tuned baseline (bench/lib/envelope.py) go to
``savings.csv`` and ``frontier.png`` is drawn from the rows (bench/frontier/report.py); ``python -m bench.pages``
renders docs/results/frontier.md from them. Runs go to ``--workers`` processes of one thread each (2: one per
core), so wall-clock is measured with the other core busy alike; each row keeps the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from bench.frontier import retime as R
from bench.frontier.report import CMD, note_runs_made, report, tracker_entries
from bench.frontier.retime import apply
from bench.lib import envelope, tracking
from bench.lib.grid import GRIDS, ROOT, SMOKE, Grid, make_job, step_flops_of, train
from bench.lib.rows import COLUMNS, read_rows, sorted_rows, write_csv
from bench.lib.runs import RUN_KEY, output_folder
from bench.lib.variants import method_of
from common.cli import check_flags, comma_list, run_cli
from common.quiet import quiet_transformers
from eval.zeroshot import ZeroShotConfig, run
from progressive.run.stop import STOPPED_EXIT, Interrupted, Stopped


def plan(g: Grid, rows: list[dict[str, Any]], flops: dict[tuple[int, int], int],
         root: Path | None = None) -> list[dict[str, Any]]:
    """Every job the finished ``rows`` call for next, in priority order: the LR sweeps at the methods' budgets
    (seed 0); the baseline's other seeds there (a saving is read against the reference's seeds other than the one
    that chose the LR, so until they run a method's saving is only a bound); the methods at seed 0 on the default
    target; the sweeps at the reference budgets; their other seeds; the methods' other seeds; the methods on the
    envelope's size at seed 0; zero-shot (of runs whose checkpoint is under ``root``: a row from an earlier machine
    has none); the rest of the envelope size's seeds; the methods' LR checks (``g.checks``); then the steps of
    ``g.more`` in their order (``more_jobs``). Deterministic in ``rows``; rows already there are not planned again,
    and a job two parts plan runs once, at the earlier place."""
    jobs, tuned = [], {}
    for size, b in g.own_cells():  # each cell: its LR sweep on seed 0, then its other seeds at the tuned LR
        lrs, best = sweep_step(g, rows, size, b)
        # a reference-only budget is swept after the methods' seed 0, and seeded after the sweep
        sweep, seeds = (1.5, 2) if b not in g.budgets else (0, 0.5)
        jobs += [make_job(g, "baseline", "tuned", size, b, lr, 0, flops, sweep) for lr in lrs]
        if best is not None:
            tuned[(size, b)] = best
            jobs += [make_job(g, "baseline", "tuned", size, b, best, s, flops, seeds) for s in g.seeds[1:]]
    for b in g.budgets:
        targets = [(g.target, 1)]
        if g.envelope_methods and all((s, b) in tuned for s in g.sizes):
            env = envelope_target(rows, g, b)
            if env != g.target:
                targets.append((env, 4))
        for size, prio in targets:
            if (size, b) in tuned:
                for v in g.variants:
                    lrs, best = method_sweep(g, rows, v, size, b, tuned[(size, b)])
                    for s in g.seeds_of_methods(b):
                        for lr in ([tuned[(size, b)], *lrs] if s == g.seeds[0] else [best] if best else []):
                            jobs.append(make_job(g, method_of(v), v, size, b, lr, s, flops,
                                                 prio if s == g.seeds[0] else prio + 2))  # 1, 3 / 4, 6
    jobs += check_jobs(g, tuned, flops)
    jobs += more_jobs(g, rows, tuned, flops)
    done = {r["key"] for r in rows}
    jobs = [j for j in jobs if j["key"] not in done]
    jobs += zeroshot_jobs(g, rows, root)
    seen: set[str] = set()
    return [j for j in sorted(jobs, key=lambda j: j["order"])
            if j["key"] + j["kind"] not in seen and not seen.add(j["key"] + j["kind"])]


MORE = 10  # the priority of ``g.more``'s first step: after every other job (the checks are 7.x)


def more_jobs(g: Grid, rows: list[dict[str, Any]], tuned: dict[tuple[tuple[int, int], int], float],
              flops: dict[tuple[int, int], int]) -> list[dict[str, Any]]:
    """The jobs of ``g.more`` (bench.lib.grid.More), step i at priority ``MORE`` + i; within a step seed 0's LRs
    first, then seed by seed in the order of the step's ``seeds``, the items in the order listed. ``tuned``: the
    tuned LR of the grid's own cells (``plan``); a new cell's comes from its own sweep here."""
    own, jobs, tuned = set(g.own_cells()), [], dict(tuned)
    for m in g.more:  # a new cell's tuned LR, once its own sweep is over: a step's methods may grow into it
        for size, b in m.cells:
            if (size, b) not in own and (size, b) not in tuned:
                lrs, best = sweep_step(g, rows, size, b, m.lrs or g.lrs)
                if best is not None and not lrs:
                    tuned[(size, b)] = best

    def add(rank: int, k: int, job: dict[str, Any]) -> None:  # (step, seed's place, item's place, ...)
        job["order"] = (job["order"][0], rank, k, *job["order"][2:])
        jobs.append(job)

    for i, m in enumerate(g.more):
        for k, (size, b) in enumerate(m.cells):
            if (size, b) in own:
                tried = {float(r["lr"]) for r in envelope.baseline_rows(rows, size, b) if int(r["seed"]) == 0}
                lrs, best = [lr for lr in m.lrs if lr not in tried], tuned.get((size, b))
            else:
                lrs, best = sweep_step(g, rows, size, b, m.lrs or g.lrs)
            for lr in lrs:
                add(0, k, make_job(g, "baseline", "tuned", size, b, lr, 0, flops, MORE + i))
            if best is not None:
                for n, s in enumerate(m.seeds):
                    add(1 + n, k, make_job(g, "baseline", "tuned", size, b, best, s, flops, MORE + i))
        target = m.target or g.target
        for k, (v, b) in enumerate(m.methods, start=len(m.cells)):
            if (target, b) in tuned:
                base = tuned[(target, b)]
                lrs, best = method_sweep(g, rows, v, target, b, base)
                for n, s in enumerate(m.seeds):
                    for f in m.factors:
                        for lr in ([f * base] if f != 1.0 else [base, *lrs] if s == envelope.CHOOSER_SEED
                                   else [best] if best else []):
                            add(1 + n, k, make_job(g, method_of(v), v, target, b, lr, s, flops, MORE + i))
    return jobs


def method_sweep(g: Grid, rows: list[dict[str, Any]], variant: str, size: tuple[int, int], budget: int,
                 base: float) -> tuple[list[float], float | None]:
    """(LRs a method's seed 0 runs next in ``size`` at ``budget``, the method's tuned LR once its sweep is over), by
    the baseline's rule (``sweep_step``): seed 0 starts at ``base`` (the tuned LR of that size's baseline; it moves
    when the baseline's sweep moves it); where it has run more than one LR there (an LR check's, or a ``base`` that
    moved), the sweep goes on while the best on validation is the smallest or largest LR tried, to half or twice it
    (within ``lr_bounds`` and ``max_trials``). The tuned LR is envelope.method_lr: its other seeds run there."""
    tried = sorted({float(r["lr"]) for r in rows if r["variant"] == variant and r["method"] != "baseline"
                    and envelope.size_of(r) == size and int(r["budget"]) == budget
                    and int(r["seed"]) == envelope.CHOOSER_SEED})
    if base not in tried:
        return [base], None
    best = envelope.method_lr(rows, variant, size, budget)
    edge = best / 2 if best == tried[0] else best * 2 if best == tried[-1] else None
    if len(tried) > 1 and edge is not None and g.lr_bounds[0] <= edge <= g.lr_bounds[1] and len(tried) < g.max_trials:
        return [edge], None
    return [], best


def check_jobs(g: Grid, tuned: dict[tuple[tuple[int, int], int], float], flops: dict[tuple[int, int], int]
               ) -> list[dict[str, Any]]:
    """The methods' own LR checks (``g.checks``) at the cells whose baseline LR is tuned: each variant at each
    factor of that LR and each seed, after everything else; every check's first seed before any check's second
    (a grid stopped half-way has one seed of each), then in the order the checks are listed."""
    jobs = []
    for i, c in enumerate(g.checks):
        if (c.size, c.budget) in tuned:
            jobs += [make_job(g, method_of(v), v, c.size, c.budget, f * tuned[(c.size, c.budget)], s, flops,
                              7 + k / 10 + i / 1000)
                     for k, s in enumerate(c.seeds) for v in c.variants for f in c.factors]
    return jobs


def sweep_step(g: Grid, rows: list[dict[str, Any]], size: tuple[int, int], budget: int,
               lrs: tuple[float, ...] | None = None) -> tuple[list[float], float | None]:
    """(LRs to try next on seed 0, the tuned LR once the sweep is over, else None): first ``lrs`` (default
    ``g.lrs``); then, while the best is the smallest or largest LR tried, half or twice it (within ``lr_bounds`` and
    ``max_trials``)."""
    lrs = g.lrs if lrs is None else lrs
    tried = sorted(float(r["lr"]) for r in envelope.baseline_rows(rows, size, budget) if int(r["seed"]) == 0)
    new = [lr for lr in lrs if lr not in tried]
    if new or not tried:
        return new or list(lrs), None
    best = envelope.tuned_lr(rows, size, budget)
    edge = best / 2 if best == tried[0] else best * 2 if best == tried[-1] else None
    if edge is not None and g.lr_bounds[0] <= edge <= g.lr_bounds[1] and len(tried) < g.max_trials:
        return [edge], None
    return [], best



def envelope_target(rows: list[dict[str, Any]], g: Grid, budget: int) -> tuple[int, int]:
    """The envelope's size at ``budget``: the lowest seed-0 validation loss at each size's tuned LR."""
    scored = []
    for s in g.sizes:
        lr = envelope.tuned_lr(rows, s, budget)
        run = [r for r in envelope.baseline_rows(rows, s, budget) if int(r["seed"]) == 0 and float(r["lr"]) == lr]
        scored.append((float(run[0]["val_loss"]), s))
    return min(scored)[1]


def zeroshot_jobs(g: Grid, rows: list[dict[str, Any]], root: Path | None) -> list[dict[str, Any]]:
    """Zero-shot for the seed-0 runs at the largest budget and their arm's tuned LR (``envelope.own_lr``): every method
    (not an LR check's losing LRs), and each size's tuned baseline, where the run's checkpoint is under ``root``."""
    b, out = max(g.budgets), []
    if g.zeroshot_limit == 0:
        return out
    for r in rows:
        if int(r["seed"]) != 0 or int(r["budget"]) != b or r.get("lambada_acc") not in (None, ""):
            continue
        if root is None or not (Path(root) / r["key"] / "final" / "config.json").is_file():
            continue
        if float(r["lr"]) != envelope.own_lr(rows, r):  # (a method's at another LR: an LR check's row)
            continue
        out.append({"kind": "zeroshot", "key": r["key"], "limit": g.zeroshot_limit,
                    "order": (5, 0, b, r["method"], r["variant"], envelope.size_of(r), float(r["lr"]))})
    return out


# ---------------------------------------------------------------------------------------------- workers


def execute(job: dict[str, Any], recipe: str, root: str) -> dict[str, Any]:
    """Run one job in this process (a worker): train and return the row, or zero-shot and return its fields.
    The job's output goes to ``root/<key>.log``."""

    quiet_transformers()
    log = Path(root) / f"{job['key']}.{job['kind']}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        if job["kind"] == "zeroshot":
            return _zeroshot(Path(root) / job["key"], job["limit"])
        return train(job, recipe, root)


def _zeroshot(folder: Path, limit: int | None) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    out = folder / "eval_zeroshot.json"
    out.unlink(missing_ok=True)  # ours (this bench wrote it), from a run that stopped half-way
    res = run(ZeroShotConfig(checkpoint=str(folder / "final"), tasks=("lambada", "wikitext2", "ptb"), limit=limit,
                             batch_size=16, output=str(out)))["results"]
    return {"lambada_acc": res["lambada"]["acc"], "lambada_ppl": res["lambada"]["perplexity"],
            "wikitext2_word_ppl": res["wikitext2"]["word_perplexity"], "ptb_word_ppl": res["ptb"]["word_perplexity"]}


# ---------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    """The command line; returns its exit code (2 with one line on bad input: a flag out of range, a rows file
    that is refused, naming its line)."""

    return run_cli(_main, argv)


def _main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="a tiny grid in seconds (tests)")
    ap.add_argument("--grid", choices=sorted(GRIDS), default="default",
                    help="default: vocabulary 4096, sizes 2x32..4x128, 0.1-0.8 tokens per parameter of 4x128; layers: "
                         "vocabulary 512, 2x64/4x64/8x64, 10-84 tokens per parameter of 4x64 (bench/lib/grid.py)")
    ap.add_argument("--max_budget", type=int, default=None, metavar="STEPS",
                    help="run only the grid's budgets up to this many target steps (a long grid a part at a time)")
    ap.add_argument("--results", default=str(ROOT / "bench" / "results"),
                    help="folder of frontier.csv (also the cache of finished runs), savings.csv, frontier.png")
    ap.add_argument("--out", default="outputs/frontier", help="run folders (checkpoints for zero-shot) and logs")
    ap.add_argument("--workers", type=int, default=2, help="processes of one thread each (0: in this process)")
    ap.add_argument("--max_jobs", type=int, default=None, help="stop after this many jobs (then resume later)")
    ap.add_argument("--report", action="store_true", help="only rewrite savings and plot from the rows")
    ap.add_argument("--retime", default=None, metavar="SIZES",
                    help="re-run the rows of these sizes (e.g. 2x32) for their wall-clock (bench/frontier/retime.py)")
    ap.add_argument("--reproduce", default=None, metavar="KEYS",
                    help="train the rows with these keys (comma list) again with this code and print their losses "
                         "beside the rows' (nothing in the rows changes)")
    tracking.add_arguments(ap)
    args = ap.parse_args(argv)

    check_flags({"--workers": args.workers, "--max_jobs": args.max_jobs}, not_negative=("--workers", "--max_jobs"))
    check_flags({"--max_budget": args.max_budget}, at_least_one=("--max_budget",))
    modes = [flag for flag, on in (("--report", args.report), ("--retime", args.retime is not None),
                                   ("--reproduce", args.reproduce is not None)) if on]
    if len(modes) > 1:
        raise ValueError(f"{' and '.join(modes)} are separate commands: give one of them")
    keys = comma_list("--reproduce", args.reproduce) if args.reproduce is not None else []
    sizes = R.parse_sizes(args.retime) if args.retime is not None else set()
    g = SMOKE if args.smoke else GRIDS[args.grid]
    if args.max_budget is not None:
        try:
            g = g.upto(args.max_budget)
        except ValueError as e:
            raise ValueError(f"--max_budget {args.max_budget}: {e}") from None

    writes = [RUN_KEY, f"{RUN_KEY}.*.log", "wandb"]  # each job's run folder and log; --report_to's W&B folder

    results = Path(args.results)
    csv_path = results / f"frontier{g.stem}.csv"
    rows = read_rows(csv_path)
    before = [dict(r) for r in rows]
    if args.reproduce is not None:  # the rows stay as they are: nothing to write, report or track
        R.reproduce_jobs(rows, keys, lambda r: r)  # an unknown key is refused before any folder is made
        root = output_folder(f"{args.out}_reproduce", CMD, writes)
        _drive(g, rows, csv_path, root, args.workers, args.max_jobs,
               lambda g, rows, flops, root: R.reproduce_jobs(rows, keys, lambda r: _job_of_row(g, r, flops)))
        return 0
    if args.retime is not None:
        root = output_folder(f"{args.out}_retime", CMD, writes)
        rows = _drive(g, rows, csv_path, root, args.workers, args.max_jobs,
                      lambda g, rows, flops, root: R.retime_jobs(rows, sizes, lambda r: _job_of_row(g, r, flops)))
    elif not args.report:
        root = output_folder(args.out, CMD, writes)
        rows = _drive(g, rows, csv_path, root, args.workers, args.max_jobs)
    if rows != before:  # a run finished or was re-timed here: its machine and date go beside the rows
        note_runs_made(results, g.stem)
    print(report(g, rows, results))
    if args.report_to != "none":

        tracking.log(args.report_to, args.project, Path(args.out), f"frontier{g.stem}",
                     tracker_entries(g, rows, results, Path(args.out)))
    return 0


def _drive(g: Grid, rows: list[dict[str, Any]], csv_path: Path, root: Path, workers: int,
           max_jobs: int | None, planner: Any = None) -> list[dict[str, Any]]:
    """Run the jobs ``planner`` (default ``plan``) calls for until none is left (or ``max_jobs``), ``workers``
    at a time, writing the CSV after each."""
    planner = planner or plan
    flops = {s: step_flops_of(g, s) for s in {*(c for c, _ in g.baseline_cells()), g.target}}
    pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_workers_ignore_signals) \
        if workers > 0 else _Inline()
    running: dict[Future, dict[str, Any]] = {}
    started, finished, t0, done, stopped = 0, 0, time.time(), set(), 0
    with _ForwardSignals() as stop:
        try:
            while True:
                busy = {j["key"] + j["kind"] for j in running.values()} | done
                todo = [] if stop.signum else [j for j in planner(g, rows, flops, root)
                                               if j["key"] + j["kind"] not in busy]
                if max_jobs is not None:
                    todo = todo[:max(0, max_jobs - started)]
                while todo and len(running) < max(1, workers):
                    job = todo.pop(0)
                    started += 1
                    running[pool.submit(execute, job, g.recipe, str(root))] = job
                if not running:
                    break
                ready, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in ready:
                    job = running.pop(fut)
                    done.add(job["key"] + job["kind"])
                    try:
                        result = fut.result()
                    except (Stopped, Interrupted, BrokenProcessPool):
                        if not stop.signum:
                            raise
                        stopped += 1
                        continue
                    row = _finish(job, result, rows)
                    finished += 1
                    _progress(finished, len(todo) + len(running), job, row, t0)
                write_csv(csv_path, sorted_rows(rows), COLUMNS)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    if stop.signum:
        print(f"Stopped by {signal.Signals(stop.signum).name}: {stopped} run(s) left a checkpoint, "
              f"{finished} finished; the same command resumes them.", flush=True)
        raise SystemExit(STOPPED_EXIT)
    return rows


def _workers_ignore_signals() -> None:
    """A worker heeds SIGINT and SIGTERM only while it trains (the trainer's own handlers, which stop at a step with
    a checkpoint): an idle worker that died of one would break the pool, and the pool then kills the others
    mid-checkpoint; a zero-shot job runs to its end (it has nothing to checkpoint)."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)


class _ForwardSignals:
    """While the grid runs (main thread only): the first SIGINT or SIGTERM goes on to the worker processes, whose
    runs stop at their next step with a checkpoint (progressive.run.stop); no job starts after it, and the grid exits
    75 once the running ones have ended, so the same command resumes them. A scheduler or ``kill`` that signals only
    this process loses no work. A second signal acts as it would without this (and reaches the workers too)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _ForwardSignals:
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)

    def _handle(self, signum: int, frame: Any) -> None:
        second = self.signum is not None
        self.signum = self.signum or signum
        if not second:
            print(f"{signal.Signals(signum).name}: the running jobs stop at their next step with a checkpoint "
                  "(a second signal stops at once)", flush=True)
        for p in multiprocessing.active_children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signum)
        if second:
            self.__exit__()
            os.kill(os.getpid(), signum)


class _Inline:
    """An executor that runs each job in this process as it is submitted (``--workers 0``: tests, debugging)."""

    def submit(self, fn: Any, *args: Any) -> Future:
        fut: Future = Future()
        fut.set_result(fn(*args))
        return fut

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


def _job_of_row(g: Grid, r: dict[str, Any], flops: dict[tuple[int, int], int]) -> dict[str, Any]:
    """The job that would produce frontier row ``r`` again (``--retime``)."""
    method = "baseline" if r["method"] == "baseline" else method_of(r["variant"])
    return make_job(g, method, r["variant"], envelope.size_of(r), int(r["budget"]), float(r["lr"]), int(r["seed"]),
                    flops, 0)


def _finish(job: dict[str, Any], result: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    if job["kind"] in ("zeroshot", "retime", "reproduce"):
        row = next(r for r in rows if r["key"] == job["key"])
        if job["kind"] == "reproduce":  # printed beside the row, which stays as it is
            return {**result, "row_test_loss": float(row["test_loss"]), "row_val_loss": float(row["val_loss"]),
                    "row_code_version": row["code_version"]}
        if job["kind"] == "retime":

            row["loss_diff"] = apply(row, result)
        else:
            row.update(result)
        return row
    rows.append(result)
    return result


def _progress(n: int, left: int, job: dict[str, Any], row: dict[str, Any], t0: float) -> None:
    per = (time.time() - t0) / n
    m = job.get("meta", row)
    what = (f"{m['method']}/{m['variant']} {m['layers']}x{m['width']} lr {m['lr']:.3g} budget {m['budget']} "
            f"seed {m['seed']}")
    got = (f"zero-shot LAMBADA acc {row['lambada_acc']:.3f}" if job["kind"] == "zeroshot" else
           f"test {row['test_loss']:.4f} val {row['val_loss']:.4f}, {row['wall_s']:.0f} s"
           + (f" (re-timed; test loss differs by {row['loss_diff']:.2g})" if job["kind"] == "retime" else "")
           + (f" (reproduced by code {row['code_version']}: test {row['test_loss']:.6g} val {row['val_loss']:.6g}; "
              f"the row, by code "
              f"{row['row_code_version']}: test {row['row_test_loss']:.6g} val {row['row_val_loss']:.6g}; test loss "
              f"differs by {abs(row['test_loss'] - row['row_test_loss']):.2g})" if job["kind"] == "reproduce" else ""))
    print(f"[{n} done, {left} planned now; ETA >= {left * per / 60:.0f} min] {job['kind']} {what}: {got}", flush=True)
