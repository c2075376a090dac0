"""Each config field's mark (progressive/config/fields.py) is the one answer to what changing it affects: whether it
is part of a bench run's cache key, may change on resume, names a trial, and must match for a baseline overlay. The
cache keys that earlier runs were stored under do not move."""

import re
from pathlib import Path

import pytest

from progressive.cli import auto_name
from progressive.config import (
    ConfigError,
    RunConfig,
    load_config,
    mark,
    read_paths,
    resume_diff,
    to_dict,
    validate,
)

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("recipe", "over", "key"), [
    # computed before the marks replaced the bench's own lists of ignored fields; the last is a committed
    # row of bench/results/frontier_layers.csv (a LAYERS-grid V-cycle job)
    ("configs/default.yaml", {}, "24915ab4a57a98b4"),
    ("configs/default.yaml", {"train.report_to": "wandb", "train.group": "g", "train.fsdp": True, "data.num_proc": 3,
                              "train.fsdp_reduce_dtype": "bf16", "train.peak_tflops": 5.0, "name": "q"},
     "24915ab4a57a98b4"),
    ("configs/default.yaml", {"data.cache_dir": "/x", "name": "q", "output_dir": "o"}, "05cb39a1bcb2c36e"),
    ("configs/tiny_test.yaml", {}, "bbc60bbbcfcc1907"),
])
def test_bench_cache_keys_of_earlier_runs_hold(recipe, over, key):
    from bench.lib.runs import config_hash

    assert config_hash(load_config(ROOT / recipe, over)) == key


def test_a_grid_jobs_key_matches_the_committed_frontier_row():
    from bench.lib import grid

    g = grid.LAYERS
    flops = {s: grid.step_flops_of(g, s) for s in ((4, 64), g.target)}
    job = grid.make_job(g, "vcycle", "vcycle_paper_gstack", (4, 64), 4967, 0.004, 0, flops, 0)
    assert job["key"] == "03dd688cafbe366c"
    assert job["key"] in (ROOT / "bench/results/frontier_layers.csv").read_text()


def test_the_mark_decides_what_a_resume_may_change():
    saved = to_dict(load_config(None, {"method.name": "vcycle"}))
    now = to_dict(load_config(None, {"method.name": "vcycle", "train.report_to": "tensorboard",  # bookkeeping
                                     "train.lr": "0.5", "data.num_proc": "2",  # tuning, speed: warned
                                     "train.fsdp": "true", "method.vcycle.depth_mode": "identity"}))  # refused
    refused, allowed = resume_diff(saved, now)
    assert allowed == ["data.num_proc: 1 -> 2", "train.lr: 0.001 -> 0.5"]
    assert refused == ["method.vcycle.depth_mode: 'copy' -> 'identity'", "train.fsdp: False -> True"]
    assert [mark(k).resume for k in ("train.report_to", "name", "train.peak_tflops", "method.vcycle.levels.0.alpha")] \
        == ["free", "warned", "refused", "refused"]


def test_a_trials_name_leaves_out_what_its_mark_says_names_no_trial():
    over = {"train.lr": "0.004", "train.report_to": "wandb", "train.group": "sweep", "output_dir": "runs",
            "data.num_proc": "4", "train.seed": "1"}
    assert auto_name(Path("configs/baseline.yaml"), over) == "baseline-num_proc4-lr0.004-seed1"


def test_the_paths_a_run_reads_are_the_fields_marked_as_paths(tmp_path):
    cfg = load_config(None, {"data.dataset": "~/corpus.txt", "output_dir": "~/runs"})
    assert list(read_paths(cfg)) == ["model.init_from", "data.dataset", "data.tokenizer", "data.cache_dir"]
    assert read_paths(cfg)["data.dataset"] == str(Path.home() / "corpus.txt")  # "~" expands as in a shell
    assert cfg.output_dir == str(Path.home() / "runs")


@pytest.mark.parametrize(("over", "message"), [
    ({"train.compile": "sometimes"}, "train.compile: true, false or auto, got 'sometimes'"),
    ({"train.mixed_precision": "fp8"}, "train.mixed_precision: one of no, bf16, fp16 (or unset: the launcher's), "
                                       "got 'fp8'"),
    ({"parallel.microbatches": "many"}, "parallel.microbatches: 'auto' or a number >= 1, got 'many'"),
    ({"parallel.microbatches": "0"}, "parallel.microbatches: 'auto' or a number >= 1, got 0"),
    ({"method.autofreeze.criterion": "max"}, "method.autofreeze.criterion: one of argmin, relative, bound, got 'max'"),
    ({"method.vcycle.levels.0.down.decay": "step"},
     r"method.vcycle.levels\[0\].down.decay: must be one of linear, cosine, constant, wsd, wsd_sqrt, got 'step'"),
])
def test_a_choice_outside_its_literal_type_is_one_line_naming_the_field(over, message):
    with pytest.raises(ConfigError, match=f"^{message.replace('(', '[(]').replace(')', '[)]')}$"):
        validate(load_config(None, over))


