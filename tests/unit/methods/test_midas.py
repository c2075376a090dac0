"""MIDAS (progressive/methods/midas/), the method that is one folder and one registry line: its copy map (the middle
block inserted), PROP-alpha's stages filling the FLOPs budget, growth that copies weights and moments along the map,
a run that resumes row for row, and its reach: the recipes, ``--compare``, the bench's variants and the results
page, through progressive/config/registry.py alone."""

import json
import signal

import pytest
import torch

from bench.lib import variants
from bench.pages import results as results_pages
from operators import named_optimizer_state
from progressive.config import ConfigError, dump_yaml, load_config, validate
from progressive.config.methods import METHOD_OPTIONS
from progressive.methods import METHODS, get_method, registry
from progressive.methods.midas.method import middle_copy, prop_boundaries
from progressive.methods.midas.options import MidasConfig
from progressive.model.build import get_family, guess_data_info, step_flops
from progressive.run.checkpoint import list_checkpoints, read_state
from progressive.run.trainer import KILL_ENV, Trainer
from tests.train_utils import ROOT, assert_same_rows, rows, tiny_cfg, train_cli, train_here


@pytest.mark.parametrize("blocks, block, want", [
    (1, 1, [0, 0]), (2, 1, [0, 1, 1]), (3, 1, [0, 1, 1, 2]), (4, 1, [0, 1, 2, 2, 3]), (2, 2, [0, 1, 2, 3, 2, 3]),
])
def test_growth_inserts_a_copy_of_the_middle_block_after_it(blocks, block, want):
    assert middle_copy(blocks, block) == want


def test_prop_alpha_gives_later_stages_longer_shares():
    assert prop_boundaries(4, 1.0) == pytest.approx([0.1, 0.3, 0.6])
    assert prop_boundaries(4, 0.0) == pytest.approx([0.25, 0.5, 0.75])
    assert prop_boundaries(3, 2.0) == pytest.approx([1 / 14, 5 / 14])


def _plan(cfg):
    fam = get_family(cfg.model.family)
    base = fam.config_for(cfg.model, guess_data_info(cfg), cfg.data.seq_len)
    return get_method(cfg, fam).plan(base, lambda c: step_flops(cfg, fam, c)), base, fam


def test_the_stages_grow_a_block_at_a_time_and_spend_the_baselines_flops(tmp_path):
    cfg = tiny_cfg(tmp_path, method="midas", model__num_layers=4, train__steps=100)
    phases, base, fam = _plan(cfg)
    assert [p.name for p in phases] == ["stage0-1L", "stage1-2L", "stage2-3L", "stage3-4L"]
    assert [p.steps for p in phases[:3]] == [10, 20, 30]  # PROP-1: 1/10, 2/10, 3/10 of train.steps
    budget = 100 * step_flops(cfg, fam, base)
    assert budget - step_flops(cfg, fam, base) < sum(p.flops for p in phases) <= budget


def test_growth_copies_the_middle_layers_weights_and_moments(tmp_path):
    cfg = tiny_cfg(tmp_path, method="midas", model__num_layers=4)
    phases, _, fam = _plan(cfg)
    method = get_method(cfg, fam)
    model = fam.build_model(phases[2].config)  # 3 layers -> 4: layer 1 is copied
    opt = torch.optim.AdamW(model.parameters())
    model(input_ids=torch.randint(0, 300, (2, 8)), labels=torch.randint(0, 300, (2, 8))).loss.backward()
    opt.step()
    change = method.transition(3, phases, model, opt)
    old, new = model.state_dict(), change.model.state_dict()
    for j, src in enumerate([0, 1, 1, 2]):
        assert torch.equal(new[f"transformer.h.{j}.mlp.c_fc.weight"], old[f"transformer.h.{src}.mlp.c_fc.weight"])
    before = named_optimizer_state(model, opt)
    assert torch.equal(change.optimizer_state["transformer.h.2.attn.c_attn.weight"]["exp_avg"],
                       before["transformer.h.1.attn.c_attn.weight"]["exp_avg"])
    assert "the middle block 1 copied" in change.note


