"""Trackers (W&B offline, TensorBoard), the compare report and the dry run of the paper-scale recipes."""

import json
import os
import sqlite3
from pathlib import Path

import pytest

from progressive.config import load_config
from progressive.report.compare import compare, savings
from progressive.report.dryrun import dry_run
from progressive.run.trainer import Trainer
from tests.train_utils import ROOT, rows, tiny_cfg


@pytest.fixture(scope="module")
def wandb_run(tmp_path_factory):
    """A finished W&B offline run: (its run folder, the bytes of its .wandb file). Trainer.run ends the
    trackers and waits for W&B's writer (common.trackers.end_training), so the file is complete."""
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_MODE", "offline")
    try:
        cfg = tiny_cfg(tmp_path_factory.mktemp("wandb"), method="vcycle", train__steps=8, train__report_to="wandb",
                       train__log_checkpoint=True, train__plots=True)
        Trainer(cfg).run()
    finally:
        mp.undo()
    files = list((cfg.run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    return cfg.run_dir, files[0].read_bytes()


def test_wandb_offline_run_folder_holds_the_logged_metrics(wandb_run):
    run_dir, data = wandb_run
    # wandb 0.31 has no Python reader for this file; keys and values are visible in its bytes (docs/training.md)
    assert b"val_loss" in data and b"loss" in data and b"flops" in data and b"lr" in data
    last = rows(run_dir, "train")[-1]
    assert repr(last["loss"])[:6].encode() in data


def test_wandb_run_has_its_group_tags_job_type_summary_events_plots_and_checkpoint(wandb_run):
    """What a researcher finds on the dashboard, read from the offline run: group, tags (method, family,
    budget, seed) and job type; the headline numbers in the summary; the level changes as a table of events;
    the loss plots as images; final/ as a model artifact (train.log_checkpoint); only the running method's
    options in the config, null as null."""
    run_dir, data = wandb_run
    folder = next((run_dir / "wandb").glob("offline-run-*"))
    name = run_dir.name
    for tag in (b"vcycle", b"gpt2", b"budget-8", b"seed-0"):
        assert b"R" + bytes([len(tag)]) + tag in data, tag  # RunRecord.tags (field 10)
    assert b"2" + bytes([len(name)]) + name.encode() in data  # RunRecord.group (field 6)
    assert b":\x05train" in data  # RunRecord.job_type (field 7)
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("final_val_loss", "params", "flops", "tokens", "train_wall_s", "tok_s"):
        assert key.encode() in data, key
    assert summary["params"] > 0
    events = json.loads(next((folder / "files/media/table").glob("events_*.table.json")).read_text())
    assert [r[:2] for r in events["data"]] == [[t["step"], t["to"]] for t in summary["transitions"]]
    assert {p.name.split("_")[0] + "_" + p.name.split("_")[1] + "_" + p.name.split("_")[2]
            for p in (folder / "files/media/images/plots").glob("*.png")} == {"loss_vs_flops", "loss_vs_wallclock"}
    assert f"{name}-final".encode() in data
    assert b"method.vcycle." in data and b"method.apollo." not in data and b"method.autofreeze." not in data
    assert b"\n\x0fmodel.init_from\x82\x01\x04null" in data  # null, not "None"


def test_an_eval_of_final_logs_into_the_training_runs_group_and_summary(wandb_run, tmp_path, monkeypatch):
    """eval.zeroshot on the run's final/: its W&B run is in the training run's project and group, named
    <run>-zeroshot, job type eval; the training run (same id) gets the metrics in its summary."""
    from eval import zeroshot

    run_dir, _ = wandb_run
    monkeypatch.setenv("WANDB_MODE", "offline")
    zeroshot.main([str(run_dir / "final"), "--tasks", "ptb", "--limit", "2", "--report_to", "wandb",
                   "--output", str(tmp_path / "zs.json"), "--logging_dir", str(tmp_path / "logs")])
    own = next((tmp_path / "logs").glob("wandb/offline-run-*/run-*.wandb")).read_bytes()
    name, group = f"{run_dir.name}-zeroshot".encode(), run_dir.name.encode()
    assert b"B" + bytes([len(name)]) + name in own and b"2" + bytes([len(group)]) + group in own
    assert b":\x04eval" in own and b"growtrain" in own
    wid = (run_dir / "wandb_run_id").read_text().strip()
    resumed = [p for p in (run_dir / "wandb").glob(f"offline-run-*-{wid}/run-{wid}.wandb")]
    assert len(resumed) == 2  # the training run, and its resumption that wrote the eval's summary
    assert any(b"ptb/" in p.read_bytes() for p in resumed)


def test_a_comparison_is_one_group_with_a_compare_run_holding_each_methods_saving(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = tiny_cfg(tmp_path, method="baseline", name="cmp", train__steps=6, train__report_to="wandb")
    compare(cfg, ["baseline", "vcycle"])
    own = next((cfg.run_dir / "wandb").glob("offline-run-*/run-*.wandb")).read_bytes()
    for key in (b"cmp/compare", b"vcycle/flops_saved_pct", b"vcycle/reached", b"baseline/final_val_loss",
                b":\x07compare"):
        assert key in own, key
    assert b"wall_saved_excl_compile_pct" not in own  # eager: no compile-free saving to report
    sub = next((cfg.run_dir / "vcycle" / "wandb").glob("offline-run-*/run-*.wandb")).read_bytes()
    assert b"2\x03cmp" in sub and b"B\ncmp/vcycle" in sub  # group cmp, name cmp/vcycle


def test_wandb_charts_use_flops_as_their_x_axis(wandb_run):
    _, data = wandb_run
    # define_metric("*", step_metric="flops") is stored as a MetricRecord: glob_name (field 2) "*", then
    # step_metric (field 4) "flops", each a protobuf tag byte, a length byte and the text
    assert b'\x12\x01*"\x05flops' in data
    assert b"\n\x06tokens" in data  # tokens declared too: a chart can switch its x-axis to them


def test_trackio_local_database_holds_the_logged_metrics_under_the_runs_name(tmp_path, monkeypatch, capfd):
    """trackio's run is named as the run is (not a random "dainty-sunset-0"), and finishing it says so once."""

    monkeypatch.delenv("TRACKIO_DIR", raising=False)
    cfg = tiny_cfg(tmp_path, method="baseline", train__steps=4, train__report_to="trackio", name="tiny-trackio")
    capfd.readouterr()
    try:
        Trainer(cfg).run()
    finally:  # the run points trackio at its folder for the rest of the process (monkeypatch restores only a value)
        os.environ.pop("TRACKIO_DIR", None)
    assert capfd.readouterr().out.count("Uploading logs to Trackio") == 1
    dbs = list((cfg.run_dir / "trackio").glob("*.db"))
    assert len(dbs) == 1
    with sqlite3.connect(dbs[0]) as con:
        tables = [r[0] for r in con.execute("select name from sqlite_master where type='table'")]
        dump = "".join(str(row) for t in tables for row in con.execute(f"select * from {t}"))
        names = {r[0] for r in con.execute("select distinct run_name from metrics")}
    last = rows(cfg.run_dir, "train")[-1]
    assert "val_loss" in dump and "flops" in dump and repr(last["loss"])[:6] in dump
    assert names == {"tiny-trackio"}


def test_tensorboard_events_hold_the_same_losses_as_metrics_jsonl(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny_cfg(tmp_path, method="baseline", train__steps=4, train__report_to="tensorboard")
    Trainer(cfg).run()
    events = list(cfg.run_dir.rglob("events.out.tfevents.*"))
    assert events
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    logged = [(e.step, e.value) for e in acc.Scalars("loss")]
    expect = [(r["step"], r["loss"]) for r in rows(cfg.run_dir, "train")]
    assert [s for s, _ in logged] == [s for s, _ in expect]
    assert [v for _, v in logged] == pytest.approx([v for _, v in expect], rel=1e-6)


def _val(points):
    return [{"kind": "val", "step": i, "flops": f, "wall": w, "val_loss": v} for i, (f, w, v) in enumerate(points)]


def test_savings_are_read_at_the_first_evaluation_that_reaches_the_reference_loss():
    base = _val([(0, 0.0, 5.0), (50, 10.0, 4.0), (100, 20.0, 3.0)])
    fast = _val([(0, 0.0, 5.0), (30, 8.0, 3.5), (60, 15.0, 2.9), (100, 25.0, 2.5)])
    slow = _val([(0, 0.0, 5.0), (100, 30.0, 3.2)])
    train = [{"kind": "train", "step": 9, "loss": 1.0, "flops": 100, "wall": 1.0}]
    target, table = savings({"baseline": base + train, "fast": fast + train, "slow": slow + train}, "baseline")
    assert target == 3.0
    by = {r["method"]: r for r in table}
    assert by["baseline"]["flops_saved_%"] == 0.0
    assert by["fast"]["flops_to_target"] == 60 and by["fast"]["flops_saved_%"] == 40.0
    assert by["fast"]["wall_saved_%"] == 25.0
    assert by["slow"]["flops_saved_%"] == "not reached"


def test_with_compile_the_wall_saving_is_also_given_without_the_compilations():
    def compiled(points):  # (flops, wall, val_loss, compile_s so far)
        return [{**r, "compile_s": c} for r, c in zip(_val([p[:3] for p in points]), [p[3] for p in points])]

    base = compiled([(0, 0.0, 5.0, 0.0), (100, 20.0, 3.0, 4.0)])  # 16 s of steps, 4 s compiling
    vc = compiled([(0, 0.0, 5.0, 0.0), (60, 18.0, 2.9, 10.0)])  # 8 s of steps, 10 s compiling (two level changes)
    train = [{"kind": "train", "step": 9, "loss": 1.0, "flops": 100, "wall": 1.0, "compile_s": 10.0}]
    _, table = savings({"baseline": base + train, "vcycle": vc + train}, "baseline")
    row = {r["method"]: r for r in table}["vcycle"]
    assert row["wall_saved_%"] == 10.0 and row["wall_saved_excl_compile_%"] == 50.0 and row["compile_s"] == 10.0
    eager = savings({"baseline": _val([(0, 0.0, 5.0), (100, 20.0, 3.0)]) + train,
                     "vcycle": _val([(0, 0.0, 5.0), (60, 18.0, 2.9)]) + train}, "baseline")[1]
    assert all("wall_saved_excl_compile_%" not in r for r in eager)  # val rows without compile_s: no such column


def test_compare_runs_both_methods_on_the_same_budget_and_writes_table_json_and_plot(tmp_path, capsys):
    cfg = tiny_cfg(tmp_path, train__steps=8, train__eval_every=2, name="cmp", train__plots=True)
    result = compare(cfg, ["baseline", "vcycle"])
    out = Path(cfg.run_dir)
    saved = json.loads((out / "compare.json").read_text())
    assert saved["reference"] == "baseline" and [r["method"] for r in saved["results"]] == ["baseline", "vcycle"]
    base, vc = saved["results"]
    assert vc["flops"] <= base["flops"]  # same FLOPs budget
    assert saved["target_val_loss"] == pytest.approx(base["final_val_loss"])
    assert (out / "compare.png").stat().st_size > 1000 and (out / "baseline" / "final").is_dir()
    assert "flops_saved_%" in capsys.readouterr().out and result["results"] == saved["results"]


@pytest.mark.parametrize("recipe", sorted(p.name for p in (ROOT / "launch" / "recipes").glob("*.yaml")))
def test_paper_scale_recipes_dry_run_on_the_meta_device(recipe, capsys):
    cfg = load_config(ROOT / "launch" / "recipes" / recipe)
    if cfg.model.init_from:  # starts from a Hub checkpoint: offline (as here) it must fail at once, clearly
        from common.hub import HubUnavailable

        with pytest.raises(HubUnavailable, match=f"{cfg.model.init_from}.*offline mode is on"):
            dry_run(cfg)
        return
    plan = dry_run(cfg)
    out = capsys.readouterr().out
    assert "nothing was trained" in out and "planned FLOPs" in out
    assert 0.4 < plan["flops_ratio"] <= 1.0  # no recipe plans more FLOPs than its baseline
    if plan["method"] == "apollo":  # Apollo's last stage fills the budget: equal compute, more steps
        assert plan["flops_ratio"] > 0.999 and sum(r["steps"] for r in plan["phases"]) > plan["baseline"][0]["steps"]
    if recipe.startswith("gpt2_base_vcycle"):
        assert plan["baseline"][0]["params"] == 124_439_808  # GPT-2 124M (tied head)
        assert plan["flops_ratio"] == pytest.approx(0.671, abs=0.002)


def test_accelerate_config_files_parse():
    from accelerate.commands.config.config_args import ClusterConfig

    kinds = {p.stem: ClusterConfig.from_yaml_file(str(p)).distributed_type.value
             for p in (ROOT / "launch" / "accelerate").glob("*.yaml")}
    assert kinds == {"1gpu": "NO", "8gpu": "MULTI_GPU", "multinode": "MULTI_GPU", "fsdp": "FSDP"}


def test_a_recipe_with_its_baseline_trains_both_and_prints_the_saving_with_its_context(tmp_path, capsys):
    """train.with_baseline (the main job's): the same-size baseline, then the method, and the saving with what
    it means; off, one run; a single run's folder resumes as a single run even when the recipe asks for both."""
    from progressive.cli import main
    from tests.train_utils import CACHE

    common = ["--config", str(ROOT / "configs" / "tiny_test.yaml"), "--output_dir", str(tmp_path),
              "--data.cache_dir", str(CACHE), "--train.steps", "8", "--train.eval_every", "2", "--train.plots", "false"]
    assert main([*common, "--name", "both", "--train.with_baseline", "true", "--train.baseline_lr", "1e-3"]) == 0
    out = capsys.readouterr().out
    # each run announced before it starts, the saving said in a sentence, then what it is and is not
    first, second = out.index("=== 1 of 2: the baseline, gpt2 2x32 at learning rate 0.001 "
                              "(its own: train.baseline_lr)"), \
        out.index("=== 2 of 2: the V-cycle, gpt2 2x32 at learning rate 0.003 on the same data, budget and seed; then")
    assert first < out.index("outputs: ") < second  # the baseline's run ends before the V-cycle's header
    saved = json.loads((tmp_path / "both" / "compare.json").read_text())["results"][1]
    sentence = (f"with {abs(saved['flops_saved_%']):.1f}% {'fewer' if saved['flops_saved_%'] >= 0 else 'more'} FLOPs"
                if saved["flops_to_target"] is not None else "did not reach the baseline's final validation loss")
    assert "\nThe V-cycle " in out and sentence in out
    assert "What this saving is" in out and "docs/results/frontier.md" in out
    assert "It is not a saving against the best baseline of any size" in out
    assert "the baseline at its own learning rate 0.001 (train.baseline_lr), the method at 0.003" in out
    saved = json.loads((tmp_path / "both" / "compare.json").read_text())
    assert [r["method"] for r in saved["results"]] == ["baseline", "vcycle"]
    lrs = {m: load_config(tmp_path / "both" / m / "config.yaml").train.lr for m in ("baseline", "vcycle")}
    assert lrs == {"baseline": 1e-3, "vcycle": 3e-3}  # the baseline at its own LR, the method at the recipe's
    assert (tmp_path / "both" / "baseline" / "final").is_dir() and (tmp_path / "both" / "vcycle" / "final").is_dir()
    assert main([*common, "--name", "one"]) == 0  # tiny_test.yaml does not ask for the baseline
    assert (tmp_path / "one" / "final").is_dir() and not (tmp_path / "one" / "compare.json").exists()
    capsys.readouterr()
    assert main([*common, "--name", "one", "--train.with_baseline", "true", "--resume", "auto"]) == 0
    assert not (tmp_path / "one" / "baseline").exists() and "What this saving is" not in capsys.readouterr().out
