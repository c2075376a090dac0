"""Command line of train.py: parse flags and ``--dotted.key value`` overrides, then train, compare or dry-run."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

from common import paths
from common.cli import program, run_cli
from common.paths import CONFIGS, recipes
from common.quiet import quiet_transformers
from progressive.config import ConfigError, RunConfig, flatten, load_config, mark, to_dict
from progressive.config.fields import help_of
from progressive.config.reader import read_yaml
from progressive.run.stop import ignore_repeats_at_exit

if TYPE_CHECKING:  # the plan's module loads torch: named for the type only
    from progressive.run.start import Plan

DEFAULT_CONFIG = CONFIGS / "default.yaml"
FLAGS = {"--resume": "resume", "--overwrite": "overwrite", "--dry_run": "dry_run", "--list": "list",
         "--print_config": "print_config"}

USAGE = """usage: python train.py [--config FILE|NAME] [--resume [auto] | --overwrite] [--dry_run] [--compare M1,M2]
                      [--section.key VALUE ...] | --list | --print_config

Trains the model of a YAML recipe (default: configs/default.yaml, a small GPT-2 with a 2-level V-cycle
on the bundled corpus) and writes outputs/<name>/: metrics.jsonl, checkpoints/, final/ (Hugging Face
model + tokenizer), loss_vs_flops.png, loss_vs_wallclock.png, summary.json.

  --config FILE|NAME   YAML recipe: a file, or a recipe's name (configs/<name>.yaml or
                       launch/recipes/<name>.yaml; --list shows them all)
  --list               print every recipe with its first comment line, and exit
  --print_config       print every config field with its value and where it came from (default, recipe,
                       flag), and exit; with --resume, the saved run's config
  --resume             continue outputs/<name>/ from its newest good checkpoint, with the config the run
                       saved (no need to repeat --config or overrides; --name/--output_dir find the run).
                       Overrides may change train.lr and bookkeeping fields (a warning is printed); a
                       change to anything that defines the run (model, data, method, budget) is refused.
                       A run folder moved or renamed resumes from its new --output_dir/--name, and
                       --data.dataset / --data.tokenizer may name a moved copy: its content must be the same
  --resume auto        resume when outputs/<name>/ holds a checkpoint, start fresh when it holds none (a job
                       killed before its first checkpoint is resubmitted unchanged; a finished run exits 0):
                       the command a cluster job repeats (launch/slurm.sh)
  --overwrite          delete outputs/<name>/ and start again
  --dry_run            validate the recipe, build the models on the meta device, print the phase plan,
                       parameter counts and planned FLOPs against the baseline; no data, no training
  --compare M1,M2      run each method on the same data, budget and seed (outputs/<name>/<method>/) and
                       report the FLOPs and wall-clock at which each reaches the first one's final
                       validation loss ("% saved"), with a table, compare.json and compare.png; with
                       --resume, finished methods are reused and an interrupted one continues
  --name auto          a run name made from the recipe and the overrides (baseline-lr0.004-seed1): one
                       folder per trial of a sweep (launch/sweeps/)
  --KEY VALUE          override any config field by its dotted path, e.g. --train.lr 3e-4,
                       --model.family llama, --method.vcycle.levels.1.down.fraction 0.4; a unique field
                       name of a section also works (--report_to wandb, --steps 100)
  --debug              show the full traceback of an error instead of one line

