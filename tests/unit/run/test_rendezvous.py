"""A launch whose ranks were set by hand (WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT, no torchrun) waits for its
peers a bounded time, naming the ones that never came, and acts on SIGTERM while it waits; and a signal reaches a
process whose main thread is blocked in a native call (progressive/run/rendezvous.py, progressive/run/stop.py's
watchdog)."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from progressive.run import rendezvous
from progressive.run.rendezvous import RendezvousTimeout, meet
from tests.train_utils import CACHE, ROOT


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _line(stream, timeout: float = 120) -> str:
    """The next line of a child's pipe, or "" if none came within ``timeout`` seconds (a hang fails, never blocks)."""
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline() if ready else ""


def _env(rank: int, port: int, world: int = 2) -> dict[str, str]:
    return {"WORLD_SIZE": str(world), "RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def test_rank_0_alone_names_the_ranks_that_never_came_within_the_timeout():
    t0 = time.monotonic()
    with pytest.raises(RendezvousTimeout, match=r"rendezvous at 127\.0\.0\.1:\d+: ranks 1, 2 of 3 did not come "
                                                r"within 0\.5 s \(train\.rendezvous_timeout\)"):
        meet(0.5, None, env=_env(0, _free_port(), world=3))
    assert time.monotonic() - t0 < 30  # bounded: torch's own wait is 30 minutes


def test_a_rank_whose_rank_0_never_serves_says_so_within_the_timeout():
    with pytest.raises(RendezvousTimeout, match=r"rank 0 never answered within 0\.5 s"):
        meet(0.5, None, env=_env(1, _free_port()))


def test_a_signal_seen_by_the_stop_handler_ends_the_wait_with_the_stopped_exit():
    from progressive.run.stop import Stopped

    class Seen:  # the stop handler after a SIGTERM
        signum, name = signal.SIGTERM, "SIGTERM"

    with pytest.raises(Stopped, match="stopped by SIGTERM while waiting for the other ranks at 127.0.0.1"):
        meet(60, Seen(), env=_env(0, _free_port()))


def test_nothing_is_waited_for_under_torchrun_or_alone():
    port = _free_port()
    meet(0.1, None, env={**_env(0, port), "TORCHELASTIC_RUN_ID": "x"})  # torchrun's agents met already
    meet(0.1, None, env={"WORLD_SIZE": "1", "RANK": "0"})
    meet(0.1, None, env={})
    assert not rendezvous._SERVED


def test_a_hand_set_environment_missing_its_address_is_refused_naming_the_variable():
    with pytest.raises(ValueError, match="MASTER_PORT is not set"):
        meet(1, None, env={"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1"})


_MEET_THEN_GROUP = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from progressive.run.rendezvous import meet
    meet(60, None)
    dist.init_process_group("gloo")  # torch's env:// store is served by the one meet made (multi_tenant)
    x = torch.ones(1)
    dist.all_reduce(x)
    print("sum", int(x.item()), flush=True)
    dist.destroy_process_group()
""")


@pytest.mark.slow
def test_two_ranks_started_apart_meet_and_make_their_process_group_on_the_same_port():
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    late = subprocess.Popen([sys.executable, "-c", _MEET_THEN_GROUP], env={**env, **_env(1, port)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # rank 1 first: it retries until rank 0 serves
    first = subprocess.run([sys.executable, "-c", _MEET_THEN_GROUP], env={**env, **_env(0, port)},
                           capture_output=True, text=True, timeout=120)
    out, err = late.communicate(timeout=120)
    assert first.returncode == 0 and late.returncode == 0, first.stderr[-2000:] + err[-2000:]
    assert first.stdout.split() == ["sum", "2"] and out.split() == ["sum", "2"]
    assert "Traceback" not in err + first.stderr


@pytest.mark.slow
def test_train_py_with_a_peer_that_never_comes_names_it_and_stops_on_sigterm_with_75(tmp_path):
    port = _free_port()
    cmd = [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "tiny_test.yaml"),
           "--data.cache_dir", CACHE, "--output_dir", str(tmp_path), "--name", "alone", "--method.name", "baseline",
           "--train.steps", "4"]
    p = subprocess.Popen(cmd, env={**os.environ, **_env(0, port), "LOCAL_RANK": "0"}, stderr=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, text=True)
    first = _line(p.stderr)  # the wait's first line: the handlers are installed by then
    if not first:
        p.kill()
    assert first.startswith(f"waiting for rank 1 of 2 at 127.0.0.1:{port} (") and "train.rendezvous_timeout" in first
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    rest = p.stderr.read()
    assert p.wait(timeout=60) == 75, rest
    assert time.monotonic() - t0 < 30
    assert f"stopped by SIGTERM while waiting for the other ranks at 127.0.0.1:{port}; nothing had started" in rest
    assert "Traceback" not in rest


_BLOCKED = textwrap.dedent("""
    import sys
    from datetime import timedelta
    import progressive.run.stop as stop
    from torch.distributed import TCPStore
    stop.NATIVE_GRACE_S = 1.0
    store = TCPStore("127.0.0.1", int(sys.argv[1]), 1, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=300))
    with stop.stopping(1.0, "python train.py --resume", "the run x"):
        print("blocked", flush=True)
        store.get("a key nobody sets")  # one native call of 300 s: Python's handler cannot run inside it
