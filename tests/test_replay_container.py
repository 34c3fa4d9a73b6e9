"""Replay beside a rank in a container: another mount namespace, made here with ``unshare --mount
--pid --fork --mount-proc``, where (inside that namespace only) the venv is bind-mounted at
``/opt/<name>/env`` and the rank runs in ``/opt/<name>/work``: paths that do not exist on the host.
The worker must enter the rank's mount namespace and run the rank's interpreter there; when it
cannot (no CAP_SYS_ADMIN), one note says so and no worker runs with the host's paths.

The namespaces end with their last process (pid 1 of the PID namespace is killed by process group,
its mounts go with it); nothing is ever killed by name."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

from scout_sys.demo.launch import DemoJob
from scout_sys.model import Job, Rank
from scout_sys.replay import child, runner
from scout_sys.replay.context import Device, context_of, in_root, mount_ns, rank_path
from tests.conftest import REPO, _rank_pids, wait_for
from tests.test_replay_e2e import torch_save, workers_of

VENV = os.path.realpath(sys.prefix)  # the venv we run in: its bin/python is a link to the real binary
NEEDS_NS = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                              reason="a mount namespace needs root and unshare (util-linux)")


def _setup(name: str, binds: dict[str, str] | None = None, hide: tuple[str, ...] = ()) -> str:
    """The shell lines run inside the new namespaces before the rank: a tmpfs on /opt (the host's
    /opt is left alone: unshare makes every mount private), the venv at /opt/NAME/env, ``binds``
    (host folder -> path under /opt/NAME), then ``hide`` (host folders covered by an empty tmpfs, so
    that only the bind mounts show them), and the rank's folder /opt/NAME/work."""
    top = f"/opt/{name}"
    lines = ["set -e", "mount -t tmpfs scout-test /opt", f"mkdir -p {top}/env {top}/work",
             f"mount --bind {shlex.quote(VENV)} {top}/env"]
    for src, rel in (binds or {}).items():
        lines += [f"mkdir -p {top}/{rel}", f"mount --bind {shlex.quote(src)} {top}/{rel}"]
    lines += [f"mount -t tmpfs scout-hide {shlex.quote(h)}" for h in hide]
    lines += [f"cd {top}/work", 'exec "$@"']
    return "\n".join(lines)


def in_container(setup: str, *cmd: str) -> list[str]:
    return ["unshare", "--mount", "--pid", "--fork", "--mount-proc", "sh", "-c", setup, "sh", *cmd]


def _children(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(name))
            except (OSError, ValueError, IndexError):
                continue
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@contextlib.contextmanager
def sleeper(name: str, **kw):
    """A plain process (no torch) in its own mount and PID namespaces, started as
    ``/opt/NAME/env/bin/python`` from ``/opt/NAME/work``: yields its host pid."""
    code = "import sys, time; print('ready', flush=True); time.sleep(600)"
    p = subprocess.Popen(in_container(_setup(name, **kw), f"/opt/{name}/env/bin/python", "-c", code),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    inner = None
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line.strip() == "ready", (line, p.stderr.read() if p.poll() is not None else "")
        inner = wait_for(lambda: (_children(p.pid) or [None])[0], 10, "the namespace's first process")
        yield inner
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # unshare and pid 1 of the namespace: the rest dies with it
        p.wait(timeout=30)
        if inner is not None:
            wait_for(lambda: not _alive(inner), 30, "the namespaced process gone")


# --------------------------------------------------------------------------- paths, without a namespace


def test_in_root_resolves_links_inside_the_root(tmp_path):
    """An absolute link target is taken from the root given, not from ours; loops end."""
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "python3.11").write_text("")
    (tmp_path / "bin").mkdir()
    os.symlink("python3.11", tmp_path / "real" / "python3")  # relative
    os.symlink(str(tmp_path / "real" / "python3"), tmp_path / "bin" / "python")  # absolute
    os.symlink("loop", tmp_path / "loop")
    me = os.getpid()
    assert in_root(me, str(tmp_path / "bin" / "python")) == f"/proc/{me}/root{tmp_path}/real/python3.11"
    assert in_root(me, f"{tmp_path}/bin/../real/./python3") == f"/proc/{me}/root{tmp_path}/real/python3.11"
    assert in_root(me, "/") == f"/proc/{me}/root"
    assert not os.path.exists(in_root(me, str(tmp_path / "loop")))
    assert in_root(me, str(tmp_path / "missing" / "x")) == f"/proc/{me}/root{tmp_path}/missing/x"


