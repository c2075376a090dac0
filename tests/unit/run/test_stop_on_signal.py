"""Signals save the work: SIGINT/SIGTERM stop at the next step boundary with a checkpoint and the command that
resumes (exit 75); the resumed run is the uninterrupted one bit for bit; under DDP a signal on one rank
stops every rank at the same step; a second signal (or a step that does not end in time) stops at once
(exit 130) without corrupting anything, also in the middle of a checkpoint write."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

import progressive.run.checkpoint
import progressive.run.loop
import progressive.run.stop
from progressive.config import dump_yaml
from progressive.run import checkpoint as ckpt
from progressive.run.start import decide
from progressive.run.stop import Interrupted, Stopped
from progressive.run.trainer import SIGNAL_ENV, Trainer
from tests.procs import run_tree
from tests.train_many import MARK
from tests.train_utils import ROOT, rows, stderr_of, tiny_cfg, train_here

# Dropout on, so the restored RNG state matters; checkpoints only where the test puts them.
OVER = dict(model__dropout=0.1, train__steps=10, train__eval_every=3, train__checkpoint_every=100)
KEYS = ("kind", "step", "phase", "phase_name", "tokens", "flops", "loss", "lr", "val_loss")


def _trajectory(run_dir):
    return [[r.get(k) for k in KEYS] for r in rows(run_dir)]


def _train(*args, env=None):
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    cfg = tiny_cfg(tmp_path_factory.mktemp("ref"), **OVER)
    Trainer(cfg).run()
    return _trajectory(cfg.run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_checkpoints_at_the_step_boundary_and_the_printed_command_resumes_the_same_run(
        tmp_path, reference, sig):
    cfg = tiny_cfg(tmp_path, **OVER)
    path = tmp_path / "run.yaml"
    path.write_text(dump_yaml(cfg))
    stopped = _train("--config", path, env={SIGNAL_ENV: f"4:{sig}"})
    assert stopped.returncode == 75, stopped.stderr[-2000:]
    lines = stopped.stderr.strip().splitlines()
    assert f"received {sig}: stopping at the end of this step with a checkpoint" in stopped.stderr
    assert lines[-2].startswith(f"stopped by {sig} after step 4 (phase L1); checkpoint ")
    assert [read["step"] for read in map(ckpt.read_state, ckpt.list_checkpoints(cfg.run_dir))][-1] == 4
    command = lines[-1].removeprefix("resume with: ")
    assert command == f"python train.py --resume --name gpt2-vcycle --output_dir {tmp_path}"
    argv = shlex.split(command)
    assert argv[:2] == ["python", "train.py"]
    resumed = train_here(None, *argv[2:])  # the printed command's arguments, as they are, to train.py's main here
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming gpt2-vcycle from step 4" in resumed.stderr
    assert _trajectory(cfg.run_dir) == reference


@pytest.mark.slow
def test_under_ddp_a_signal_on_one_rank_stops_every_rank_at_the_same_step(tmp_path, ddp_reference):
    over = dict(method="baseline", train__cpu=True, train__threads=1, train__steps=8, train__eval_every=4)
    cfg = tiny_cfg(tmp_path, **over, train__checkpoint_every=100)
    path = tmp_path / "ddp.yaml"
    path.write_text(dump_yaml(cfg))
    proc = run_tree([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(ROOT / "train.py"), "--config", str(path)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**os.environ, SIGNAL_ENV: "3:SIGTERM:1"})
    assert proc.returncode != 0 and "stopped by a signal on another process after step 3" in proc.stderr, \
        proc.stderr[-3000:]
    (only,) = ckpt.list_checkpoints(cfg.run_dir)  # one checkpoint, written by both ranks together
    state = ckpt.verify(only)
    assert state["step"] == 3 and state["world_size"] == 2
    # the uninterrupted run on 2 processes (checkpoints change no metric), trained in the launch that resumes this
    # one (--resume auto: it has no checkpoint and starts fresh) unless the session has it already
    (ref,) = ddp_reference.many([over], cfg, resume="auto")  # asserts both finished, on 2 processes
    proc = ddp_reference.launch
    resumed = stderr_of(proc, cfg) if MARK in proc.stderr else proc.stderr
    assert "resuming gpt2-baseline from step 3" in resumed, resumed[-3000:]
    assert _trajectory(cfg.run_dir) == _trajectory(ref.run_dir)


def test_a_second_ctrl_c_stops_at_once_and_the_last_checkpoint_resumes_the_same_run(tmp_path, reference,
                                                                                     monkeypatch):
    monkeypatch.setattr(progressive.run.stop, "DUPLICATE_S", 0.0)  # two signals in one step are two presses here
    monkeypatch.setenv(SIGNAL_ENV, "5:SIGINT,5:SIGINT")
    cfg = tiny_cfg(tmp_path, **{**OVER, "train__checkpoint_every": 2})
    # Python's default, or SIG_IGN where a shell started pytest in the background
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(Interrupted, match=r"stopped at once on a second SIGINT, without a new checkpoint; the last "
                                          r"complete checkpoint is .*step00000004") as e:
        Trainer(cfg).run()
    assert e.value.exit_code == 130
    assert signal.getsignal(signal.SIGINT) is before  # the handler is given back
    assert [p.name for p in ckpt.list_checkpoints(cfg.run_dir)][-1].startswith("step00000004")
    monkeypatch.delenv(SIGNAL_ENV)
    Trainer(cfg, decide(cfg.run_dir, True)).run()
    assert _trajectory(cfg.run_dir) == reference


def test_a_signal_forwarded_twice_by_a_launcher_is_one_request(tmp_path, monkeypatch):
    monkeypatch.setenv(SIGNAL_ENV, "5:SIGINT,5:SIGINT")  # within DUPLICATE_S: torchrun forwards the terminal's
    cfg = tiny_cfg(tmp_path, **OVER)
    with pytest.raises(Stopped, match="stopped by SIGINT after step 5"):
        Trainer(cfg).run()
    assert ckpt.read_state(ckpt.list_checkpoints(cfg.run_dir)[-1])["step"] == 5


def test_a_stop_in_the_middle_of_a_checkpoint_write_leaves_every_checkpoint_whole(tmp_path, reference, monkeypatch):
    real, calls = progressive.run.checkpoint.save_tree, []

    def interrupted_write(obj, folder, name):  # the second checkpoint is cut short after its first part
        calls.append(name)
        real(obj, folder, name)
        if len(calls) == len(ckpt.PARTS) + 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(progressive.run.checkpoint, "save_tree", interrupted_write)
    cfg = tiny_cfg(tmp_path, **{**OVER, "train__checkpoint_every": 2})
    with pytest.raises(Interrupted):
        Trainer(cfg).run()
    found = ckpt.list_checkpoints(cfg.run_dir)
    assert found and all(ckpt.is_good(p) for p in found)
    assert not [p for p in (cfg.run_dir / "checkpoints").iterdir() if p.name.startswith(".")]  # no torn folder
    monkeypatch.setattr(progressive.run.checkpoint, "save_tree", real)
    Trainer(cfg, decide(cfg.run_dir, True)).run()
    assert _trajectory(cfg.run_dir) == reference


def test_a_step_that_does_not_end_within_the_timeout_is_stopped_at_once(tmp_path, monkeypatch):

    from progressive.run.faults import armed

    def slow_after_the_signal(step, rank, **kw):
        armed().after_step(step, rank, **kw)
        if step == 3:
            time.sleep(60)  # a step that never reaches its boundary in time; the bounded wait ends it

    monkeypatch.setattr(progressive.run.loop, "armed", lambda: SimpleNamespace(after_step=slow_after_the_signal))
    monkeypatch.setenv(SIGNAL_ENV, "3:SIGINT")
    cfg = tiny_cfg(tmp_path, **{**OVER, "train__stop_timeout": 0.5})
    t0 = time.monotonic()
    with pytest.raises(Interrupted, match=r"no step boundary within 0.5 s of SIGINT") as e:
        Trainer(cfg).run()
    assert e.value.exit_code == 130 and time.monotonic() - t0 < 300


def test_stopping_on_a_signal_is_a_report_not_an_error(capsys):
    from common.cli import run_cli

    def stops(argv):
        raise Stopped("stopped by SIGINT after step 4 (phase L1); checkpoint x\nresume with: python train.py --resume")

    assert run_cli(stops, [], exit_codes={Stopped: 75}) == 75
    assert capsys.readouterr().err.startswith("stopped by SIGINT")


def test_a_stopped_comparison_resumes_with_the_printed_command_and_reuses_what_finished(tmp_path, monkeypatch,
                                                                                        capsys):
    from progressive import cli as train_cli

    args = ["--config", str(ROOT / "configs" / "tiny_test.yaml"), "--data.cache_dir", str(ROOT / ".cache" / "data"),
            "--train.steps", "6", "--train.checkpoint_every", "100", "--model.dropout", "0.1", "--train.plots", "false"]
    assert train_cli.main([*args, "--compare", "baseline,vcycle", "--name", "ref", "--output_dir",
                           str(tmp_path)]) == 0
    monkeypatch.setenv(SIGNAL_ENV, "3:SIGINT")  # each method's step 3: the baseline stops first
    assert train_cli.main([*args, "--compare", "baseline,vcycle", "--name", "cmp", "--output_dir",
                           str(tmp_path)]) == 75
    command = capsys.readouterr().err.strip().splitlines()[-1].removeprefix("resume with: ")
    assert command == f"python train.py --compare baseline,vcycle --resume --name cmp --output_dir {tmp_path}"
    monkeypatch.setenv(SIGNAL_ENV, "")
    assert train_cli.main(shlex.split(command)[2:]) == 0  # resumes the baseline, then runs the V-cycle
    for m in ("baseline", "vcycle"):
        assert _trajectory(tmp_path / "cmp" / m) == _trajectory(tmp_path / "ref" / m)
    ref, got = (json.loads((tmp_path / n / "compare.json").read_text())["results"] for n in ("ref", "cmp"))
    assert [r["final_val_loss"] for r in got] == [r["final_val_loss"] for r in ref]
    assert train_cli.main(shlex.split(command)[2:]) == 0  # both finished: reused, the table written again


def _main_job(tmp_path):
    """A tiny main job (train.with_baseline: the baseline, then Apollo) as a recipe file."""
    cfg = tiny_cfg(tmp_path, method="apollo", name="job", model__num_layers=4, train__steps=6, train__eval_every=3,
                   train__checkpoint_every=100, train__threads=1, train__with_baseline=True,
                   method__apollo__layers=[1, 2, 4], method__apollo__boundaries=[0.25, 0.5])
    path = tmp_path / "apollo.yaml"
    path.write_text(dump_yaml(cfg))
    return path


def test_a_resumed_comparison_trains_the_methods_it_started_with_and_refuses_another_recipe(tmp_path, monkeypatch,
                                                                                           capsys):
    """The main job of an Apollo recipe, stopped in its baseline and resumed with ``--resume --name`` alone, trained
    the default recipe's V-cycle after the baseline (exit 0; compare.json compared baseline with vcycle)."""
    from progressive import cli as train_cli

    path, where = _main_job(tmp_path), ["--name", "job", "--output_dir", str(tmp_path)]
    monkeypatch.setenv(SIGNAL_ENV, "3:SIGINT")
    assert train_cli.main(["--config", str(path)]) == 75  # stopped in the baseline
    monkeypatch.delenv(SIGNAL_ENV)
    assert train_cli.main(["--resume", *where]) == 0  # the documented command: the folder says what to continue
    assert sorted(p.name for p in (tmp_path / "job").iterdir() if p.is_dir()) == ["apollo", "baseline"]
    compared = json.loads((tmp_path / "job" / "compare.json").read_text())["results"]
    assert [r["method"] for r in compared] == ["baseline", "apollo"]
    capsys.readouterr()
    for other, said in (
            (["--compare", "baseline,vcycle"], "compares baseline,apollo (the first is the reference), not "
                                               "baseline,vcycle; resume it as it was started: python train.py "
                                               "--compare baseline,apollo --resume --name job"),
            (["--config", str(ROOT / "configs" / "tiny_test.yaml")],
             "was started with another recipe (saved -> now: ")):
        assert train_cli.main(["--resume", *where, *other]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and err.startswith("error: --resume: ") and said in err, err
    one_run = ["--name", "baseline", "--output_dir", str(tmp_path / "job"), "--compare", "baseline,apollo"]
    assert train_cli.main(["--resume", *one_run]) == 2  # a folder of one run never becomes a comparison
    assert "holds one run, not a comparison: resume it without --compare" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "job").iterdir() if p.is_dir()) == ["apollo", "baseline"]
    assert sorted(p.name for p in (tmp_path / "job" / "baseline").iterdir() if p.is_dir()) == ["checkpoints", "final"]


