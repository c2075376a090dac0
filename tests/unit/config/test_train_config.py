"""Typed config: YAML recipes, dotted overrides, errors that name the field, resume diffs, CLI parsing."""

import subprocess
import sys
from pathlib import Path

import pytest

from progressive.cli import parse
from progressive.config import ConfigError, RunConfig, diff, dump_yaml, load_config, to_dict, validate
from progressive.methods import LRSchedule

ROOT = Path(__file__).resolve().parents[3]


def test_every_bundled_recipe_loads_and_validates():
    recipes = sorted((ROOT / "configs").glob("*.yaml")) + sorted((ROOT / "launch" / "recipes").glob("*.yaml"))
    assert len(recipes) >= 5
    for path in recipes:
        validate(load_config(path))


def test_overrides_set_nested_fields_and_list_items_with_types():
    cfg = load_config(ROOT / "configs" / "default.yaml", {
        "train.lr": "1e-3",  # YAML reads this as a string; the float field converts it
        "model.num_layers": "6",
        "method.vcycle.levels.1.down.fraction": "0.4",
        "method.vcycle.levels.0.up.steps": "7",
        "data.max_tokens": "null",
        "train.progress": "false",
    })
    assert cfg.train.lr == pytest.approx(1e-3) and isinstance(cfg.train.lr, float)
    assert cfg.model.num_layers == 6
    assert cfg.method.vcycle.levels[1].down.fraction == pytest.approx(0.4)
    assert cfg.method.vcycle.levels[0].up.steps == 7
    assert cfg.data.max_tokens is None and cfg.train.progress is False


