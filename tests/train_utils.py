"""Tiny configs for the trainer tests (hidden 32, 2 layers, vocab 384, a few steps): fast on 2 CPU cores."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

from progressive.config import RunConfig, load_config
from progressive.run.tracking import MEASURED
from tests.procs import run_tree

ROOT = Path(__file__).resolve().parents[1]
CACHE = str(ROOT / ".cache" / "data")  # shared with the data tests: tokenizers and blocks are built once

TEXT = {"gpt2": "bpe", "llama": "bpe", "bert": "wordpiece"}


def tiny_cfg(out: Path, family: str = "gpt2", method: str = "vcycle", **overrides: object) -> RunConfig:
    """A tiny run of ``family`` with ``method`` under ``out``; ``overrides`` use dotted keys with '__' for '.'."""
    over: dict[str, object] = {
        "name": f"{family}-{method}", "output_dir": str(out), "model.family": family,
        "model.hidden_size": 32, "model.num_layers": 2, "model.num_heads": 2,
        "data.cache_dir": CACHE, "data.seed": 0,
        "train.steps": 10, "train.batch_size": 8, "train.lr": 3e-3, "train.eval_every": 5,
        "train.eval_batches": 1, "train.checkpoint_every": 5, "train.progress": False,
        "train.threads": 1,  # as conftest: a second thread on a busy core makes a tiny run ~10x slower
        "train.plots": False,  # drawn where a test looks at them (train__plots=True): a second or so a run
        "method.name": method,
        "method.vcycle.levels": [
            {"alpha": 0.25, "down": {"fraction": 0.2, "warmup": 0.5}, "up": {}},
            {"width": 2, "depth": 2, "down": {"fraction": 0.4, "lr_scale": 2.0}},
        ],
    }
    if family in TEXT:
        over.update({"data.tokenizer": TEXT[family], "data.vocab_size": 384, "data.seq_len": 32,
                     "data.max_tokens": 40000})
    else:
        over.update({"data.dataset": "cifar10", "data.image_size": 16, "data.max_images": 128,
                     "model.patch_size": 4})
    over.update({k.replace("__", "."): v for k, v in overrides.items()})
    return load_config(None, over)


def rows(run_dir: Path, kind: str | None = None) -> list[dict]:
    """metrics.jsonl rows of a run (optionally one kind)."""
    out = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in out if kind is None or r["kind"] == kind]


def torchrun(*cfgs: RunConfig, nproc: int = 2, timeout: int = 400, resume: bool | str = False,
             last_env: dict | None = None) -> subprocess.CompletedProcess:
    """train.py under ``torchrun --standalone --nproc_per_node nproc`` with each of ``cfgs`` (written next to its
    run folder), all in one launch (tests/train_many.py) when there are several, each with ``--resume`` when
    ``resume`` (``--resume auto`` when it is "auto"); asserts each succeeded with that world size.
    ``last_env``: environment for the last config's run alone (a kill or a stop: tests/train_many.py), which ends
    the launch; the others are asserted as above, the last one and the launch's exit are the caller's to check.
    (``accelerate launch --cpu --num_processes N`` starts one process with accelerate 1.15, docs/cluster.md;
    torchrun + Accelerator(cpu=True) gives a real gloo group.)"""
    from progressive.config import dump_yaml

    paths = []
    for cfg in cfgs:
        path = Path(cfg.output_dir) / f"{cfg.name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dump_yaml(cfg))
        paths.append(str(path))
    from tests.train_many import LAST_ENV

    assert last_env is None or len(cfgs) > 1, "last_env: a launch of several configs (tests/train_many.py)"
    script = ROOT / ("train.py" if len(cfgs) == 1 else "tests/train_many.py")
    args = ([str(script), "--config", paths[0]] if len(cfgs) == 1 else [str(script), *paths]) + \
        (["--resume"] if resume else []) + ([resume] if isinstance(resume, str) else [])
    proc = run_tree([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
                     *args], capture_output=True, text=True, timeout=timeout + 60 * (len(cfgs) - 1), cwd=ROOT,
                    env={**os.environ, **({LAST_ENV: json.dumps(last_env)} if last_env else {})})
    assert last_env is not None or proc.returncode == 0, proc.stderr[-3000:]
    for cfg in cfgs[:-1] if last_env else cfgs:
        assert json.loads((cfg.run_dir / "summary.json").read_text())["world_size"] == nproc, proc.stderr[-3000:]
    return proc


def stderr_of(proc: subprocess.CompletedProcess, cfg: RunConfig) -> str:
    """The main process's stderr of ``cfg``'s run in a ``torchrun(*cfgs)`` launch of several (tests/train_many.py
    marks where each run starts)."""
    from tests.train_many import MARK

    mark = f"{MARK}{Path(cfg.output_dir) / f'{cfg.name}.yaml'}\n"
    assert mark in proc.stderr, mark
    return proc.stderr.split(mark, 1)[1].split(MARK, 1)[0]


WALL_CLOCK = MEASURED  # measured time and memory: the only keys a resumed run may change


def train_cli(config_path: Path, *extra: str, env: dict | None = None, nproc: int = 1,
              timeout: int = 400) -> subprocess.CompletedProcess:
    """``python train.py --config config_path *extra`` (``nproc`` > 1: under torchrun) with ``env`` added to
    the environment; returns the finished process (the caller checks its return code)."""

    launch = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                  "--nproc_per_node", str(nproc)]
    return run_tree([*launch, str(ROOT / "train.py"), "--config", str(config_path), *extra],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})


def train_here(config_path: Path | None, *extra: object) -> subprocess.CompletedProcess:
    """``python train.py --config config_path *extra`` (no --config when None) in this process: the same command
    line code, without a second interpreter's start-up (most of a tiny run's time). For runs nobody kills or
    signals: those need their own process. Its stdout and stderr are what the run printed, the warnings it
    raised appended to stderr as a process would show them (Python's default filters, not pytest's); the
    environment and torch's thread count are put back afterwards."""

    import torch

    from progressive.cli import main

    argv = (["--config", str(config_path)] if config_path is not None else []) + [str(a) for a in extra]
    out, err = io.StringIO(), io.StringIO()
    env, threads = dict(os.environ), torch.get_num_threads()
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            warnings.resetwarnings()  # what `python train.py` starts with
            warnings.simplefilter("default")
            for quiet in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.simplefilter("ignore", quiet)
            code = main(argv)
    finally:
        os.environ.clear()
        os.environ.update(env)
        torch.set_num_threads(threads)
    text = err.getvalue() + "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line)
                                    for w in caught)
    return subprocess.CompletedProcess(["train.py", *argv], code, out.getvalue(), text)


def assert_same_rows(ref_dir: Path, run_dir: Path) -> int:
    """Assert that two runs' whole metrics.jsonl agree row for row on every key but the WALL_CLOCK ones
    (bit for bit: floats compared exactly); returns the number of rows compared."""
    a, b = rows(ref_dir), rows(run_dir)
    strip = lambda r: {k: v for k, v in r.items() if k not in WALL_CLOCK}  # noqa: E731
    diffs = [(x["kind"], x["step"], {k: (x.get(k), y.get(k)) for k in strip(x).keys() | strip(y).keys()
                                     if x.get(k) != y.get(k)})
             for x, y in zip(a, b) if strip(x) != strip(y)]
    assert len(a) == len(b) and not diffs, (len(a), len(b), diffs[:4])
    return len(a)