def test_a_signal_between_the_methods_of_a_comparison_stops_with_the_command_that_resumes(tmp_path, monkeypatch,
                                                                                         capsys):
    """Between two methods no handler was installed: the signal killed the command (143 for SIGTERM; here SIGINT,
    which a test process survives: 130), with no stop line and no resume command."""
    import progressive.report.compare as compare
    from progressive import cli as train_cli

    real = compare.release_memory

    def signal_in_the_pause():
        real()
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(compare, "release_memory", signal_in_the_pause)
    args = ["--config", str(ROOT / "configs" / "tiny_test.yaml"), "--data.cache_dir", str(ROOT / ".cache" / "data"),
            "--train.steps", "4", "--train.threads", "1", "--train.plots", "false", "--name", "cmp", "--output_dir",
            str(tmp_path)]
    assert train_cli.main([*args, "--compare", "baseline,vcycle"]) == 75
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-2] == "stopped by SIGINT after baseline finished, before vcycle started"
    assert lines[-1] == (f"resume with: python train.py --compare baseline,vcycle --resume --name cmp --output_dir "
                         f"{tmp_path}")
    assert not (tmp_path / "cmp" / "vcycle").exists()
    monkeypatch.setattr(compare, "release_memory", real)
    assert train_cli.main(["--resume", "--name", "cmp", "--output_dir", str(tmp_path)]) == 0
    assert [r["method"] for r in json.loads((tmp_path / "cmp" / "compare.json").read_text())["results"]] == \
        ["baseline", "vcycle"]