def test_choices_read_from_yaml_and_the_command_line_keep_their_types():
    cfg = load_config(None, {"train.compile": "true", "train.mixed_precision": "no", "parallel.microbatches": "4"})
    assert (cfg.train.compile, cfg.train.mixed_precision, cfg.parallel.microbatches) == (True, "no", 4)
    validate(cfg)
    assert RunConfig().train.compile == "auto" and RunConfig().parallel.microbatches == "auto"


@pytest.mark.parametrize("extra", [[], ["--resume", "auto"], ["--resume", "auto", "--print_config"], ["--dry_run"]])
def test_the_command_line_loads_the_config_once(tmp_path, monkeypatch, extra, capsys):
    """It once loaded the recipe up to four times (to find the run folder, to ask whether a comparison was meant,
    again for the folder, then to run); now once, and progressive/run/start.py decides how the run starts, once: the
    trainer is handed the decision (it once decided again when handed none)."""
    import progressive.cli as cli
    import progressive.run.start as start
    import progressive.run.trainer as trainer

    loads = []
    for module in (cli, start):
        real = module.load_config
        monkeypatch.setattr(module, "load_config", lambda *a, _real=real, **k: loads.append(a) or _real(*a, **k))
    ran = []
    monkeypatch.setattr(trainer, "Trainer",
                        lambda cfg, *a, **kw: ran.append((a, kw)) or type("T", (), {"run": lambda s: 0})())
    assert cli.main(["--config", "tiny_test", "--output_dir", str(tmp_path), *extra]) == 0
    assert len(loads) == 1
    if not extra:
        from progressive.run.engine import DataParallel

        assert ran == [((start.Start("fresh"),), {"engine": DataParallel})]  # decided once, handed to the trainer


def test_each_numbers_range_is_its_fields_and_every_range_is_checked():
    """A number's range lives on its field (``setting(..., at_least=, at_most=)``), and validation reads it there:
    for every ranged field, one past each end is refused naming the field, the end itself loads. The fields that
    validation once listed by name are among them."""
    from progressive.config.schema import FIELDS

    ranged = {k: f.metadata for k, f in FIELDS.items() if "at_least" in f.metadata or "at_most" in f.metadata}
    assert {"model.hidden_size", "model.num_layers", "model.num_kv_heads", "data.seq_len", "data.seed",
            "data.max_tokens", "data.num_proc", "train.threads", "train.seed", "train.steps",
            "train.keep_checkpoints"} <= set(ranged)
    tiny = ROOT / "configs" / "tiny_test.yaml"
    for key, meta in ranged.items():
        for end, past in (("at_least", -1), ("at_most", 1)):
            if end not in meta:
                continue
            with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: "):
                validate(load_config(tiny, {key: str(meta[end] + past)}))
            if key not in ("model.hidden_size", "model.num_heads"):  # the other's divisibility decides alone
                validate(load_config(tiny, {key: str(meta[end])}))


def test_one_rule_says_which_options_count_for_the_resume_check_the_cache_key_and_the_baseline_found():
    """schema.counted: an option of a method that does not run, and a field without effect (a cooldown under a
    linear decay), change neither the resume check, nor the cache key, nor which baseline a run is plotted against;
    an option of the running method changes all three."""
    from bench.lib.runs import config_hash
    from progressive.config import diff, load_config, to_dict
    from progressive.run.summary import _compared

    base = {"method.name": "apollo", "train.decay": "linear"}
    same = [load_config(None, base), load_config(None, {**base, "method.vcycle.levels.0.alpha": "0.5",
                                                        "train.cooldown": "0.3"})]
    other = load_config(None, {**base, "method.apollo.boundaries": "[0.5]", "method.apollo.layers": "[2, 4]"})
    a, b = (to_dict(c) for c in same)
    assert diff(a, b) == [] and config_hash(same[0]) == config_hash(same[1]) and _compared(a) == _compared(b)
    assert diff(a, to_dict(other)) and config_hash(same[0]) != config_hash(other)


def test_print_config_shows_what_a_field_means_from_its_docstring_sentence_or_its_comment():
    """config.fields.help_of: a ``name``: sentence of the section's docstring, else the field's # comment; list
    indices and method sections are walked through; --print_config puts it beside the value."""
    from progressive.cli import print_config
    from progressive.config import RunConfig, load_config
    from progressive.config.fields import help_of

    assert help_of(RunConfig, "method.apollo.layers").startswith("distinct layers per stage")  # docstring
    assert help_of(RunConfig, "train.lr").startswith("rescales every phase's peak LR")  # comment on the line
    assert help_of(RunConfig, "train.cooldown").startswith("a WSD decay's cooldown")  # comment above it
    assert help_of(RunConfig, "data.seed") == "the split and the sub-sampling seed"  # a docstring's list of fields
    text = print_config(None, {}, load_config(None, {"method.name": "apollo"}))
    assert "method.apollo.layers.0: 1  (default)  # distinct layers per stage" in text


def test_every_config_field_says_what_it_means():
    """--print_config shows a meaning beside every value: each field of every section (the methods' included) is
    explained by its docstring or a comment (a field added without one fails here)."""
    from progressive.config import RunConfig, to_dict
    from progressive.config.fields import help_of
    from progressive.config.tree import flatten

    keys = list(flatten(to_dict(RunConfig())))
    assert len(keys) > 140 and [k for k in keys if not help_of(RunConfig, k)] == []
