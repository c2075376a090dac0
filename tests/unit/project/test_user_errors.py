"""Nothing surprising: one-line errors (exit code 2; --debug shows the traceback) from every CLI, bad input
named, disk-full / read-only named, the Hub failing fast offline, the launcher's precision, --resume
reusing the saved config, a finished run recognised, a FLOPs-based ETA."""

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import common.safetree
from common.cli import describe_os_error, run_cli
from common.hub import HubUnavailable
from eval import deit_transfer, glue, zeroshot
from operators.cli import main as operators_cli
from progressive import cli as train_cli
from progressive.config import ConfigError, DataConfig, load_config, validate
from progressive.data import build_tokenizer
from progressive.data.sources import load_hf_dataset
from progressive.run.tracking import Progress
from progressive.run.trainer import KILL_ENV
from tests.train_utils import ROOT, rows, tiny_cfg, train_here


def _train(*args, env=None):
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**os.environ, **(env or {})})


def test_malformed_and_empty_yaml_are_one_line_errors_naming_the_file(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  lr: [1e-3\n")
    assert train_cli.main(["--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"--config {bad}: not valid YAML at line" in err and err.count("\n") == 1
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing here\n")
    with pytest.raises(ConfigError, match="the file is empty"):
        load_config(empty)


def test_val_fraction_zero_is_refused_instead_of_nan_validation_losses(tmp_path):
    with pytest.raises(ConfigError, match=r"data\.val_fraction: must be in \(0, 1\)"):
        validate(tiny_cfg(tmp_path, data__val_fraction=0.0))


@pytest.mark.parametrize("name, cli, argv, needle", [
    ("train", train_cli.main, ["--model.family", "resnet", "--output_dir", "{tmp}"], "model.family: unknown family"),
    ("operators", operators_cli, ["coalesce", "{tmp}/missing", "{tmp}/out"], "checkpoint folder not found"),
    ("zeroshot", zeroshot.cli, ["{tmp}/missing"], "checkpoint: no such folder"),
    ("glue", glue.cli, ["--checkpoint", "{tmp}/missing"], "--checkpoint: no such folder"),
    ("deit_transfer", deit_transfer.cli, ["--checkpoint", "{tmp}/missing"], "--checkpoint: no such folder"),
])
def test_every_cli_reports_user_errors_in_one_line_and_debug_shows_the_traceback(tmp_path, capsys, name, cli, argv,
                                                                                 needle):
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and needle in err[-1] and not any("Traceback" in ln for ln in err)
    with pytest.raises(Exception, match=needle.split(":")[0]):
        cli([*argv, "--debug"])


def test_eval_epochs_zero_is_refused_instead_of_scoring_an_untrained_head(tmp_path, capsys):
    for cli in (glue.cli, deit_transfer.cli):
        assert cli(["--checkpoint", str(tmp_path), "--epochs", "0"]) == 2
        assert "--epochs must be > 0" in capsys.readouterr().err


@pytest.mark.parametrize("exc, needle", [
    (OSError(errno.ENOSPC, "No space left on device", "/data/run/model.safetensors"), "disk full while writing"),
    (RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on '
                  'device" })'), "disk full while writing"),
    (OSError(errno.EROFS, "Read-only file system", "/ro/run"), "read-only file system"),
    (PermissionError(errno.EACCES, "Permission denied", "/root/x"), "permission denied (/root/x)"),
])
def test_disk_full_read_only_and_permission_errors_are_named(exc, needle):
    assert needle in describe_os_error(exc)


LONG = "/data/" + "x" * 5000


@pytest.mark.parametrize("exc, said", [
    (OSError(errno.ENAMETOOLONG, "File name too long", LONG),
     f"/data/{'x' * 54}...{'x' * 40} (5,006 characters): a name in this path is too long for the file system (at "
     "most 255 bytes a name, 4,096 the whole path); choose a shorter one"),
    (OSError(errno.ELOOP, "Too many levels of symbolic links", "/tmp/loop/run"),
     "/tmp/loop/run: symbolic links lead back to themselves here (a link loop); fix or remove the link"),
    (RuntimeError("Symlink loop from '/tmp/loop/run'"),  # pathlib's resolve() before Python 3.13
     "/tmp/loop/run: symbolic links lead back to themselves here (a link loop); fix or remove the link"),
    (NotADirectoryError(errno.ENOTDIR, "Not a directory", "/home/me/notes.json/run"),
     "/home/me/notes.json/run: part of this path is a file, not a folder; choose another path"),
    (IsADirectoryError(errno.EISDIR, "Is a directory", "/home/me/results"),
     "/home/me/results: a folder, where a file is expected; name a file"),
    (OSError(errno.EFBIG, "File too large", "/fat32/model.safetensors"),
     "/fat32/model.safetensors: too large a file for this file system; write elsewhere"),
    (OSError(errno.EMFILE, "Too many open files"),
     "too many open files: raise the limit (ulimit -n) or run fewer processes at once"),
    (OSError(errno.ENAMETOOLONG, "File name too long", "a", None, "b" * 300),  # (a rename: two paths)
     f"a -> {'b' * 60}...{'b' * 40} (300 characters): a name in this path is too long for the file system"),
])
def test_os_errors_a_user_can_fix_are_one_line_naming_the_path(exc, said):
    """A 5,000-character --config or --output_dir (ENAMETOOLONG) and an --output_dir that is a link to itself (ELOOP)
    were tracebacks: the file system's refusals a user can fix are one line naming the path, cut short when long."""
    assert describe_os_error(exc).startswith(said)
    assert run_cli(lambda argv: (_ for _ in ()).throw(exc), []) == 2


@pytest.mark.parametrize("exc", [OSError(errno.EBADF, "Bad file descriptor"), RuntimeError("Symlink loop"),
                                 OSError(errno.EINVAL, "Invalid argument", "/x"), TypeError("unhashable type")])
def test_os_errors_of_the_code_itself_keep_their_traceback(exc):
    """A bad file descriptor or an invalid argument is this code's bug, not the user's: it is not one line."""
    assert describe_os_error(exc) is None
    with pytest.raises(type(exc)):
        run_cli(lambda argv: (_ for _ in ()).throw(exc), [])


def test_a_full_disk_during_a_checkpoint_stops_train_py_with_one_line(tmp_path, monkeypatch, capsys):
    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.safetensors"))

    monkeypatch.setattr(common.safetree, "save_file", full)
    cfg = tiny_cfg(tmp_path, method="baseline", train__steps=2, train__checkpoint_every=1)
    over = [f"--{k}={v}" for k, v in {"name": cfg.name, "output_dir": tmp_path, "model.family": "gpt2",
                                      "model.hidden_size": 32, "model.num_layers": 2, "model.num_heads": 2,
                                      "data.tokenizer": "bpe", "data.vocab_size": 384, "data.seq_len": 32,
                                      "data.max_tokens": 40000, "data.cache_dir": cfg.data.cache_dir,
                                      "train.steps": 2, "train.checkpoint_every": 1, "train.progress": False,
                                      "method.name": "baseline"}.items()]
    assert train_cli.main(over) == 2
    assert "error: disk full while writing" in capsys.readouterr().err


def test_hub_datasets_fail_fast_offline_and_name_the_variable_to_set(monkeypatch):
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("the Hub was contacted"))
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: refused at once
    with pytest.raises(HubUnavailable, match="cannot reach the Hugging Face Hub.*HF_HUB_OFFLINE=1"):
        load_hf_dataset("imdb", None)

    def miss(*a, **k):
        raise ConnectionError("Couldn't reach 'imdb' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", miss)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubUnavailable, match="not in the local Hugging Face cache and offline mode is on"):
        load_hf_dataset("imdb", None)


@pytest.mark.slow
def test_launcher_precision_is_used_and_resume_reuses_the_saved_config_and_knows_a_finished_run(tmp_path):
    over = ["--config", ROOT / "configs" / "tiny_test.yaml", "--output_dir", tmp_path, "--train.steps", 12,
            "--train.lr", "2e-3", "--data.cache_dir", ROOT / ".cache" / "data"]
    # as accelerate launch --config_file launch/accelerate/1gpu.yaml sets it up on a host without a GPU
    killed = _train(*over, env={"ACCELERATE_MIXED_PRECISION": "bf16", "ACCELERATE_USE_CPU": "False", KILL_ENV: "9"})
    assert killed.returncode == -signal.SIGKILL
    assert "precision: bf16 autocast, from the launcher" in killed.stderr
    assert "warning: no GPU on this host: accelerate launch was not given --cpu" in killed.stderr
    resumed = train_here(None, "--name", "tiny", "--output_dir", tmp_path, "--resume")  # no --config, no overrides
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming tiny from step " in resumed.stderr
    assert rows(tmp_path / "tiny", "train")[-1]["step"] > 12  # the saved budget: 12 steps (V-cycle: more)
    again = train_here(None, "--name", "tiny", "--output_dir", tmp_path, "--resume")
    assert again.returncode == 0 and "is a finished run" in again.stderr
    recipe = _train(*over, "--train.mixed_precision", "no", "--overwrite", "--method.name", "baseline",
                    "--train.steps", 2, env={"ACCELERATE_MIXED_PRECISION": "bf16"})
    assert (recipe.returncode == 0
            and "precision: fp32 (no mixed precision), from train.mixed_precision" in recipe.stderr)


def test_a_gpu_launch_config_on_a_host_without_one_is_said_not_silently_run_on_the_cpu(monkeypatch):
    """accelerate launch without --cpu (launch/accelerate/1gpu.yaml: use_cpu false, gpu_ids 0, bf16) on a CPU-only
    host: the run says it trains on the CPU, with the launcher's autocast; with --cpu, without the launcher, or on a
    GPU it says nothing."""

    import torch

    from progressive.run.accelerator import device_note

    cpu = SimpleNamespace(device=torch.device("cpu"), mixed_precision="bf16")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "False")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert device_note(cpu) == ("no GPU on this host: accelerate launch was not given --cpu (CUDA_VISIBLE_DEVICES=0), "
                                "so this run trains on the CPU with the launcher's bf16 autocast; launch with --cpu "
                                "(or without the config file) to choose the CPU on purpose")
    assert device_note(SimpleNamespace(device=torch.device("cuda", 0), mixed_precision="bf16")) is None
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")  # accelerate launch --cpu
    assert device_note(cpu) is None
    monkeypatch.delenv("ACCELERATE_USE_CPU")  # python train.py
    assert device_note(cpu) is None