@pytest.mark.parametrize("key, value, field", [
    ("train.lrr", "1", "train.lrr"),
    ("method.vcycle.levels.5.alpha", "0.5", "method.vcycle.levels.5"),
    ("model.num_layers", "2.5", "model.num_layers"),
    ("train.cpu", "maybe", "train.cpu"),
])
def test_bad_overrides_name_the_field(key, value, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(None, {key: value})


def test_unknown_key_in_yaml_is_an_error_naming_it(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("model: {family: gpt2, hiden_size: 64}\n")
    with pytest.raises(ConfigError, match=r"model\.hiden_size: unknown key"):
        load_config(p)


@pytest.mark.parametrize("override, field", [
    ({"model.hidden_size": "30", "model.num_heads": "4"}, "model.hidden_size"),
    ({"train.decay": "exponential"}, "train.decay"),
    ({"train.batch_size": "10", "train.grad_accum": "3"}, "train.batch_size"),
    ({"method.vcycle.levels.0.down.fraction": "1.5"}, r"method.vcycle.levels\[0\].down.fraction"),
    ({"train.report_to": "mlflow"}, "train.report_to"),
])
def test_validation_names_the_field(override, field):
    with pytest.raises(ConfigError, match=field):
        validate(load_config(None, override))


def test_config_yaml_round_trip_is_identical(tmp_path):
    cfg = load_config(ROOT / "configs" / "default.yaml", {"train.lr": "2e-3"})
    p = tmp_path / "c.yaml"
    p.write_text(dump_yaml(cfg))
    assert to_dict(load_config(p)) == to_dict(cfg)


def test_diff_lists_changed_fields_and_ignores_tracking_fields():
    a = to_dict(RunConfig())
    b = to_dict(load_config(None, {"train.lr": "0.5", "method.vcycle.levels.0.alpha": "0.5",
                                   "train.report_to": "wandb"}))
    assert diff(a, b) == ["train.lr: 0.001 -> 0.5"]  # the V-cycle's options do not count where it does not run
    a, b = (to_dict(load_config(None, {**over, "method.name": "vcycle"})) for over in (
        {}, {"train.lr": "0.5", "method.vcycle.levels.0.alpha": "0.5", "train.report_to": "wandb"}))
    assert diff(a, b) == ["method.vcycle.levels.0.alpha: 0.25 -> 0.5", "train.lr: 0.001 -> 0.5"]


def test_resume_diff_skips_fields_added_later_at_their_default():
    new = to_dict(load_config(None, {"method.name": "vcycle"}))
    old = to_dict(load_config(None, {"method.name": "vcycle"}))
    for key in ("width_split", "split_noise", "split_seed"):  # a checkpoint saved before these existed
        del old["method"]["vcycle"][key]
    assert diff(old, new) == []
    changed = to_dict(load_config(None, {"method.name": "vcycle", "method.vcycle.width_split": "asymmetric"}))
    assert diff(old, changed) == ["method.vcycle.width_split: '<absent>' -> 'asymmetric'"]


def test_cli_parse_flags_aliases_and_errors():
    path, over, flags = parse(["--config", "x.yaml", "--resume", "--report_to", "wandb", "--train.lr=3e-4",
                               "--compare", "baseline,vcycle"])
    assert path == Path("x.yaml") and flags["resume"] and flags["compare"] == ["baseline", "vcycle"]
    assert over == {"train.report_to": "wandb", "train.lr": "3e-4"}
    with pytest.raises(ConfigError, match="ambiguous"):
        parse(["--seed", "1"])  # train.seed and data.seed
    with pytest.raises(ConfigError, match="needs a value"):
        parse(["--train.lr"])
    with pytest.raises(ConfigError, match="unknown option"):
        parse(["--bogus", "1"])


def test_lr_schedule_warmup_then_linear_and_cosine_decay():
    lin = LRSchedule(steps=10, warmup=0.2, decay="linear", min_lr_ratio=0.0)
    assert [lin(s) for s in (0, 1, 2)] == [0.0, 0.5, 1.0]
    assert lin(6) == pytest.approx(0.5) and lin(10) == pytest.approx(0.0)
    cos = LRSchedule(steps=10, warmup=0.0, decay="cosine", min_lr_ratio=0.1)
    assert cos(0) == pytest.approx(1.0) and cos(5) == pytest.approx(0.55) and cos(10) == pytest.approx(0.1)
    const = LRSchedule(steps=4, warmup=1.0, decay="linear", min_lr_ratio=0.0)  # pure warm-up (paper's E_a)
    assert [const(s) for s in range(4)] == [0.0, 0.25, 0.5, 0.75]


def test_command_line_values_are_taken_as_typed_and_recipes_read_yaml_1_2_scalars():
    """``--name 010`` made a run named 8, ``1:30`` 90, ``on`` yes; a recipe's ``name: 010`` too. Values keep their
    text for string fields, are numbers only for number fields, and integers are exact."""
    from progressive.config import load_config
    from progressive.config.reader import read_yaml

    for typed in ("010", "1:30", "on", "no", "2024-01-01", "1e3", "~x"):
        assert load_config(None, {"name": typed}).name == typed
    cfg = load_config(None, {"train.steps": "9007199254740993", "train.lr": "1e-3", "train.fsdp": "yes",
                             "method.name": "apollo", "method.apollo.layers": "[1, 2, 4]"})
    assert cfg.train.steps == 9007199254740993  # 2**53 + 1: not rounded through float
    assert cfg.train.lr == 1e-3 and cfg.train.fsdp is True and cfg.method.apollo.layers == [1, 2, 4]
    assert read_yaml("a: 010\nb: 1:30\nc: on\nd: 2024-01-01\ne: 1e-3\nf: 12\ng: .inf\nh: ~\ni: true\n", "t") == {
        "a": "010", "b": "1:30", "c": "on", "d": "2024-01-01", "e": 1e-3, "f": 12, "g": float("inf"), "h": None,
        "i": True}
    assert read_yaml("base: &b {steps: 3, lr: 0.5}\ntrain:\n  <<: *b\n  lr: 0.1\n", "t")["train"] == {"steps": 3,
                                                                                                   "lr": 0.1}


def test_two_merge_keys_in_one_mapping_are_refused_naming_the_line():
    """``{<<: *a, <<: *b}``: PyYAML kept one of the two silently (the second's steps won); ``<<: [*a, *b]`` is the
    way to merge both, and still works."""
    import pytest

    from progressive.config import ConfigError
    from progressive.config.reader import read_yaml

    anchors = "a: &a {steps: 7, lr: 0.5}\nb: &b {steps: 2}\n"
    for doc, line in ((anchors + "train: {<<: *a, <<: *b}\n", 3), (anchors + "train:\n  <<: *a\n  <<: *b\n", 5)):
        with pytest.raises(ConfigError, match=rf"^t: line {line}: the merge key '<<' is given twice"):
            read_yaml(doc, "t")
    assert read_yaml(anchors + "train: {<<: [*b, *a]}\n", "t")["train"] == {"steps": 2, "lr": 0.5}


# The merge key's rules (YAML's merge type, https://yaml.org/type/merge.html), in examples of our own shaped as the
# spec's: four mappings to merge, then one mapping written four ways that must all read the same.
_MERGE_SOURCES = ("sources:\n  - &base {depth: 4, width: 64}\n  - &shallow {depth: 2, width: 64}\n"
                  "  - &fast {lr: 0.01}\n  - &slow {lr: 0.001}\n")
_MERGED = {"depth": 4, "width": 64, "lr": 0.01, "name": "base/fast"}
_MERGE_RULES = {  # the rule -> the mapping written with it
    "every key written out": "{depth: 4, width: 64, lr: 0.01, name: base/fast}",
    "one mapping merged, the mapping's own keys added": "{<<: *base, lr: 0.01, name: base/fast}",
    "a list of mappings merged": "{<<: [*base, *fast], name: base/fast}",
    # fast's lr beats slow's (earlier in the list wins); the mapping's own depth beats shallow's
    "an earlier mapping wins over a later one, the mapping's own keys over all": (
        "{<<: [*fast, *shallow, *slow], depth: 4, name: base/fast}"),
    "the same in block style": "\n  <<: [*fast, *shallow, *slow]\n  depth: 4\n  name: base/fast",
    "a merged mapping's own merge resolved first": "{<<: [*deep_fast, *slow], name: base/fast}",
}


@pytest.mark.parametrize("pyyaml", ["installed", "its merge switched off"])
@pytest.mark.parametrize("rule", list(_MERGE_RULES))
def test_merge_keys_follow_the_yaml_merge_spec_whatever_pyyaml_merges(rule, pyyaml, monkeypatch):
    """PyYAML 6.0.4 reversed which of several merged mappings wins (``<<: [*b, *a]`` read ``a``'s steps, where
    6.0.3 and the spec read ``b``'s): the reader merges itself, by the spec's rules, on every PyYAML (CI runs the
    lock's and the newest); with PyYAML's own merge switched off it reads the same."""
    import yaml

    from progressive.config.reader import read_yaml

    if pyyaml != "installed":
        def refuse(self, node):
            raise AssertionError("PyYAML's merge was used")
        monkeypatch.setattr(yaml.constructor.SafeConstructor, "flatten_mapping", refuse)
    doc = _MERGE_SOURCES + "deep_fast: &deep_fast {<<: [*fast, *shallow], depth: 4}\nrun: " + _MERGE_RULES[rule] + "\n"
    assert read_yaml(doc, "t")["run"] == _MERGED


def test_a_mapping_merged_before_it_is_read_itself_reads_as_written():
    """PyYAML's merge rewrote a merged mapping in place: one read after it was merged elsewhere showed its own
    override of a merged key as a key given twice."""
    from progressive.config.reader import read_yaml

    doc = "base: &base {steps: 1, lr: 0.1}\nx: {mid: &mid {<<: *base, steps: 2}}\ntrain: {<<: *mid}\n"
    assert read_yaml(doc, "t") == {"base": {"steps": 1, "lr": 0.1}, "x": {"mid": {"steps": 2, "lr": 0.1}},
                                   "train": {"steps": 2, "lr": 0.1}}


@pytest.mark.parametrize("doc, message", [
    ("a: &a 3\nb: {<<: *a}\n", "line 2: the merge key '<<' takes a mapping or a list of mappings (<<: *a, or "
                                "<<: [*a, *b]), not a scalar (line 1)"),
    ("a: &a {x: 1}\nb:\n  <<: [*a, [1]]\n", "line 3: the merge key '<<' takes a mapping or a list of mappings "
                                            "(<<: *a, or <<: [*a, *b]), not a sequence (line 3)"),
    ("a: &a {x: 1, <<: *a}\n", "line 1: the merge key '<<' merges the mapping it is in (through an alias to it); "
                               "merge other mappings"),
    ("b: {<<: [{x: 1, x: 2}]}\n", "line 1: key 'x' is given twice (first on line 1); a recipe says each setting once"),
    ("b:\n  <<: {1: 2}\n", "line 2: the key 1 is not a string; a recipe's keys are names of settings"),
], ids=["a scalar", "a list in the list", "the mapping itself", "a key twice inside", "a number key inside"])
def test_a_merge_that_cannot_be_read_is_refused_naming_the_line(doc, message):
    """A merged mapping is checked as one written out is (its keys once each, strings), and a merge of a scalar,
    a list or of the mapping itself is one line saying where."""
    from progressive.config.reader import read_yaml

    with pytest.raises(ConfigError) as e:
        read_yaml(doc, "t")
    assert str(e.value) == "t: " + message


@pytest.mark.parametrize("doc, value", [("!!int 12", 12), ("!!int -0", 0), ("!!float 1", 1.0), ("!!float 1e-3", 1e-3),
                                        ("!!bool false", False), ("!!null ~", None), ("!!str 010", "010")])
def test_an_explicit_core_tag_reads_yaml_1_2s_core_forms(doc, value):
    from progressive.config.reader import read_yaml

    assert read_yaml("a: " + doc + "\n", "t") == {"a": value}


@pytest.mark.parametrize("doc", ["!!int 010", "!!int 0x10", "!!int 1_000", "!!int 1:30", "!!float 1_0.5",
                                 "!!bool yes", "!!bool on", "!!null none"])
def test_an_explicit_core_tag_on_a_yaml_1_1_form_is_refused(doc):
    """``!!int 010`` was PyYAML's YAML 1.1 octal 8, ``!!bool yes`` True: a recipe's scalars follow YAML 1.2's core
    schema, tagged or not."""
    from progressive.config.reader import read_yaml

    forms = {"int": "decimal digits, no leading zero", "float": "1, 0.5, 1e-3 or .inf", "bool": "true or false",
             "null": "null or ~"}
    tag, text = doc.split()
    with pytest.raises(ConfigError) as e:
        read_yaml("a: " + doc + "\n", "t")
    assert str(e.value) == (f"t: line 1: {tag} {text!r} is not written as YAML 1.2 writes a {tag[2:]} "
                            f"({forms[tag[2:]]}); write it so, or quote it for a string")


def test_a_home_folder_path_is_expanded_as_a_shell_would():
    """``--output_dir '~/runs'`` created a folder named "~" in the working directory."""

    from progressive.config import load_config

    cfg = load_config(None, {"output_dir": "~/runs", "data.cache_dir": "~/cache", "name": "x"})
    assert cfg.run_dir == Path.home() / "runs" / "x" and cfg.data.cache_dir == str(Path.home() / "cache")


def test_list_shows_every_recipe_and_a_name_is_a_config(capsys):
    """``--list``: every recipe of configs/ and launch/recipes/ with its first comment line; ``--config <name>``
    finds a recipe by name (what an install without a clone has)."""
    from common.paths import CONFIGS, LAUNCH
    from progressive.cli import main, parse

    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    names = [p.stem for p in [*CONFIGS.glob("*.yaml"), *(LAUNCH / "recipes").glob("*.yaml")]]
    assert len(out.splitlines()) == len(names) and all(n in out for n in names)
    assert "BERT-Large (24L/1024/16h) masked LM, 3-level V-cycle" in out
    assert "[launch/recipes/bert_large_vcycle3.yaml]" in out
    assert parse(["--config", "apollo"])[0] == CONFIGS / "apollo.yaml"
    assert parse(["--config", "gpt2_base_vcycle"])[0] == LAUNCH / "recipes" / "gpt2_base_vcycle.yaml"


def test_print_config_says_where_each_value_came_from_and_shows_only_the_running_method(capsys):
    from progressive.cli import main

    assert main(["--print_config", "--config", "apollo", "--train.lr", "1e-3"]) == 0
    lines = dict(line.split("  # ")[0].rsplit("  ", 1) for line in capsys.readouterr().out.splitlines())
    assert lines["train.lr: 0.001"] == "(flag)"
    assert lines["train.steps: 300"] == "(recipe)"
    assert lines["train.weight_decay: 0.01"] == "(default)"
    assert lines["model.init_from: null"] == "(default)"  # null as null, not "None"
    assert any(k.startswith("method.apollo.") for k in lines)
    assert not any(k.startswith(("method.vcycle.", "method.autofreeze.")) for k in lines)


def test_the_sweep_file_runs_each_trial_in_its_own_folder():
    """launch/sweeps/baseline_lr.yaml: the command a W&B agent runs (its ${args} as --key=value) parses, with
    --name auto naming each trial after its values, the same name for the same trial (a requeue resumes it)."""
    import yaml

    from progressive.cli import parse
    from tests.train_utils import ROOT

    sweep = yaml.safe_load((ROOT / "launch/sweeps/baseline_lr.yaml").read_text())
    assert sweep["program"] == "train.py" and sweep["metric"] == {"name": "val_loss", "goal": "minimize"}
    fixed = [a for a in sweep["command"] if not a.startswith("${")]
    names = set()
    for lr in sweep["parameters"]["train.lr"]["values"]:
        path, overrides, flags = parse([*fixed, f"--train.lr={lr}", "--train.seed=0"])
        assert flags["resume"] == "auto" and overrides["train.report_to"] == "wandb"
        names.add(overrides["name"])
        assert parse([*fixed, f"--train.lr={lr}", "--train.seed=0"])[1]["name"] == overrides["name"]
    assert len(names) == len(sweep["parameters"]["train.lr"]["values"])
    assert "baseline-lr0.004-seed0" in names


def test_list_names_each_recipes_folder_as_a_clone_has_it_also_from_an_install(tmp_path, monkeypatch, capsys):
    """An install ships configs/ as the package growtrain_configs: its recipes are still listed as configs/<name>.yaml,
    not as launch/recipes/ (the folder's name is not "configs" there)."""
    from common import paths
    from progressive.cli import list_recipes

    configs, launch = tmp_path / "growtrain_configs", tmp_path / "growtrain_launch"
    (launch / "recipes").mkdir(parents=True)
    configs.mkdir()
    (configs / "small.yaml").write_text("# a laptop recipe\nname: small\n")
    (launch / "recipes" / "big.yaml").write_text("# a paper's recipe\nname: big\n")
    monkeypatch.setattr(paths, "CONFIGS", configs)
    monkeypatch.setattr(paths, "LAUNCH", launch)
    lines = list_recipes().splitlines()
    assert lines[0].startswith("small ") and lines[0].endswith("a laptop recipe  [configs/small.yaml]")
    assert lines[1].startswith("big ") and lines[1].endswith("a paper's recipe  [launch/recipes/big.yaml]")


def test_help_list_and_print_config_load_neither_torch_nor_transformers():
    """The commands that only read recipes answer at once: the entry point's --help, --list and --print_config
    (a V-cycle, an Apollo and an AutoFreeze recipe, whose option sections are progressive.config's) import neither
    torch, transformers nor accelerate; each loads where a model is built. Checked in a fresh interpreter."""

    root = Path(__file__).resolve().parents[3]
    code = """if True:
        import contextlib, io, sys
        from progressive.cli import entry
        for args in (["--help"], ["--list"], ["--print_config"], ["--print_config", "--config", "apollo"],
                     ["--print_config", "--config", "autofreeze_sst2"], ["--steps", "x", "--print_config"]):
            sys.argv = ["train.py", *args]
            with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()):
                rc = entry()
            loaded = [m for m in ("torch", "transformers", "accelerate") if m in sys.modules]
            print(" ".join(args), rc, len(out.getvalue()) > 0, ",".join(loaded) or "-")
    """
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr
    rows = [line.rsplit(" ", 3) for line in out.stdout.splitlines()]
    assert [r[0] for r in rows] == ["--help", "--list", "--print_config", "--print_config --config apollo",
                                    "--print_config --config autofreeze_sst2", "--steps x --print_config"]
    assert [r[1] for r in rows] == ["0", "0", "0", "0", "0", "2"]  # a bad value: one line, exit 2, still no torch
    assert all(r[3] == "-" for r in rows), rows