Exit codes: 0 done (or the run was already finished), 1 the loss became NaN/inf, 2 bad input (one line
on stderr naming the field, file or path: unknown keys, bad values, a full disk, a read-only folder),
75 stopped by SIGINT (Ctrl-C) or SIGTERM at a step boundary after writing a checkpoint (the command that
resumes is printed), 130 / 143 stopped at once by a second Ctrl-C / SIGTERM (or no step boundary within
train.stop_timeout seconds): the last complete checkpoint is intact and resumes.
"""


def _resolve(key: str) -> str:
    """Map a flag name to a dotted config path (unique section fields may drop the section)."""
    if "." in key or key in {f.name for f in fields(RunConfig)}:
        return key
    tree = to_dict(RunConfig())
    hits = [f"{sec}.{key}" for sec, sub in tree.items() if isinstance(sub, dict) and key in sub]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise ConfigError(f"--{key}: ambiguous, use one of {', '.join('--' + h for h in hits)}")

    raise ConfigError(f"--{key}: unknown option or config field (see {program()} --help)")


def _recipe(value: str) -> Path:
    """``--config`` value -> a file: the path when it exists, else the recipe of that name (a clone's or an
    install's configs/ and launch/recipes/), else the path (whose absence load_config reports)."""

    path = Path(value).expanduser()
    if path.exists():
        return path
    return recipes().get(value.removesuffix(".yaml"), path)


def list_recipes() -> str:
    """Every recipe, one line each: its name, its first comment line, and where it is (``configs/<name>.yaml`` or
    ``launch/recipes/<name>.yaml``, also from an install, whose folders are named otherwise)."""

    lines = []
    for name, path in sorted(paths.recipes().items(), key=lambda kv: (kv[1].parent != paths.CONFIGS, kv[0])):
        first = next((ln.lstrip("# ").strip() for ln in path.read_text().splitlines() if ln.startswith("#")), "")
        where = f"configs/{path.name}" if path.parent == paths.CONFIGS else f"launch/recipes/{path.name}"
        lines.append(f"{name:<28} {first}  [{where}]")
    return "\n".join(lines)


def print_config(path: Path | None, overrides: dict[str, str], cfg: RunConfig, base: dict | None = None) -> str:
    """Every field of ``cfg`` with its value, where it came from: "flag" (an override), "recipe" (the file
    at ``path``, or a resumed run's saved config ``base``), or "default", and what it means where the code says
    (config.fields.help_of: the field's docstring sentence or comment)."""
    import yaml

    written = flatten(base) if base is not None else {}
    if path is not None and base is None:
        written = flatten(read_yaml(Path(path).read_text(), str(path)) or {})
    where = "saved run" if base is not None else "recipe"

    def source(key: str) -> str:
        if any(key == k or key.startswith(k + ".") for k in overrides):
            return "flag"
        if any(key == k or key.startswith(k + ".") for k in written):
            return where
        return "default"

    out = []
    for key, value in flatten(to_dict(cfg)).items():
        if key.startswith("method.") and key.split(".")[1] not in ("name", cfg.method.name):
            continue  # another method's options: they do not apply to this run
        shown = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()
        meaning = help_of(RunConfig, key)
        out.append(f"{key}: {shown}  ({source(key)})" + (f"  # {meaning}" if meaning else ""))
    return "\n".join(out)


def parse(argv: list[str]) -> tuple[Path, dict[str, str], dict[str, object]]:
    """Split argv into (config path, {dotted key: value text}, {flag: value}).

    Raises:
        ConfigError: an option without a value, or an unknown/ambiguous field name.
    """
    path, overrides, flags = DEFAULT_CONFIG, {}, {"resume": False, "overwrite": False, "dry_run": False,
                                                   "compare": None, "list": False, "print_config": False}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in FLAGS:
            flags[FLAGS[arg]] = True
            i += 1
            if arg == "--resume" and i < len(argv) and argv[i] == "auto":
                flags["resume"], i = "auto", i + 1
            continue
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg!r}; options start with -- (see --help)")
        key, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise ConfigError(f"--{key}: needs a value")
            value = argv[i + 1]
            i += 1
        i += 1
        if key == "config":
            path = _recipe(value)
        elif key == "compare":
            flags["compare"] = [m.strip() for m in value.split(",") if m.strip()]
            if not flags["compare"]:  # an empty list would train the recipe's one method, as if no --compare
                raise ConfigError(f"--compare: give two or more different methods, e.g. baseline,vcycle; got {value!r}")
        else:
            overrides[_resolve(key)] = value
    if overrides.get("name") == "auto":
        overrides["name"] = auto_name(path, overrides)
    return path, overrides, flags


def auto_name(path: Path, overrides: dict[str, str]) -> str:
    """``--name auto``: a run name from the recipe and the overrides (``baseline-lr0.004-seed1``), the same for
    the same command, so each trial of a sweep gets its own folder and a requeued trial resumes its own."""

    # what the field's mark says names no trial (its place, bookkeeping such as a tracker or group) is left out
    parts = [f"{k.rsplit('.', 1)[-1]}{v}" for k, v in sorted(overrides.items()) if mark(k).trial]
    name = re.sub(r"[^A-Za-z0-9._=+-]", "_", "-".join([Path(path).stem, *parts]))
    if len(name) > 80:  # long sweeps: the recipe and a digest of the overrides
        name = f"{Path(path).stem}-{hashlib.sha256('-'.join(parts).encode()).hexdigest()[:12]}"
    return name