def test_eta_comes_from_flops_so_cheap_early_phases_do_not_make_it_lie():
    bar = Progress(total=10, initial=0, planned_flops=1000.0, enabled=False)
    bar.update(1, "cheap", 1.0, 1e-3, wall=1.0, tokens=10, flops=10.0)
    bar.update(1, "cheap", 1.0, 1e-3, wall=2.0, tokens=20, flops=20.0)  # 10 FLOPs/s so far
    assert "eta=01:38" in bar.bar.postfix  # (1000 - 20) / 10 s, not 8 steps x 1 s
    assert "job_eta" not in bar.bar.postfix  # one run: its ETA is the job's


def test_in_a_job_of_several_runs_the_bar_also_says_when_the_whole_job_ends():
    """The main job trains the baseline, then the V-cycle on the same FLOPs budget: while the first trains, its
    bar says when the job ends too, the later runs' FLOPs at this run's FLOPs per second."""
    bar = Progress(total=10, initial=0, planned_flops=1000.0, enabled=False, budget_flops=1000.0, later_flops=1000.0)
    bar.update(1, "train", 1.0, 1e-3, wall=1.0, tokens=10, flops=10.0)
    bar.update(1, "train", 1.0, 1e-3, wall=2.0, tokens=20, flops=20.0)  # 10 FLOPs/s so far
    assert "eta=01:38" in bar.bar.postfix and "job_eta=03:18" in bar.bar.postfix  # (980 + 1000) / 10 s


