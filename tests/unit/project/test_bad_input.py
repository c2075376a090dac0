"""Bad input, table-driven: every probe is a command a user could type, the exit code it must give, the words
its one-line error must hold, and a check that nothing outside the run's own folder changed (the sandbox
around it holds a finished run, a folder of the user's, a user's JSON file and damaged checkpoints).

Each probe runs the CLI in this process (bench scripts as subprocesses) with the sandbox as the working
directory. A probe that must fail prints exactly one ``error:`` line and no traceback.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import pickle
import runpy
import shutil
import sys
import warnings
from pathlib import Path

import pytest

import progressive.run.plots as plots
from eval import deit_transfer, glue, zeroshot
from operators.cli import main as operators_cli
from progressive import cli as train_cli
from progressive.run.trainer import Trainer
from tests.train_utils import CACHE, ROOT, tiny_cfg

TINY = ["--config", str(ROOT / "configs" / "tiny_test.yaml"), "--data.cache_dir", CACHE, "--output_dir", "out",
        "--train.steps", "2", "--method.name", "baseline", "--train.plots", "false"]
CLIS = {"train": train_cli.main, "operators": operators_cli, "zeroshot": zeroshot.cli, "glue": glue.cli,
        "deit": deit_transfer.cli}

# (id, cli, argv, exit code, words of the one-line error)
PROBES = [
    # run names, run folders and what --overwrite may delete
    ("name-dotdot", "train", [*TINY, "--name", ".."], 2, "name: a run name is one folder name"),
    ("name-escapes", "train", [*TINY, "--name", "../../x"], 2, "name: a run name is one folder name"),
    ("output-dir-empty", "train", [*TINY, "--output_dir", ""], 2,
     "output_dir: empty; give a path or name ('.' names the working folder)"),
    ("dataset-empty", "train", [*TINY, "--data.dataset", " "], 2, "data.dataset: empty"),
    ("compare-nothing", "train", [*TINY, "--compare", " , "], 2,
     "--compare: give two or more different methods, e.g. baseline,vcycle; got ' , '"),
    ("compare-name-dotdot", "train", [*TINY, "--compare", "baseline,vcycle", "--name", ".."], 2,
     "name: a run name is one folder name"),
    ("compare-into-a-user-folder", "train", [*TINY, "--compare", "baseline,vcycle", "--output_dir", ".", "--name",
                                             "mine"], 2, "was not created by train.py"),
    ("overwrite-a-user-folder", "train", [*TINY, "--output_dir", ".", "--name", "mine", "--overwrite"], 2,
     "was not created by train.py (no .growtrain-run marker; it holds thesis.tex); it is never deleted"),
    ("run-over-a-file", "train", [*TINY, "--output_dir", ".", "--name", "notes.json"], 2, "is not a folder"),
    # a fresh start empties its folder: never one that holds an input (the operators' rule, in train.py too)
    ("overwrite-holds-its-init-from", "train", [*TINY, "--output_dir", ".", "--name", "run", "--overwrite",
                                                "--model.init_from", "run/final"], 2,
     "model.init_from: run/final is inside the run folder run, which a fresh start empties"),
    ("overwrite-holds-its-dataset", "train", [*TINY, "--output_dir", ".", "--name", "run", "--overwrite",
                                              "--data.dataset", "run/summary.json"], 2,
     "data.dataset: run/summary.json is inside the run folder"),
    ("overwrite-holds-its-tokenizer", "train", [*TINY, "--output_dir", ".", "--name", "run", "--overwrite",
                                                "--data.tokenizer", "run/final"], 2,
     "data.tokenizer: run/final is inside"),
    ("cache-inside-the-run", "train", [*TINY, "--output_dir", ".", "--name", "run", "--overwrite",
                                       "--data.cache_dir", "run/cache"], 2, "data.cache_dir: run/cache is inside"),
    ("compare-holds-its-init-from", "train", [*TINY, "--compare", "baseline,vcycle", "--output_dir", ".", "--name",
                                              "run", "--overwrite", "--model.init_from", "run/final"], 2,
     "model.init_from: run/final is inside the run folder"),
    ("lock-is-a-symlink", "train", [*TINY, "--output_dir", ".", "--name", "locked"], 2,
     "was not created by train.py (no .growtrain-run marker; it holds .lock)"),
    ("lock-is-a-users-file", "train", [*TINY, "--output_dir", ".", "--name", "userlock"], 2,
     "was not created by train.py (no .growtrain-run marker; it holds .lock)"),
    ("resume-nothing", "train", [*TINY, "--name", "never", "--resume"], 2, "no checkpoint"),
    ("resume-finished-run", "train", ["--output_dir", ".", "--name", "run", "--resume"], 0, "is a finished run"),
    # sizes and counts
    ("max-tokens-negative", "train", [*TINY, "--data.max_tokens", "-5"], 2, "data.max_tokens: must be >= 1"),
    ("max-tokens-zero", "train", [*TINY, "--data.max_tokens", "0"], 2, "data.max_tokens: must be >= 1"),
    ("vocab-zero", "train", [*TINY, "--data.vocab_size", "0"], 2, "data.vocab_size: must be >= 1"),
    ("image-size-zero", "train", [*TINY, "--model.family", "vit", "--data.dataset", "cifar10", "--data.image_size",
                                  "0"], 2, "data.image_size: must be >= 1"),
    ("max-images-negative", "train", [*TINY, "--model.family", "vit", "--data.dataset", "cifar10",
                                      "--data.max_images", "-1"], 2, "data.max_images: must be >= 1"),
    ("threads-zero", "train", [*TINY, "--train.threads", "0"], 2, "train.threads: must be >= 1"),
    ("kv-heads-zero", "train", [*TINY, "--model.num_kv_heads", "0"], 2, "model.num_kv_heads: must be >= 1"),
    ("steps-zero", "train", [*TINY, "--train.steps", "0"], 2, "train.steps: must be >= 1"),
    ("batch-negative", "train", [*TINY, "--train.batch_size", "-8"], 2, "train.batch_size"),
    ("seed-negative", "train", [*TINY, "--train.seed", "-1"], 2, "train.seed: a seed in 0 .. 2**32 - 1"),
    ("lr-infinite", "train", [*TINY, "--train.lr", "inf"], 2, "train.lr: must be a finite number"),
    ("cache-mb-negative", "train", [*TINY, "--method.autofreeze.cache.memory_mb", "-1"], 2,
     "method.autofreeze.cache.memory_mb: a size in MiB, >= 0 and finite"),
    ("alpha-negative", "train", [*TINY, "--method.vcycle.levels.0.alpha", "-0.5"], 2,
     "method.vcycle.levels.0.alpha: must be >= 0"),
    ("stop-timeout-negative", "train", [*TINY, "--train.stop_timeout", "-1"], 2, "train.stop_timeout"),
    ("fsdp-reduce-fp16", "train", [*TINY, "--train.fsdp_reduce_dtype", "fp16"], 2,
     "train.fsdp_reduce_dtype: one of fp32, bf16, got 'fp16'"),
    ("threads-huge", "train", [*TINY, "--train.threads", "100000"], 2, "train.threads: at most 1,024, got 100,000"),
    ("hidden-size-huge", "train", [*TINY, "--model.hidden_size", "10000000", "--model.num_heads", "2"], 2,
     "model.hidden_size: at most 65,536"),
    ("val-fraction-one", "train", [*TINY, "--data.val_fraction", "1"], 2, "data.val_fraction: must be in (0, 1)"),
    ("name-too-long", "train", [*TINY, "--name", "x" * 300], 2, "name: at most 255 bytes"),
    ("resume-and-overwrite", "train", [*TINY, "--name", "run", "--output_dir", ".", "--resume", "--overwrite"], 2,
     "--resume and --overwrite: choose one"),
    ("compare-over-a-run", "train", [*TINY, "--compare", "baseline,vcycle", "--output_dir", ".", "--name", "run"], 2,
     "give this comparison its own --name"),
    # recipes and flags
    ("config-missing", "train", ["--config", "nope.yaml"], 2, "--config nope.yaml: no such file"),
    ("config-duplicate-key", "train", ["--config", "dup.yaml"], 2,
     "--config dup.yaml: line 3: key 'train' is given twice (first on line 2)"),
    ("config-alias-bomb", "train", ["--config", "bomb.yaml"], 2, "expands to more than 100,000 values"),
    ("config-deep-nesting", "train", ["--config", "deep.yaml"], 2, "nested more than 64 levels deep"),
    ("config-binary-name", "train", ["--config", "binary.yaml"], 2, "tag:yaml.org,2002:binary values are not read"),
    ("config-utf16", "train", ["--config", "utf16.yaml"], 2,
     "--config utf16.yaml: not UTF-8 text (byte 0xff at offset 0); save the file as UTF-8"),
    ("steps-past-64-bits", "train", [*TINY, "--train.steps", "99999999999999999999999999999"], 2,
     "train.steps: '99999999999999999999999999999' is out of range (a 64-bit integer)"),
    ("cli-list-alias-bomb", "train", [*TINY, "--method.name", "apollo", "--method.apollo.layers",
                                      "[&a [1,1,1,1,1,1,1,1,1,1], " + ", ".join(
                                          f"&{c} [" + ",".join([f"*{p}"] * 10) + "]" for p, c in zip("abcd", "bcde"))
                                      + ", [" + ",".join(["*e"] * 10) + "]]"], 2,
     "--method.apollo.layers: expands to more than"),
    ("config-complex-key", "train", ["--config", "complex.yaml"], 2,
     "--config complex.yaml: line 2: the key ['a', 'b'] is not a string; a recipe's keys are names of settings"),
    ("config-number-key", "train", ["--config", "numkey.yaml"], 2,
     "--config numkey.yaml: line 2: the key 1 is not a string; a recipe's keys are names of settings"),
    ("unknown-field", "train", [*TINY, "--train.lrr", "1"], 2, "unknown"),
    # paths the file system refuses: named in one line, never its traceback
    ("config-name-too-long", "train", ["--config", "x" * 5000], 2,
     f"...{'x' * 40} (5,000 characters): a name in this path is too long for the file system"),
    ("output-dir-name-too-long", "train", [*TINY, "--output_dir", "x" * 5000], 2,
     "a name in this path is too long for the file system (at most 255 bytes a name"),
    ("output-dir-symlink-loop", "train", [*TINY, "--output_dir", "loop"], 2,
     "symbolic links lead back to themselves here (a link loop); fix or remove the link"),
    ("output-dir-under-a-file", "train", [*TINY, "--output_dir", "notes.json/runs"], 2,
     "notes.json/runs/tiny: part of this path is a file, not a folder"),
    ("op-input-symlink-loop", "operators", ["coalesce", "loop", "small"], 2,
     "symbolic links lead back to themselves here (a link loop)"),
    ("op-out-name-too-long", "operators", ["coalesce", "run/final", "x" * 5000], 2,
     "a name in this path is too long for the file system"),
    ("unknown-tracker", "train", [*TINY, "--report_to", "mlflow"], 2, "train.report_to: one of"),
    # checkpoints to start from
    ("init-from-missing", "train", [*TINY, "--model.init_from", "./missing"], 2, "model.init_from: no such folder"),
    ("init-from-truncated", "train", [*TINY, "--model.init_from", "trunc"], 2, "model.safetensors: truncated"),
    ("init-from-no-weights", "train", [*TINY, "--model.init_from", "noweights"], 2, "no weights"),
    ("init-from-bad-config", "train", [*TINY, "--model.init_from", "badconfig"], 2, "config.json is not valid JSON"),
    ("init-from-wrong-family", "train", [*TINY, "--model.init_from", "vit"], 2,
     "is a 'vit' checkpoint, but model.family is 'gpt2'"),
    # weights that do not fit are an error, never random weights in their place
    ("init-from-other-shapes", "train", [*TINY, "--model.init_from", "reshaped"], 2,
     "model.init_from: reshaped does not fit this GPT2LMHeadModel:"),
    ("init-from-other-names", "train", [*TINY, "--model.init_from", "renamed"], 2, "missing"),
    ("init-from-a-pickle", "train", [*TINY, "--model.init_from", "evilbin"], 2,
     "model.init_from: evilbin: its PyTorch weights file holds more than tensors and is not loaded (torch's "
     "weights-only loader refused it: "),
    ("zeroshot-other-shapes", "zeroshot", ["reshaped", "--tasks", "ptb"], 2, "does not fit this"),
    ("op-other-names", "operators", ["coalesce", "renamed", "small"], 2, "does not fit this GPT2LMHeadModel"),
    # the operators CLI
    ("op-replaces-a-user-folder", "operators", ["coalesce", "run/final", "mine", "--overwrite"], 2,
     "was not created by python -m operators"),
    ("op-replaces-the-run-holding-its-input", "operators", ["coalesce", "run/final", "run", "--overwrite"], 2,
     "contains the input run/final"),
    ("op-out-empty", "operators", ["coalesce", "run/final", ""], 2, "OUT: empty; give an output folder"),
    ("op-replaces-its-input", "operators", ["coalesce", "run/final", "run/final", "--overwrite"], 2,
     "is the input run/final"),
    ("op-interpolate-into-an-input", "operators", ["interpolate", "run/final", "run/final", ".", "--alpha", "0.5",
                                                   "--overwrite"], 2, "contains the input"),
    ("op-truncated", "operators", ["coalesce", "trunc", "small"], 2, "model.safetensors: truncated"),
    ("op-bad-config", "operators", ["coalesce", "badconfig", "small"], 2, "config.json is not valid JSON"),
    ("op-width-zero", "operators", ["coalesce", "run/final", "small", "--width", "0"], 2, "width factor"),
    # the eval CLIs
    ("zeroshot-over-a-user-file", "zeroshot", ["run/final", "--tasks", "ptb", "--output", "notes.json"], 2,
     "notes.json exists and was not written by eval.zeroshot"),
    ("zeroshot-over-a-folder", "zeroshot", ["run/final", "--tasks", "ptb", "--output", "mine"], 2, "is a folder"),
    ("zeroshot-output-under-a-file", "zeroshot", ["run/final", "--tasks", "ptb", "--output", "notes.json/x.json"], 2,
     "notes.json"),
    ("glue-output-under-a-file", "glue", ["--checkpoint", "run/final", "--output", "notes.json/x.json"], 2,
     "notes.json"),
    ("zeroshot-truncated", "zeroshot", ["trunc", "--tasks", "ptb"], 2, "model.safetensors: truncated"),
    ("zeroshot-no-weights", "zeroshot", ["noweights", "--tasks", "ptb"], 2, "no weights"),
    ("zeroshot-batch-zero", "zeroshot", ["run/final", "--tasks", "ptb", "--batch_size", "0"], 2,
     "--batch_size must be >= 1"),
    ("glue-wrong-family", "glue", ["--checkpoint", "run/final", "--tasks", "rte"], 2, "is a 'gpt2' checkpoint"),
    ("glue-truncated", "glue", ["--checkpoint", "trunc", "--tasks", "rte"], 2, "model.safetensors: truncated"),
    ("zeroshot-output-empty", "zeroshot", ["run/final", "--tasks", "ptb", "--output", ""], 2,
     "/run.final.eval_zeroshot.json"),  # the default beside the run, never inside it
    ("glue-output-empty", "glue", ["--checkpoint", "run/final", "--tasks", "rte", "--output", " "], 2,
     "--output: empty"),
    ("deit-output-empty", "deit", ["--checkpoint", "vit", "--output", ""], 2, "--output: empty"),
    ("glue-seeds-empty", "glue", ["--checkpoint", "run/final", "--seeds", ""], 2, "--seeds: give a comma list, got ''"),
    ("glue-tasks-empty", "glue", ["--checkpoint", "run/final", "--tasks", ","], 2, "--tasks: give a comma list"),
    ("glue-lrs-text", "glue", ["--checkpoint", "run/final", "--lrs", "1e-4,fast"], 2, "--lrs: 'fast' is not a number"),
    ("glue-seed-negative", "glue", ["--checkpoint", "run/final", "--seeds", "-1"], 2, "--seeds must be a seed"),
    ("glue-max-train-negative", "glue", ["--checkpoint", "run/final", "--max_train_samples", "-3"], 2,
     "--max_train_samples must be >= 1"),
    ("glue-over-a-user-file", "glue", ["--checkpoint", "run/final", "--output", "notes.json"], 2,
     "was not written by eval.glue"),
    ("deit-wrong-family", "deit", ["--checkpoint", "run/final", "--quick"], 2, "is a 'gpt2' checkpoint"),
    ("deit-image-size-negative", "deit", ["--checkpoint", "vit", "--image_size", "-4"], 2,
     "--image_size must be >= 1"),
    ("deit-over-a-user-file", "deit", ["--checkpoint", "vit", "--quick", "--output", "notes.json"], 2,
     "was not written by eval.deit_transfer"),
]
# bench scripts: (id, module after python -m, its arguments, exit code, words)
BENCH_PROBES = [
    ("bench-out-is-a-user-folder", "bench.claims.vcycle_recipes", ["--out", "mine", "--only", "vcycle_paper"], 2,
     "mine exists and was not created by python -m bench.claims.vcycle_recipes"),
    ("bench-json-is-a-user-file", "bench.speed.operators_timing", ["--json", "notes.json"], 2,
     "notes.json exists and was not written by python -m bench.speed.operators_timing"),
    # every bench script's main runs under common/cli.py's run_cli: a user's error is one line, before any work
    ("bench-claims-config-missing", "bench.claims.apollo", ["--config", "nope.yaml", "--out", "bench_out"], 2,
     "nope.yaml: no such file"),  # (a traceback, after its output folder was made)
    ("bench-claims-unknown-variant", "bench.claims.vcycle_ablation", ["--only", "nope", "--out", "bench_out"], 2,
     "--only: unknown variants ['nope']; choose from paper,"),  # (exit 1, no "error:")
    ("bench-exactness-an-argument", "bench.exactness.depth", ["--width", "3"], 2,
     "unknown arguments --width 3: python -m bench.exactness.depth takes none"),  # (ignored: exit 0)
    ("bench-speed-threads-zero", "bench.speed.operators_timing", ["--threads", "0"], 2,
     "--threads must be >= 1, got 0"),  # (torch's RuntimeError, a traceback)
    ("bench-papers-results-is-a-file", "bench.papers", ["apollo", "--smoke", "--results", "notes.json"], 2,
     "--results notes.json: a file, or under one; name a folder"),  # (mkdir's FileExistsError, a traceback)
]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A finished tiny run, a ViT checkpoint and damaged copies of the run's checkpoint."""
    from transformers import ViTConfig, ViTForImageClassification

    root = tmp_path_factory.mktemp("assets")
    cfg = tiny_cfg(root, method="baseline", name="run", output_dir=str(root), train__steps=2)
    Trainer(cfg).run()
    final = root / "run" / "final"
    ViTForImageClassification(ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=32, image_size=16, patch_size=4,
                                        num_labels=3)).save_pretrained(root / "vit")
    shutil.copytree(final, root / "trunc")
    weights = (root / "trunc" / "model.safetensors").read_bytes()
    (root / "trunc" / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    shutil.copytree(final, root / "noweights")
    (root / "noweights" / "model.safetensors").unlink()
    shutil.copytree(final, root / "badconfig")
    (root / "badconfig" / "config.json").write_text("{ not json")
    (root / "mine").mkdir()
    (root / "mine" / "thesis.tex").write_text("years of work")
    (root / "notes.json").write_text(json.dumps({"my": "notes"}))
    shutil.copytree(final, root / "reshaped")  # config.json and weights of different widths
    conf = json.loads((root / "reshaped" / "config.json").read_text())
    (root / "reshaped" / "config.json").write_text(json.dumps({**conf, "n_embd": conf["n_embd"] * 2}))
    shutil.copytree(final, root / "renamed")  # the right shapes under other names
    from safetensors.torch import load_file, save_file

    tensors = load_file(root / "renamed" / "model.safetensors")
    save_file({k.replace("transformer.h.", "transformer.blocks."): v for k, v in tensors.items()},
              root / "renamed" / "model.safetensors", metadata={"format": "pt"})
    (root / "dup.yaml").write_text("name: dup\ntrain: {batch_size: 4, lr: 0.1}\ntrain: {steps: 2}\n")
    levels = ["a: &a [" + ", ".join(["x"] * 10) + "]"]  # 10**9 values once expanded
    levels += [f"{c}: &{c} [" + ", ".join([f"*{p}"] * 10) + "]" for p, c in zip("abcdefgh", "bcdefghi")]
    (root / "bomb.yaml").write_text("\n".join(levels) + "\nname: *i\n")
    (root / "deep.yaml").write_text("name: " + "[" * 5000 + "]" * 5000 + "\n")
    (root / "binary.yaml").write_text("name: !!binary dGlueQ==\n")
    (root / "utf16.yaml").write_bytes("name: wide\n".encode("utf-16"))
    (root / "complex.yaml").write_text("train:\n  ? [a, b]\n  : 1\n")  # a YAML complex key: a list
    (root / "numkey.yaml").write_text("train:\n  1: 2\n  lrr: 3\n")
    os.symlink("loop", root / "loop")  # a link to itself
    shutil.copytree(final, root / "evilbin")  # a pickle that would run a command if it were unpickled
    (root / "evilbin" / "model.safetensors").unlink()

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch PWNED",))

    (root / "evilbin" / "pytorch_model.bin").write_bytes(pickle.dumps({"transformer.wte.weight": Evil()}))
    (root / "locked").mkdir()  # a lock planted as a link to the user's file
    os.symlink("../notes.json", root / "locked" / ".lock")
    (root / "userlock").mkdir()  # a user's own file named .lock: once written over with the run's pid
    (root / "userlock" / ".lock").write_text("my lock notes")
    return root


@pytest.fixture
def sandbox(assets, tmp_path, monkeypatch):
    box = tmp_path / "box"
    shutil.copytree(assets, box, symlinks=True)
    monkeypatch.chdir(box)
    return box


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` with the sha256 of its content ("dir" for folders, "-> target" for links)."""
    out = {}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = f"-> {os.readlink(p)}" if p.is_symlink() else "dir" if p.is_dir() else \
            hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def check_reply(err: str, code: int, want_code: int, needle: str) -> None:
    assert code == want_code, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    if want_code == 2:
        assert sum(ln.startswith("error: ") for ln in lines) == 1, err[-3000:]
        assert lines[-1].startswith("error: ") and needle in lines[-1], lines[-1]
    else:
        assert needle in err


@pytest.mark.parametrize("probe", PROBES, ids=[p[0] for p in PROBES])
def test_bad_input_is_one_line_and_changes_nothing_around_the_run(sandbox, capsys, probe):
    _, cli, argv, want_code, needle = probe
    before = snapshot(sandbox)
    with warnings.catch_warnings(record=True) as caught:  # what a process would print on stderr too
        warnings.simplefilter("default")
        code = CLIS[cli](list(argv))
    shown = "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in caught)
    check_reply(shown + capsys.readouterr().err, code, want_code, needle)
    assert not shown, shown
    assert snapshot(sandbox) == before


@pytest.mark.parametrize("probe", BENCH_PROBES, ids=[p[0] for p in BENCH_PROBES])
def test_bench_scripts_never_write_into_what_they_did_not_create(sandbox, capsys, monkeypatch, probe):
    """``python -m <module> ...`` as the shell runs it, in this process (its ``__main__`` block, run_cli included:
    an error that escaped it would fail here as a traceback does there; a process each cost ~6 s of imports)."""
    _, module, argv, want_code, needle = probe
    before = snapshot(sandbox)
    monkeypatch.setattr(sys, "argv", [module, *argv])
    for name in (module, f"{module}.__main__"):  # run as the shell runs it, not a second copy of an imported one
        monkeypatch.delitem(sys.modules, name, raising=False)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(SystemExit) as stop:
        warnings.simplefilter("default")  # what the process would print on stderr too
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    shown = "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in caught)
    check_reply(shown + capsys.readouterr().err, stop.value.code, want_code, needle)
    assert not shown, shown
    assert snapshot(sandbox) == before


LIST_PROBES = [("bench.claims.apollo", "--budgets", "300,x", "'x' is not an integer"),
               ("bench.claims.apollo", "--only", "", "give a comma list, got ''"),
               ("bench.claims.autofreeze", "--only", ",", "give a comma list, got ','"),
               ("bench.claims.autofreeze", "--seeds", "0,1.5", "'1.5' is not an integer"),
               ("bench.claims.autofreeze_epochs", "--seeds", "", "give a comma list"),
               ("bench.claims.autofreeze_lm", "--seeds", "", "give a comma list"),
               ("bench.claims.vcycle_ablation", "--only", "", "give a comma list"),
               ("bench.claims.vcycle_recipes", "--method_budgets", " ", "give a comma list")]


@pytest.mark.parametrize("module, flag, value, said", LIST_PROBES, ids=[f"{p[0]}{p[1]}" for p in LIST_PROBES])
def test_a_bench_scripts_empty_or_unreadable_list_is_refused_before_any_work(sandbox, capsys, monkeypatch, module,
                                                                            flag, value, said):
    """An empty list (a script's empty variable) read as "none": vcycle_ablation trained only its baseline,
    apollo only the baseline, autofreeze a task named ''; a non-integer seed was a traceback."""
    main = importlib.import_module(module).main
    monkeypatch.setattr(sys, "argv", [module, flag, value])
    before = snapshot(sandbox)
    with pytest.raises(SystemExit) as stop:
        main()
    assert stop.value.code == 2 and f"argument {flag}: {said}" in capsys.readouterr().err
    assert snapshot(sandbox) == before


def test_wandb_without_a_login_logs_offline_with_a_warning_instead_of_failing(sandbox, capsys, monkeypatch):
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(sandbox / "no-netrc"))
    monkeypatch.setenv("WANDB_DIR", str(sandbox / "out"))
    before = snapshot(sandbox)
    assert train_cli.main([*TINY, "--name", "wb", "--report_to", "wandb"]) == 0
    err = capsys.readouterr().err
    assert "warning: W&B has no credentials here" in err and "Traceback" not in err
    assert os.environ["WANDB_MODE"] == "offline"
    assert list((sandbox / "out" / "wb" / "wandb").glob("offline-run-*"))
    changed = {k for k in snapshot(sandbox).keys() ^ before.keys()} | \
              {k for k, v in before.items() if snapshot(sandbox).get(k) != v}
    assert all(k == "out" or k.startswith("out/") for k in changed)  # only the run's own folder


def test_without_matplotlib_a_run_still_writes_its_checkpoint_and_summary(sandbox, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    monkeypatch.setattr(plots, "_WARNED", [])
    assert train_cli.main([*TINY, "--name", "noplots", "--train.plots", "true"]) == 0  # asked for, and none drawn
    run = sandbox / "out" / "noplots"
    assert (run / "final" / "model.safetensors").is_file() and (run / "summary.json").is_file()
    assert json.loads((run / "summary.json").read_text())["plots"] == []
    assert capsys.readouterr().err.count("warning: no plots: matplotlib cannot be imported") == 1


def test_the_run_lock_never_writes_through_a_link(tmp_path):
    """A ``.lock`` that is a symbolic or a hard link to a user's file is refused; the file keeps its bytes."""
    from progressive.run.rundir import RunLock

    mine = tmp_path / "thesis.tex"
    mine.write_text("years of work")
    for kind, make in (("symbolic", os.symlink), ("hard", os.link)):
        run = tmp_path / kind
        run.mkdir()
        make(mine, run / ".lock")
        with pytest.raises(FileExistsError, match="never written through"):
            RunLock(run).acquire()
        assert mine.read_text() == "years of work"


def test_checkpoints_that_fit_pass_the_early_check_and_misfits_do_not(tmp_path):
    """check_fits reads only safetensors headers: a base model's checkpoint fits its LM-head model (the head is
    new), an MLM's fits a classifier (its ``cls`` head is dropped, ``classifier`` and ``pooler`` are new), and
    other widths are refused, also by the strict load."""
    import torch
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        BertForSequenceClassification,
        GPT2Config,
        GPT2LMHeadModel,
        GPT2Model,
    )

    from common.hf_folder import HEADS, CheckpointFolderError, check_fits, load_weights

    gpt = dict(n_layer=1, n_head=2, vocab_size=50, bos_token_id=0, eos_token_id=0)
    GPT2Model(GPT2Config(n_embd=16, **gpt)).save_pretrained(tmp_path / "base")
    bert = dict(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, intermediate_size=32, vocab_size=50)
    BertForMaskedLM(BertConfig(**bert)).save_pretrained(tmp_path / "mlm")
    with torch.device("meta"):
        lm = GPT2LMHeadModel(GPT2Config(n_embd=16, **gpt))
        wide = GPT2LMHeadModel(GPT2Config(n_embd=32, **gpt))
        cls = BertForSequenceClassification(BertConfig(num_labels=3, **bert))
    check_fits(lm, tmp_path / "base", HEADS)
    check_fits(cls, tmp_path / "mlm", HEADS)
    with pytest.raises(CheckpointFolderError, match="does not fit this GPT2LMHeadModel: .* of other shapes"):
        check_fits(wide, tmp_path / "base", HEADS)
    with pytest.raises(CheckpointFolderError, match="of other shapes"):
        load_weights(GPT2LMHeadModel, tmp_path / "base", HEADS, config=GPT2Config(n_embd=32, **gpt))
    with pytest.raises(CheckpointFolderError, match="missing"):  # a whole model expected: no head may be new
        load_weights(GPT2LMHeadModel, tmp_path / "mlm")


def test_results_that_cannot_be_written_at_the_end_are_printed_not_lost(tmp_path, capsys, monkeypatch):
    """An eval CLI scored everything, then found its output unwritable and lost the results."""
    import eval.report as report

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report, "atomic_write_json", full_disk)
    with pytest.raises(OSError):
        report.save_results({"lambada": {"acc": 0.4321}}, tmp_path / "r.json", "eval.zeroshot")
    out, err = capsys.readouterr()
    assert '"acc": 0.4321' in out and "could not be written" in err