def test_a_signal_while_the_final_outputs_are_written_lets_them_finish_and_exits_75(tmp_path, monkeypatch, capsys):
    """After the last step no handler was installed: a signal in the final writes killed the run (143 for SIGTERM;
    here SIGINT: 130) with its summary unwritten."""
    import progressive.run.summary as summary
    from progressive import cli as train_cli

    real = summary.report_end

    def signal_in_the_final_writes(*a, **k):
        os.kill(os.getpid(), signal.SIGINT)
        real(*a, **k)

    monkeypatch.setattr(summary, "report_end", signal_in_the_final_writes)
    cfg = tiny_cfg(tmp_path, method="baseline", train__steps=4, train__threads=1)
    path = tmp_path / "run.yaml"
    path.write_text(dump_yaml(cfg))
    assert train_cli.main(["--config", str(path)]) == 75
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-2] == "stopped by SIGINT after the run gpt2-baseline had finished: its outputs are complete"
    assert lines[-1].startswith("resume with: python train.py --resume --name gpt2-baseline")
    assert json.loads((cfg.run_dir / "summary.json").read_text())["steps"] == 4


def test_a_signal_while_the_data_loads_stops_before_the_first_step_and_resumes_the_same_run(tmp_path, reference,
                                                                                           monkeypatch, capsys):
    """The handler is the command's from its start: a signal while the run loads stops it before its first step,
    with a checkpoint of step 0 that resumes the uninterrupted trajectory (it ended the process, exit 130/143)."""
    from progressive import cli as train_cli
    from progressive.run.inputs import RunData

    real = RunData.load.__func__

    def signal_while_loading(cls, *a, **k):
        os.kill(os.getpid(), signal.SIGINT)
        return real(cls, *a, **k)

    monkeypatch.setattr(RunData, "load", classmethod(signal_while_loading))
    cfg = tiny_cfg(tmp_path, **OVER)
    path = tmp_path / "run.yaml"
    path.write_text(dump_yaml(cfg))
    assert train_cli.main(["--config", str(path)]) == 75
    assert capsys.readouterr().err.strip().splitlines()[-2].startswith("stopped by SIGINT after step 0 (phase L0-down)")
    assert [ckpt.read_state(p)["step"] for p in ckpt.list_checkpoints(cfg.run_dir)] == [0]
    monkeypatch.undo()
    Trainer(cfg, decide(cfg.run_dir, True)).run()
    assert _trajectory(cfg.run_dir) == reference


