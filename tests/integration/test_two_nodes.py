"""A run over two nodes, simulated on one machine: two torchrun launchers (``--nnodes 2 --node_rank 0/1``, one
process each, a static rendezvous at 127.0.0.1) train what one launcher of two processes trains, row for row;
killing one node's launcher mid-run stops both at one step with a checkpoint, and the two launchers given
``--resume`` continue it to the same rows; exactly one process writes each file of the run folder, and each data
cache folder is built by one process, whether the nodes share it or each has its own.

Who writes what is seen through Python's audit hooks (``sitecustomize`` on the children's path logs every open for
writing, rename and mkdir under the watched folders, with the process id), so the test needs no strace.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.procs import run_tree
from tests.train_utils import ROOT

pytestmark = pytest.mark.slow

KEYS = ("kind", "step", "phase", "phase_name", "tokens", "flops", "loss", "lr", "val_loss", "grad_norm")
RUN = ["--config", str(ROOT / "configs" / "tiny_test.yaml"), "--method.name", "vcycle", "--train.steps", "30",
       "--train.checkpoint_every", "5", "--train.progress", "false", "--train.plots", "false", "--name", "two"]

_AUDIT = textwrap.dedent("""
    import os, sys
    _roots = tuple(os.environ["GROWTRAIN_AUDIT_ROOTS"].split(os.pathsep))
    _log = os.environ["GROWTRAIN_AUDIT_LOG"]

    _busy = []

    def _note(kind, path):
        path = os.path.abspath(os.fsdecode(path))
        if path.startswith(_roots) and not _busy:
            _busy.append(1)  # the log's own open is an event too
            with open(_log + f".{os.getpid()}", "a") as f:
                f.write(f"{kind}\\t{os.environ.get('RANK', '-')}\\t{path}\\n")
            _busy.clear()

    def _hook(event, args):
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            mode, flags = args[1], args[2]
            if (mode and any(c in mode for c in "wax+")) or (flags and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)):
                _note("write", args[0])
        elif event == "os.rename":
            _note("rename", args[1])
        elif event == "os.mkdir":
            _note("mkdir", args[0])

    sys.addaudithook(_hook)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp: Path, roots: list[Path], log: str = "audit") -> dict[str, str]:
    hook = tmp / "audit"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(_AUDIT)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # as a cluster shell: unset
    return {**env, "PYTHONPATH": os.pathsep.join([str(hook), str(ROOT)]),
            "GROWTRAIN_AUDIT_LOG": str(tmp / f"{log}.log"),
            "GROWTRAIN_AUDIT_ROOTS": os.pathsep.join(str(r.resolve()) for r in roots)}


