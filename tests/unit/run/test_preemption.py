"""Preemption-safe cluster jobs: one command, repeated by the scheduler, continues the run.

``--resume auto`` resumes a folder with a checkpoint and starts one without afresh (a job killed before its
first checkpoint resubmits unchanged); a SIGTERM stops at a step boundary with a checkpoint and exit 75 and
the same command finishes the run with the uninterrupted metrics; a resumed run continues the same W&B run;
launch/slurm.sh forwards the scheduler's warning signal to the job and requeues it.
"""

import os
import shutil
import signal
import stat
import subprocess
import sys

import pytest

from progressive.config import dump_yaml
from progressive.run.faults import KILL_ENV, SIGNAL_ENV
from progressive.run.trainer import Trainer
from tests.train_utils import ROOT, assert_same_rows, tiny_cfg, train_cli, train_here

OVER = dict(model__dropout=0.1, train__steps=10, train__eval_every=3, train__checkpoint_every=100)


def _config(tmp_path, name, **over):
    cfg = tiny_cfg(tmp_path / name, **{**OVER, **over})
    path = tmp_path / f"{name}.yaml"
    path.write_text(dump_yaml(cfg))
    return cfg, path


@pytest.mark.slow
def test_sigterm_then_the_same_command_gives_the_uninterrupted_metrics(tmp_path):
    ref = tiny_cfg(tmp_path / "ref", **OVER)
    Trainer(ref).run()
    cfg, path = _config(tmp_path, "job")
    first = train_cli(path, "--resume", "auto", env={SIGNAL_ENV: "5:SIGTERM"})
    assert first.returncode == 75, first.stderr[-2000:]
    assert "no checkpoint in" in first.stderr  # the first submission starts the run
    again = train_here(path, "--resume", "auto")  # the scheduler repeats the command unchanged
    assert again.returncode == 0, again.stderr[-2000:]
    assert "holds a checkpoint; resuming" in again.stderr and "from step 5 " in again.stderr
    n = assert_same_rows(ref.run_dir, cfg.run_dir)
    print(f"preemption | SIGTERM after step 5, same command again | rows compared {n} | rows equal {n}")
    done = train_here(path, "--resume", "auto")  # requeued once more after it finished: nothing to do
    assert done.returncode == 0 and "finished run" in done.stderr


@pytest.mark.slow
def test_a_job_killed_before_its_first_checkpoint_resubmits_unchanged(tmp_path):
    ref = tiny_cfg(tmp_path / "ref", **OVER, method="baseline")  # no level change: no checkpoint before step 100
    Trainer(ref).run()
    cfg, path = _config(tmp_path, "job", method="baseline")
    killed = train_cli(path, "--resume", "auto", env={KILL_ENV: "3"})
    assert killed.returncode == -signal.SIGKILL
    assert (cfg.run_dir / "metrics.jsonl").is_file() and not (cfg.run_dir / "checkpoints").exists()
    plain = train_here(path)  # without --resume auto the folder is refused, as before
    assert plain.returncode == 2 and "already exists" in plain.stderr
    again = train_here(path, "--resume", "auto")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "no checkpoint in" in again.stderr and "starting again" in again.stderr
    assert_same_rows(ref.run_dir, cfg.run_dir)