DRIVER = """
import atexit, os, signal, sys
import progressive.report.compare as compare
where = sys.argv[1]
if where == "exit":  # a scheduler's repeat that lands while the process exits after its stop
    atexit.register(os.kill, os.getpid(), signal.SIGTERM)
else:  # the pause between the methods of a comparison
    release = compare.release_memory
    def pause():
        release()
        os.kill(os.getpid(), signal.SIGTERM)
    compare.release_memory = pause
sys.argv = ["train.py", *sys.argv[2:]]
from progressive.cli import entry
sys.exit(entry())
"""


@pytest.mark.slow
@pytest.mark.parametrize("where", ["exit", "between"])
def test_sigterm_repeated_while_the_process_exits_or_between_methods_still_exits_75(tmp_path, where):
    """A SIGTERM repeated 0.5 s after the first (a scheduler's habit) printed the stop line and the resume command,
    then killed the process: exit 143. So did a SIGTERM between the two methods of the main job or a --compare."""
    args = ["--config", str(ROOT / "configs" / "tiny_test.yaml"), "--data.cache_dir", str(ROOT / ".cache" / "data"),
            "--train.steps", "4", "--train.threads", "1", "--train.plots", "false", "--name", "job", "--output_dir",
            str(tmp_path)]
    if where == "between":
        args += ["--compare", "baseline,vcycle"]
    env = {**os.environ, SIGNAL_ENV: "3:SIGTERM"} if where == "exit" else None
    proc = run_tree([sys.executable, "-c", DRIVER, where, *args], capture_output=True, text=True, timeout=300,
                    cwd=ROOT, env=env)
    assert proc.returncode == 75, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert lines[-2] == ("stopped by SIGTERM after step 3 (phase L1); checkpoint "
                         f"{tmp_path / 'job' / 'checkpoints' / 'step00000003-phase01'}" if where == "exit" else
                         "stopped by SIGTERM after baseline finished, before vcycle started")
    assert lines[-1].startswith("resume with: python train.py ")