def _node(rank: int, port: int, out: Path, cache: Path, env: dict[str, str], *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(rank),
           "--nproc_per_node", "1", "--rdzv-endpoint", f"127.0.0.1:{port}", str(ROOT / "train.py"), *RUN,
           "--output_dir", str(out), "--data.cache_dir", str(cache), *extra]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _both(a: subprocess.Popen, b: subprocess.Popen, timeout: float = 600) -> tuple[tuple[int, str], ...]:
    out, end = [], time.monotonic() + timeout
    try:
        for p in (a, b):
            _, err = p.communicate(timeout=max(1.0, end - time.monotonic()))
            out.append((p.returncode, err))
    finally:
        for q in (a, b):  # a launcher that hangs, or a worker it left behind, never outlives the test
            try:
                os.killpg(q.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    return tuple(out)


def _rows(run: Path) -> list[tuple]:
    return [tuple(json.loads(line).get(k) for k in KEYS) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _writers(tmp: Path, root: Path, log: str = "audit") -> dict[str, set[tuple[int, str]]]:
    """Each path under ``root`` that a launch (its ``log``) wrote, renamed onto or made, with the processes that did
    it, as (pid, RANK) (a temporary sibling's own name, ``.NAME.<random>.tmp``, is its writer's alone, and the cache's
    lock files are every process's: both left out)."""
    out: dict[str, set[tuple[int, str]]] = collections.defaultdict(set)
    root = str(root.resolve())
    for path in tmp.glob(f"{log}.log.*"):
        pid = int(path.suffix[1:])
        for line in path.read_text().splitlines():
            _, rank, name = line.split("\t")
            parts = Path(name).parts  # (every process opens a cache entry's lock file: that is how they take turns)
            if name.startswith(root + os.sep) and not any(p.endswith(".tmp") or p == ".locks" for p in parts):
                out[name].add((pid, rank))
    return out


def _one_writer_each(writers: dict[str, set[tuple[int, str]]]) -> set[tuple[int, str]]:
    """The processes that wrote, asserting that each path had one."""
    many = {p: w for p, w in writers.items() if len(w) > 1}
    assert not many, f"written by several processes: {many}"
    return set().union(*writers.values()) if writers else set()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One node, two processes: the rows two nodes must give."""
    tmp = tmp_path_factory.mktemp("one-node")
    proc = run_tree([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                     str(ROOT / "train.py"), *RUN, "--output_dir", str(tmp / "out"), "--data.cache_dir",
                     str(tmp / "cache")], timeout=600, cwd=ROOT, env=_env(tmp, [tmp]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _rows(tmp / "out" / "two")


def test_two_nodes_sharing_a_folder_and_cache_resume_after_one_launcher_is_killed_to_the_one_node_rows(
        tmp_path, reference):
    out, cache = tmp_path / "out", tmp_path / "cache"
    env, port = _env(tmp_path, [out, cache]), _free_port()
    a, b = _node(0, port, out, cache, env), _node(1, port, out, cache, env)
    deadline = time.monotonic() + 300
    while len(list((out / "two" / "checkpoints").glob("step*"))) < 2 and time.monotonic() < deadline:
        assert a.poll() is None and b.poll() is None, "a node ended before the kill"
        time.sleep(0.2)
    os.kill(b.pid, signal.SIGTERM)  # node 1's launcher, as a scheduler preempting that node
    (ra, ea), (rb, eb) = _both(a, b)
    assert ra != 0 and rb != 0  # torchrun reports its workers' exit 75 as a failure
    assert "stopped by a signal on another process after step" in ea, ea[-3000:]
    stopped = len(_rows(out / "two"))
    assert 0 < stopped < len(reference)

    port, env = _free_port(), _env(tmp_path, [out, cache], log="resume")
    (ra, ea), (rb, eb) = _both(_node(0, port, out, cache, env, "--resume"), _node(1, port, out, cache, env, "--resume"))
    assert ra == 0 and rb == 0, ea[-3000:] + eb[-3000:]
    assert "resuming two from step" in ea
    assert _rows(out / "two") == reference

    for launch in ("audit", "resume"):  # each launch: one writer of each file of the run folder, rank 0 (node 0's)
        assert {rank for _, rank in _one_writer_each(_writers(tmp_path, out, launch))} == {"0"}
    _one_writer_each(_writers(tmp_path, cache))  # each entry built once, by whichever rank took its lock first
    built = [p for p in _writers(tmp_path, cache, "resume") if Path(p).name != "file_digests.json"]
    assert not built  # the resume builds nothing (it may refresh rank 0's memo of the sources' digests)


def test_two_nodes_with_a_cache_folder_each_build_each_once_and_train_the_one_node_rows(tmp_path, reference):
    out, c0, c1 = tmp_path / "out", tmp_path / "cache0", tmp_path / "cache1"
    env, port = _env(tmp_path, [out, c0, c1]), _free_port()
    (ra, ea), (rb, eb) = _both(_node(0, port, out, c0, env), _node(1, port, out, c1, env))
    assert ra == 0 and rb == 0, ea[-3000:] + eb[-3000:]
    assert _rows(out / "two") == reference  # train.threads holds on a node of one process (Accelerate sets its own)
    w0, w1 = _one_writer_each(_writers(tmp_path, c0)), _one_writer_each(_writers(tmp_path, c1))
    assert {r for _, r in w0} == {"0"} and {r for _, r in w1} == {"1"}  # each folder built once, by its node
    assert {r for _, r in _one_writer_each(_writers(tmp_path, out))} == {"0"}
    assert (c0 / "blocks").is_dir() and (c1 / "blocks").is_dir()