def test_a_process_in_our_namespace_has_no_foreign_namespace():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        wait_for(lambda: os.readlink(f"/proc/{p.pid}/exe") == os.path.realpath(sys.executable), 30, "exec")
        ctx = context_of(p.pid)
        assert ctx.mntns is None and ctx.error is None and ctx.python == sys.executable
        assert rank_path(p.pid, __file__) == os.path.realpath(__file__)
    finally:
        p.kill()
        p.wait()


# --------------------------------------------------------------------------- a rank in another mount namespace


@NEEDS_NS
def test_context_of_a_rank_in_a_container_names_its_own_paths(tmp_path):
    name = f"scout-ns-{uuid.uuid4().hex[:8]}"
    assert not os.path.exists(f"/opt/{name}")
    with sleeper(name) as pid:
        ctx = context_of(pid)
        assert ctx.mntns == mount_ns(pid) != mount_ns("self")
        assert ctx.error is None, ctx.error
        assert ctx.python == f"/opt/{name}/env/bin/python"  # argv[0], checked inside the rank's root
        assert not os.path.exists(ctx.python)  # nowhere here: only in the rank's namespace
        assert ctx.cwd == f"/opt/{name}/work"
        # the venv's python -> python3.11 -> /root/.pyenv/...: resolved inside the rank's root
        assert os.path.samefile(in_root(pid, ctx.python), f"/proc/{pid}/exe")


@NEEDS_NS
def test_rank_path_finds_a_host_file_where_the_container_mounts_it(tmp_path):
    data, hidden = tmp_path / "data", tmp_path / "hidden"
    data.mkdir()
    hidden.mkdir()
    (data / "step_9.pt").write_text("x")
    (hidden / "step_9.pt").write_text("x")
    (tmp_path / "shared.pt").write_text("x")
    name = f"scout-ns-{uuid.uuid4().hex[:8]}"
    with sleeper(name, binds={str(data): "ckpt"}, hide=(str(data), str(hidden))) as pid:
        # docker -v DATA:/ckpt: the host's path is covered in there, its mount shows the file
        assert rank_path(pid, str(data / "step_9.pt")) == f"/opt/{name}/ckpt/step_9.pt"
        assert rank_path(pid, str(data)) == f"/opt/{name}/ckpt"
        assert rank_path(pid, str(hidden / "step_9.pt")) is None  # not mounted in the container
        assert rank_path(pid, str(tmp_path / "shared.pt")) == str(tmp_path / "shared.pt")  # the same path there
        # a path the user took from /proc/PID/root: the rank's own path
        assert rank_path(pid, f"/proc/{pid}/root/opt/{name}/env/pyvenv.cfg") == f"/opt/{name}/env/pyvenv.cfg"
        assert rank_path(pid, f"/proc/{pid}/root/opt/{name}/nothing") is None


@NEEDS_NS
def test_the_preexec_enters_the_rank_namespace_and_its_folder():
    """Popen's cwd is our "/", the preexec enters the namespace and then the rank's folder; the
    interpreter that only exists in there runs."""
    name = f"scout-ns-{uuid.uuid4().hex[:8]}"
    code = "import os, sys; print(os.getcwd(), os.path.exists('/opt/%s/env/pyvenv.cfg'), flush=True); sys.stdin.read()"
    with sleeper(name) as pid:
        ctx = context_of(pid)
        fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        try:
            p = subprocess.Popen([ctx.python, "-c", code % name], cwd="/", stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, start_new_session=True,
                                 preexec_fn=child.preexec(ctx, None, fd, None, "{}"))
        finally:
            os.close(fd)
        try:
            assert p.stdout is not None and p.stdout.readline().split() == [f"/opt/{name}/work", "True"]
            assert mount_ns(p.pid) == ctx.mntns  # the child lives in the rank's mount namespace
        finally:
            p.kill()
            p.wait()


class _NoSetns:
    """libc whose setns() fails as it does without CAP_SYS_ADMIN."""

    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.prctl = self.libc.prctl

    def setns(self, fd: int, flags: int) -> int:
        ctypes.set_errno(errno.EPERM)
        return -1


@NEEDS_NS
def test_a_worker_that_cannot_enter_the_namespace_fails_with_one_note(monkeypatch):
    monkeypatch.setattr(child, "_libc", _NoSetns)
    name = f"scout-ns-{uuid.uuid4().hex[:8]}"
    with sleeper(name) as pid:
        dev = Device("cpu/rank0", "cpu", "cpu", (0,), pid)
        job = Job(ranks=(Rank(rank=0, pid=pid, host="h"),), world_size=1, launcher="torchrun", launcher_pid=1,
                  host="h")
        ws = runner.WorkerSet(job, devices=[dev], size="small")
        try:
            ws.start(timeout=30)
            [w] = ws.workers
            assert w.proc is None
            assert w.error == (f"cannot enter the mount namespace of rank pid {pid}: Operation not permitted: "
                               "replay off for that device")
            [res] = ws.round(1)
            assert res.error == w.error and not res.kernels
        finally:
            ws.close()