def test_resume_auto_never_empties_a_folder_train_py_did_not_create(tmp_path):  # in this process, refused
    cfg, path = _config(tmp_path, "job")
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / "notes.txt").write_text("mine")
    proc = train_here(path, "--resume", "auto")
    assert proc.returncode == 2 and "was not created by train.py" in proc.stderr
    assert (cfg.run_dir / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_a_resumed_run_continues_the_same_wandb_run(tmp_path):
    cfg, path = _config(tmp_path, "job", method="baseline", train__report_to="wandb", train__steps=6)
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    first = train_cli(path, "--resume", "auto", env={**env, SIGNAL_ENV: "3:SIGTERM"})
    assert first.returncode == 75, first.stderr[-2000:]
    run_id = (cfg.run_dir / "wandb_run_id").read_text().strip()
    files = list((cfg.run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(files) == 1 and files[0].stat().st_size > 1000  # flushed and closed at the stop, not a 7-byte header
    again = train_cli(path, "--resume", "auto", env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert (cfg.run_dir / "wandb_run_id").read_text().strip() == run_id
    runs = sorted((cfg.run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.name.endswith(run_id) for r in runs)  # both parts logged to one run id


def _stub(folder, name, body):
    path = folder / name
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _slurm(tmp_path, job_exit: int, term: bool, args: tuple[str, ...] = ()):
    """Run launch/slurm.sh with stub srun / scontrol / accelerate on PATH: the 'training' records the signal
    it gets and exits ``job_exit``; with ``term`` the scheduler's warning signal reaches the batch shell."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "log.txt"
    _stub(bin_, "scontrol", f'if [ "$1" = show ]; then echo node1; else echo "scontrol $*" >> {log}; fi\n')
    _stub(bin_, "srun", 'while [ "${1#--}" != "$1" ]; do shift; done; exec "$@"\n')  # drop srun's options
    _stub(bin_, "accelerate", f'echo "accelerate $*" >> {log}; printf "arg:%s\\n" "$@" >> {log}\n'
                              f'trap \'echo "job got TERM" >> {log}; exit {job_exit}\' TERM\n'
                              'touch "$GT_READY"; for i in $(seq "$GT_LOOPS"); do sleep 0.1; done; exit 0\n')
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: slurmtest\n")
    ready = tmp_path / "ready"
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n1",
           "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_SUBMIT_DIR": str(tmp_path), "GT_READY": str(ready),
           "GT_LOOPS": "600" if term else "1"}
    proc = subprocess.Popen(["bash", str(ROOT / "launch" / "slurm.sh"), str(recipe), *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if term:
        for _ in range(300):  # wait until the job runs (a file it writes), not for a time
            if ready.exists():
                break
            subprocess.run(["sleep", "0.05"])
        proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, log.read_text() if log.exists() else "", err


def test_slurm_script_forwards_the_warning_signal_and_requeues_a_stopped_job(tmp_path):
    assert shutil.which("bash")
    code, log, err = _slurm(tmp_path, job_exit=75, term=True)
    assert "--resume auto" in log and "--config" in log, log
    assert "job got TERM" in log, (log, err)
    assert "scontrol requeue 42" in log, (log, err)
    assert code == 0, err


def test_slurm_script_does_not_requeue_a_finished_job(tmp_path):
    code, log, err = _slurm(tmp_path, job_exit=0, term=False)
    assert "requeue" not in log and code == 0, (log, err)


def test_slurm_script_parses():
    assert subprocess.run(["bash", "-n", str(ROOT / "launch" / "slurm.sh")]).returncode == 0
    text = (ROOT / "launch" / "slurm.sh").read_text()
    assert "#SBATCH --signal=B:TERM@" in text and "#SBATCH --requeue" in text
    assert sys.executable  # the script runs python from the environment the job activates


def test_slurm_script_passes_each_argument_verbatim_and_runs_none(tmp_path):
    """Arguments reached the node's shell pasted into its command text: ';touch FILE' ran, a space split one."""
    code, log, err = _slurm(tmp_path, job_exit=0, term=False,
                            args=("--train.lr", "1e-3;touch PWNED", "--name", "my run"))
    assert not (tmp_path / "PWNED").exists(), log
    assert "arg:1e-3;touch PWNED" in log and "arg:my run" in log, log
    assert code == 0, err


def test_slurm_script_reads_the_run_folder_from_the_arguments_before_requeueing(tmp_path):
    """A signalled job whose run (named by --name / --output_dir, not the recipe) has finished is not requeued."""
    done = tmp_path / "elsewhere" / "mine"
    done.mkdir(parents=True)
    (done / "summary.json").write_text("{}")
    code, log, err = _slurm(tmp_path, job_exit=1, term=True, args=("--output_dir", "elsewhere", "--name=mine"))
    assert "job got TERM" in log and "requeue" not in log, (log, err)
    code, log2, err = _slurm(tmp_path / "again", job_exit=1, term=True, args=("--name", "other")) \
        if (tmp_path / "again").mkdir() is None else (None, None, None)
    assert "scontrol requeue 42" in log2, (log2, err)  # not finished: requeued