""")


def _sigterm_while_blocked(script: str, ready: str, within: float, never: str) -> tuple[int, str]:
    """Run ``script`` in a child until it prints ``ready`` (it then blocks in one native call), SIGTERM it, and
    return (its exit code, its stderr); fails with ``never`` if it has not ended ``within`` seconds later."""
    p = subprocess.Popen([sys.executable, "-c", script, str(_free_port())],
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    assert _line(p.stdout).strip() == ready
    time.sleep(0.5)  # inside the native call
    p.send_signal(signal.SIGTERM)
    try:
        _, err = p.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail(never)
    return p.returncode, err


@pytest.mark.slow
def test_a_sigterm_ends_a_process_blocked_in_a_native_call_after_the_bounded_wait():
    # within 60 s: the bounded wait (1 s) and the grace (1 s), not the call's 300 s
    code, err = _sigterm_while_blocked(_BLOCKED, "blocked", 60, "SIGTERM was never acted on: the process stayed "
                                       "blocked in the native call")
    assert code == 128 + signal.SIGTERM, err[-2000:]
    assert "stopped at once: SIGTERM was not acted on within" in err
    assert "the last complete checkpoint resumes" in err


_JOINING = textwrap.dedent("""
    import sys
    from datetime import timedelta
    import progressive.run.stop as stop
    from torch.distributed import TCPStore
    store = TCPStore("127.0.0.1", int(sys.argv[1]), 1, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=300))
    with stop.stopping(60.0, "python train.py --resume", "the run x") as s, s.joining():
        print("joining", flush=True)
        store.get("a key nobody sets")  # as init_process_group waits for a peer that has already failed
""")


@pytest.mark.slow
def test_a_sigterm_while_the_processes_join_ends_the_process_soon_with_75():
    """A launch whose main process failed before the process group (its folder in use) had torchrun SIGTERM the
    others while they waited in init_process_group; each waited out the bounded wait (train.stop_timeout 20 s +
    10 s) and torchrun's SIGKILL (30 s) ended it. Inside ``joining`` the wait is JOIN_GRACE_S, and nothing had
    started: exit 75, one line. Here the bounded wait is 60 s, so only the join's grace ends it in time."""
    code, err = _sigterm_while_blocked(_JOINING, "joining", 50, "SIGTERM while joining waited for the bounded wait "
                                       "(60 s + the grace), not the join's grace")
    assert code == 75, err[-2000:]
    assert "stopped by SIGTERM while the processes were joining" in err and "Traceback" not in err


def test_a_join_that_returns_after_a_signal_leaves_the_stop_to_the_first_step():
    """A signal inside ``joining`` whose call returns in time: the watchdog's deadline becomes the bounded wait's
    again (the run stops at its first step with a checkpoint, as for any signal before it), not the join's
    grace, which would end the process while the data loads."""
    from progressive.run import stop as stop_mod

    s = stop_mod.StopOnSignal(60.0, say=lambda msg: None)
    with s:
        with s.joining():
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 10
            while s._watchdog._first is None and time.monotonic() < deadline:  # the watchdog thread reads it
                time.sleep(0.01)
            assert s._watchdog.deadline - time.monotonic() < stop_mod.JOIN_GRACE_S + 0.5  # the join's grace
        assert s._watchdog.deadline - time.monotonic() > 60  # the bounded wait + NATIVE_GRACE_S, from the signal
        assert s.signum == signal.SIGTERM  # Python's handler saw it: the first step's check stops the run
        s.disarm()