# train.py's entry under torchrun, with counters of what makes a host wait: scalar reads of tensors (.item(),
# float(), bool(): aten._local_scalar_dense, which on a GPU waits for every kernel queued before it) and
# collectives called from Python, blocking or asynchronous (with the device of the asynchronous ones' tensors).
# Each process writes the counts of every step (from one step's start to the next's: the step, its row if any,
# and the stop check), the step it stopped after and its exit code.
_COUNTING = """
import json, os, sys
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

import common.cli
from progressive import cli
from progressive.run.loop import TrainingRun

count = {"reads": 0, "blocking": 0, "async": 0}
async_devices, starts, stopped = set(), [], []


class ScalarReads(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        count["reads"] += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


for name in ("all_reduce", "broadcast", "barrier", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
             "reduce", "gather", "scatter", "all_gather_object", "broadcast_object_list", "gather_object"):
    def spy(*a, _real=getattr(dist, name), **k):
        if k.get("async_op"):
            count["async"] += 1
            async_devices.add(str(a[0].device))
        else:
            count["blocking"] += 1
        return _real(*a, **k)
    setattr(dist, name, spy)
real_step, real_stop = TrainingRun._train_step, TrainingRun._stop_at_boundary


def step(self):
    starts.append((self.c.step + 1, dict(count)))
    real_step(self)


def stop(self):
    stopped.append(self.c.step)
    real_stop(self)


def leave(code, _real=common.cli.leave_if_distributed):  # the CLI's last call: it ends the process here
    steps = [dict(step=s, **{k: b[k] - a[k] for k in a}) for (s, a), (_, b) in zip(starts, starts[1:])]
    with open(os.path.join(sys.argv[2], f"rank{os.environ['RANK']}.json"), "w") as f:
        json.dump({"world": int(os.environ["WORLD_SIZE"]), "code": code, "stopped_after": stopped, "steps": steps,
                   "async_devices": sorted(async_devices)}, f)
    _real(code)


TrainingRun._train_step, TrainingRun._stop_at_boundary, common.cli.leave_if_distributed = step, stop, leave
with ScalarReads():
    sys.exit(cli.main(["--config", sys.argv[1]]))
"""


