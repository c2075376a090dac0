"""Command line of train.py: parse flags and ``--dotted.key value`` overrides, then train, compare or dry-run."""

from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path

from progressive.config import ConfigError, RunConfig, load_config, to_dict

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"
FLAGS = {"--resume": "resume", "--overwrite": "overwrite", "--dry_run": "dry_run"}

USAGE = """usage: python train.py [--config FILE] [--resume | --overwrite] [--dry_run] [--compare M1,M2]
                      [--section.key VALUE ...]

Trains the model of a YAML recipe (default: configs/default.yaml, a small GPT-2 with a 2-level V-cycle
on the bundled corpus) and writes outputs/<name>/: metrics.jsonl, checkpoints/, final/ (Hugging Face
model + tokenizer), loss_vs_flops.png, loss_vs_wallclock.png, summary.json.

  --config FILE        YAML recipe (configs/*.yaml, launch/recipes/*.yaml)
  --resume             continue outputs/<name>/ from its last checkpoint (the config must be unchanged)
  --overwrite          delete outputs/<name>/ and start again
  --dry_run            validate the recipe, build the models on the meta device, print the phase plan,
                       parameter counts and planned FLOPs against the baseline; no data, no training
  --compare M1,M2      run each method on the same data, budget and seed (outputs/<name>/<method>/) and
                       report the FLOPs and wall-clock at which each reaches the first one's final
                       validation loss ("% saved"), with a table, compare.json and compare.png
  --KEY VALUE          override any config field by its dotted path, e.g. --train.lr 3e-4,
                       --model.family llama, --method.vcycle.levels.1.down.fraction 0.4; a unique field
                       name of a section also works (--report_to wandb, --steps 100)
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
    raise ConfigError(f"--{key}: unknown option or config field (see python train.py --help)")


def parse(argv: list[str]) -> tuple[Path, dict[str, str], dict[str, object]]:
    """Split argv into (config path, {dotted key: value text}, {flag: value}).

    Raises:
        ConfigError: an option without a value, or an unknown/ambiguous field name.
    """
    path, overrides, flags = DEFAULT_CONFIG, {}, {"resume": False, "overwrite": False, "dry_run": False,
                                                   "compare": None}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in FLAGS:
            flags[FLAGS[arg]] = True
            i += 1
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
            path = Path(value)
        elif key == "compare":
            flags["compare"] = [m.strip() for m in value.split(",") if m.strip()]
        else:
            overrides[_resolve(key)] = value
    return path, overrides, flags


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code (2 for bad input, 1 for a NaN/inf stop)."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    from progressive.trainer import NonFiniteLoss, Trainer

    try:
        path, overrides, flags = parse(argv)
        cfg = load_config(path, overrides)
        if flags["dry_run"]:
            from progressive.report.dryrun import dry_run

            dry_run(cfg)
            return 0
        if flags["compare"]:
            from progressive.report.compare import compare

            compare(cfg, flags["compare"], overwrite=bool(flags["overwrite"]))
            return 0
        Trainer(cfg, resume=bool(flags["resume"]), overwrite=bool(flags["overwrite"])).run()
        return 0
    except (ConfigError, FileNotFoundError, FileExistsError, ValueError) as e:  # bad input: message only
        print(f"error: {e}", file=sys.stderr)
        return 2
    except NonFiniteLoss as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