def test_a_namespace_that_cannot_be_told_is_a_note_not_host_paths(monkeypatch):
    """No look at the rank's namespace (not ours to look at): no worker with our paths."""
    import scout_sys.replay.context as context

    def refused(pid: int) -> int:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(context, "foreign_mount_ns", refused)
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ctx = context_of(p.pid)
        assert ctx.error == (f"cannot tell the mount namespace of rank pid {p.pid}: Permission denied: "
                             "replay off for that device")
        ws = runner.WorkerSet(None, devices=[Device("cpu/rank0", "cpu", "cpu", (0,), p.pid)])  # type: ignore[arg-type]
        ws._spawn(ws.devices[0], 0, ctx)
        assert ws.workers[0].proc is None and ws.workers[0].error == ctx.error
        ws.close()
    finally:
        p.kill()
        p.wait()


# --------------------------------------------------------------------------- a real job, replayed from the host


def _scout(*args: str, prefix: tuple[str, ...] = (), timeout: float = 400) -> tuple[subprocess.Popen[str], float]:
    p = subprocess.Popen([*prefix, sys.executable, "-m", "scout_sys", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    return p, time.time() + timeout


@pytest.mark.slow
@NEEDS_NS
def test_replay_of_a_job_in_a_container_runs_its_workers_in_the_rank_namespace(tmp_path):
    name = f"scout-ns-{uuid.uuid4().hex[:8]}"
    env_dir = f"/opt/{name}/env"
    assert not os.path.exists(f"/opt/{name}")
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    torch_save(ckpts / "step_100.pt")
    job = DemoJob(2, python=f"{env_dir}/bin/python", env={"PYTHONPATH": REPO},
                  args=["--log-every", "1", "--step-time", "0.05"])
    # the checkpoint folder is mounted at /opt/NAME/ckpt in there and covered at its host path
    job.cmd = in_container(_setup(name, binds={str(ckpts): "ckpt"}, hide=(str(ckpts),)), *job.cmd)
    with job:
        job.wait_steps(2, timeout=240)
        ranks = _rank_pids(job)
        rank_ns = {mount_ns(p) for p in ranks}
        assert len(ranks) == 2 and len(rank_ns) == 1 and mount_ns("self") not in rank_ns

        args = ("replay", "--job", str(job.pid), "--rounds", "1", "--json", "--state-dir", str(tmp_path),
                "--size", "small", "--reps", "3", "--checkpoint", str(ckpts / "step_100.pt"))
        p, end = _scout(*args)
        seen: dict[int, tuple[int, str]] = {}
        while p.poll() is None and time.time() < end:
            for w in workers_of(job):
                try:
                    with open(f"/proc/{w}/cmdline", "rb") as f:
                        seen.setdefault(w, (mount_ns(w), f.read().split(b"\0")[0].decode()))
                except OSError:
                    continue
            time.sleep(0.1)
        out, err = p.communicate(timeout=max(1.0, end - time.time()))
        assert p.returncode == 0, (p.returncode, out, err)
        d = json.loads(out)
        assert d["incidents"] == [], d
        assert len(seen) == 2, seen
        assert {ns for ns, _ in seen.values()} == rank_ns  # the workers ran in the rank's mount namespace
        assert {argv0 for _, argv0 in seen.values()} == {f"{env_dir}/bin/python"}  # its interpreter, by its path
        [rnd] = d["replay"]["rounds"]
        assert len(rnd) == 2 and all("error" not in x for x in rnd), rnd
        assert all(x["context"]["python"] == f"{env_dir}/bin/python" for x in rnd)
        assert all("ckpt:w" in x["kernels"] for x in rnd)  # the checkpoint, found at /opt/NAME/ckpt in there
        assert workers_of(job) == []

        # without CAP_SYS_ADMIN no worker can enter: one note per device, no worker, never our paths
        p, end = _scout(*args, prefix=("setpriv", "--inh-caps=-sys_admin", "--bounding-set=-sys_admin", "--"))
        out, err = p.communicate(timeout=max(1.0, end - time.time()))
        assert p.returncode == 2 and "Traceback" not in err, (p.returncode, out, err)
        d = json.loads(out)
        for r in ranks:
            note = f"cannot enter the mount namespace of rank pid {r}: Operation not permitted: replay off for that device"
            assert sum(note in n for n in d["notes"]) == 1, d["notes"]
        assert workers_of(job) == []
        job.wait_steps(len(job.log().split("SCOUT-DEMO step ")) + 1, timeout=60)  # it goes on stepping
    assert job.pids() == []