def test_a_run_killed_after_a_growth_resumes_row_for_row(tmp_path):
    over = dict(model__num_layers=3, model__dropout=0.1, train__steps=12, train__checkpoint_every=100,
                train__eval_every=3)
    ref = tiny_cfg(tmp_path / "ref", method="midas", **over)
    Trainer(ref).run()
    cfg = tiny_cfg(tmp_path / "killed", method="midas", **over)
    path = tmp_path / "killed.yaml"
    path.write_text(dump_yaml(cfg))
    phases = [r["phase_name"] for r in rows(ref.run_dir, "train")]
    grown = phases.index("stage2-3L")  # the steps before the last growth
    killed = train_cli(path, env={KILL_ENV: str(grown + 1)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert read_state(list_checkpoints(cfg.run_dir)[-1])["phase_name"] == "stage2-3L"  # the growth's checkpoint
    resumed = train_here(path, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert assert_same_rows(ref.run_dir, cfg.run_dir) > 12
    assert {r["phase_name"] for r in rows(cfg.run_dir)} == {"stage0-1L", "stage1-2L", "stage2-3L"}


def test_compare_runs_it_beside_the_baseline(tmp_path):
    cfg = tiny_cfg(tmp_path, method="midas", train__steps=12)
    path = tmp_path / "midas.yaml"
    path.write_text(dump_yaml(cfg))
    done = train_here(path, "--compare", "baseline,midas", "--name", "cmp")
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [r["method"] for r in got["results"]] == ["baseline", "midas"]


def test_the_folder_reaches_recipes_runs_the_bench_and_the_pages_through_the_registry_alone():
    assert "midas" in registry.FOLDERS
    assert METHOD_OPTIONS["midas"] is MidasConfig and METHODS["midas"].options is MidasConfig
    cfg = load_config(ROOT / "configs" / "midas.yaml")
    assert cfg.method.midas == MidasConfig(block=1, start=1, alpha=1.0)
    assert variants.overrides("midas", 4)["method.name"] == "midas" and variants.method_of("midas") == "midas"
    assert ("MIDAS (middle-block stacking)", [("midas", "midas")]) in results_pages.VERDICT_GROUPS
    from bench.pages import frontier as frontier_pages  # a cell of it on the frontier pages: named by its line's title

    named = frontier_pages._named({"variant": "midas", "budget": "9934"})
    assert named == "MIDAS (middle-block stacking) at 9934 steps"
    # no code outside the folder names the method but the registry's line (its tests, recipe and page aside; the
    # layer grid's step that chose to run it, bench/lib/grid.py, is a choice of what to measure, not its registration)
    code = [p for room in ("progressive", "bench", "operators", "common", "eval", "launch") for p in
            (ROOT / room).glob("**/*.py")] + [ROOT / "train.py"]
    outside = [p for p in code if "midas" in p.read_text().lower() and "midas" not in p.relative_to(ROOT).parts
               and p.name not in ("registry.py", "grid.py")]
    assert outside == []


@pytest.mark.parametrize("over, said", [
    ({"method__midas__block": 3}, "method.midas.block: 3 layers a block do not divide the model's 4 layers"),
    ({"method__midas__start": 5}, "method.midas.start: 5 blocks of 1 is more than the model's 4 layers"),
    ({"method__midas__alpha": -1.0}, "method.midas.alpha: PROP-alpha's exponent, in [0, 8], got -1.0"),
    ({"method__midas__block": 0}, "method.midas.block: a whole number >= 1, got 0"),
    ({"method__midas__optimizer_state": "slot"}, "method.midas.optimizer_state:"),
])
def test_settings_that_cannot_work_are_refused_naming_the_field(tmp_path, over, said):
    cfg = tiny_cfg(tmp_path, method="midas", model__num_layers=4, **over)
    with pytest.raises(ConfigError) as e:
        validate(cfg)
        _plan(cfg)
    assert str(e.value).startswith(said)