def test_training_a_tokenizer_says_so(tmp_path, capsys):
    cfg = DataConfig(tokenizer="bpe", vocab_size=300, max_tokens=2000, cache_dir=str(tmp_path))
    build_tokenizer(cfg)
    assert "training a bpe tokenizer (vocabulary 300) on bundled" in capsys.readouterr().err


def test_run_cli_passes_results_and_keeps_tracebacks_for_bugs():
    assert run_cli(lambda argv: 0, []) == 0
    with pytest.raises(ZeroDivisionError):
        run_cli(lambda argv: 1 / 0, [])


def test_a_cli_in_one_of_several_processes_ends_without_tearing_down(monkeypatch):
    """Destroying a gloo process group at exit could deadlock against gloo's worker thread (a rank was found alive
    48 minutes later): a CLI that has returned in one of several processes ends the process at once, with its
    exit code, after flushing its output."""
    import torch.distributed as dist

    from common import cli

    exits = []
    monkeypatch.setattr(cli.os, "_exit", exits.append)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda *a: 2)
    assert cli.run_cli(lambda args: 0, []) == 0 and exits == [0]

    class Stopped(Exception):
        exit_code = 75

    assert cli.run_cli(lambda args: (_ for _ in ()).throw(Stopped("stopped")), [], exit_codes={Stopped: 75}) == 75
    assert exits == [0, 75]
    monkeypatch.setattr(dist, "get_world_size", lambda *a: 1)
    cli.run_cli(lambda args: 0, [])
    assert exits == [0, 75]  # one process: a normal exit


@pytest.mark.slow
def test_a_test_command_that_times_out_leaves_no_process_behind(tmp_path):
    """A timed-out torchrun left its workers alive; run_tree kills the command's whole process group."""

    from tests.procs import run_tree

    pidfile = tmp_path / "child.pid"
    script = (f"import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; "
              f"time.sleep(600)']); open({str(pidfile)!r}, 'w').write(str(c.pid)); time.sleep(600)")
    with pytest.raises(subprocess.TimeoutExpired):
        run_tree([sys.executable, "-c", script], timeout=10)
    child = int(pidfile.read_text())

    def alive(pid: int) -> bool:  # a zombie (killed, not yet reaped by whoever adopted it) is not alive
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return False
        return state not in ("Z", "X")

    for _ in range(100):
        if not alive(child):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the grandchild {child} is still alive")