@pytest.mark.slow
def test_under_ddp_the_stop_check_waits_for_no_device_and_a_signal_still_stops_every_rank_at_one_step(tmp_path):
    """Two gloo processes, a row only at the end (train.log_every 100): a step without a row reads no tensor and
    calls no blocking collective (the stop vote is one asynchronous all-reduce of a host tensor, read a step
    later); a SIGTERM to rank 1 after step 5 is agreed after step 6 on both ranks: one checkpoint, exit 75."""
    cfg = tiny_cfg(tmp_path, method="baseline", train__cpu=True, train__threads=1, train__steps=10,
                   train__log_every=100, train__eval_every=100, train__checkpoint_every=100)
    path, script = tmp_path / "run.yaml", tmp_path / "counting.py"
    path.write_text(dump_yaml(cfg))
    script.write_text(_COUNTING)
    proc = run_tree([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                     str(script), str(path), str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                    env={**os.environ, SIGNAL_ENV: "5:SIGTERM:1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert "stopped by a signal on another process after step 6" in proc.stderr, proc.stderr[-3000:]
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["world"] == 2 and got["code"] == 75 and got["stopped_after"] == [6], got
        plain = [s for s in got["steps"] if s["step"] <= 5]  # the steps before the stop: no row, no checkpoint
        assert [s["step"] for s in plain] == [1, 2, 3, 4, 5]
        print(f"rank {rank}: per step (scalar reads, blocking collectives, asynchronous collectives): "
              f"{[(s['reads'], s['blocking'], s['async']) for s in plain]}")
        assert all(s["reads"] == 0 and s["blocking"] == 0 and s["async"] == 1 for s in plain), plain
        assert got["async_devices"] == ["cpu"]  # the vote's tensor lives in host memory (a GPU run's too)
    (only,) = ckpt.list_checkpoints(cfg.run_dir)  # written by both ranks together, at the agreed step
    assert ckpt.verify(only)["step"] == 6


# StopVote alone on two gloo processes, the default group's backend reported as NCCL's (as on GPUs): the votes
# go through a gloo group of their own, made once. Rank 1 raises its flag at call 3 only.
_VOTES = """
import json, os, sys
import torch.distributed as dist

from common.cli import leave_if_distributed
from progressive.run import stop

dist.init_process_group("gloo")
dist.get_backend = lambda group=None: "nccl"
rank, made = dist.get_rank(), []
real_new_group = dist.new_group
dist.new_group = lambda *a, **k: made.append(k.get("backend")) or real_new_group(*a, **k)
vote, answers = stop.StopVote(), []
for call in range(1, 6):
    answers.append(vote(rank == 1 and call == 3))
at_once = stop.StopVote()
answers_at_once = [at_once(rank == 0 and call == 2, at_once=True) for call in range(1, 4)]
vote.settle()  # call 5's vote, still in flight: every process finishes it before any leaves
with open(os.path.join(sys.argv[1], f"votes{rank}.json"), "w") as f:
    json.dump({"answers": answers, "at_once": answers_at_once, "groups_made": made,
               "own_group": stop._host_group() is not None}, f)
leave_if_distributed(0)  # as the CLI ends: tearing gloo's groups down at exit can abort a rank (common/cli.py)
"""


@pytest.mark.slow
def test_stop_vote_answers_a_step_later_on_every_rank_over_a_gloo_group_of_its_own(tmp_path):
    script = tmp_path / "votes.py"
    script.write_text(_VOTES)
    proc = run_tree([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                     str(script), str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                    env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        got = json.loads((tmp_path / f"votes{rank}.json").read_text())
        assert got["answers"] == [False, False, False, True, False]  # call 3's flag, agreed at call 4; then reset
        assert got["at_once"] == [False, True, False]  # a synchronized step answers for itself
        assert got["groups_made"] == ["gloo"] and got["own_group"]  # one gloo group beside "NCCL", made once