def _main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        from common.cli import program  # only for --help: the quick path imports nothing else

        print(USAGE.replace("python train.py", program()))
        return 0
    path, overrides, flags = parse(argv)
    if flags["list"]:
        print(list_recipes())
        return 0
    explicit = any(a == "--config" or a.startswith("--config=") for a in argv)
    if flags["resume"] is True and flags["overwrite"]:
        raise ConfigError("--resume and --overwrite: choose one (--resume continues the run, --overwrite deletes it "
                          "and starts again)")
    cfg = load_config(path, overrides)  # the recipe with the flags, loaded once; it names the run's folder
    if flags["print_config"] and not flags["resume"]:
        print(print_config(path, overrides, cfg))
        return 0
    plan = None
    if flags["resume"] or not flags["dry_run"]:  # one run or a comparison, fresh or resumed: progressive/run/start.py
        from progressive.run.start import plan_run  # loads torch: not for --help / --list / --print_config

        methods = flags["compare"] or ([] if flags["dry_run"] else None)  # a dry run plans the recipe's one run
        trains = not flags["dry_run"] and not flags["print_config"]  # decided under the run's lock, held to the end
        plan = plan_run(cfg, overrides, flags["resume"], bool(flags["overwrite"]), methods, explicit, lock=trains)
        cfg = plan.cfg
    try:
        return _carry_out(path, overrides, flags, cfg, plan)
    finally:
        if plan is not None:
            plan.release()  # a no-op once the trainer or the comparison took the lock over and let it go


def _carry_out(path: Path | None, overrides: dict[str, str], flags: dict, cfg: RunConfig,
               plan: Plan | None) -> int:
    """What the command does once it is planned: print the config, dry-run, compare, or train."""
    if flags["print_config"]:
        print(print_config(None if plan.base is not None else path, overrides, cfg, plan.base))
        return 0
    if cfg.train.cpu and "CUDA_VISIBLE_DEVICES" not in os.environ:
        # train.cpu means no GPU is touched: with GPUs visible, Accelerate's CPU barrier (gloo, several
        # processes) addresses cuda:<local rank>, which fails ("invalid device ordinal") where there are
        # fewer GPUs than processes. Hidden before anything initialises CUDA.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    if flags["dry_run"]:
        from progressive.report.dryrun import dry_run  # loads torch and transformers

        dry_run(cfg)
        return 0
    if plan.methods:
        from progressive.report.compare import compare  # loads torch and transformers

        if cfg.parallel.pipeline != "none":
            raise ConfigError("--compare runs every method in this one process; set parallel.pipeline none for it")

        compare(cfg, plan.methods, overwrite=plan.overwrite, resume=plan.resume)
        return 0
    # torch and transformers load here, not for --help / --list
    from progressive.run.engine import DataParallel  # heavy: torch
    from progressive.run.trainer import Trainer  # heavy: torch, transformers

    engine = DataParallel
    if cfg.parallel.pipeline != "none":  # PipeTransformer's AutoPipe + AutoDP: one process per pipeline stage
        from progressive.pipeline.engine import PipelineEngine as engine  # noqa: N813
    Trainer(cfg, plan.start, engine=engine).run()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code: 0 done (or already finished), 1 a NaN/inf stop, 2 bad
    input (one line naming the field or path; ``--debug`` shows the traceback), 75 stopped by a signal
    after a checkpoint, 130/143 stopped at once (see USAGE)."""

    # named, not imported: --help, --list and --print_config never load the trainer (nor torch)
    return run_cli(_main, argv, exit_codes={"progressive.run.trainer:NonFiniteLoss": 1,
                                            "progressive.run.start:RunFinished": 0,
                                            "progressive.run.stop:Stopped": 75,
                                            "progressive.run.stop:Interrupted": 130})


def entry() -> int:
    """The ``growtrain-train`` console command (and train.py): transformers' advisory warnings off, then main."""

    quiet_transformers()
    ignore_repeats_at_exit()  # this process: a signal repeated while it exits after a stop is the same request
    return main()
