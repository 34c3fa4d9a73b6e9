"""The systemd unit's sandbox (deploy/systemd/scout-sys-watch.service) leaves the monitor working.

systemd does not run units here (it is not PID 1), so the unit's own settings are applied by hand:
its ``CapabilityBoundingSet=`` (``setpriv --bounding-set``, no inheritable capabilities), its
``NoNewPrivileges=`` (``--no-new-privs``) and its file system (``unshare --mount``, a private mount
namespace: every mount but /dev, /proc and /sys read-only for ``ProtectSystem=strict``, /sys and
/proc/sys read-only but /sys/fs/cgroup for ``ProtectKernelTunables=``, a fresh /tmp and /var/tmp for
``PrivateTmp=``, and writable only the ``ReadWritePaths=`` plus the test's stand-ins for
``StateDirectory=`` / ``LogsDirectory=``). Inside it, the real ``scout-sys doctor`` and ``diagnose
--ebpf`` on a real job must find every eBPF probe and py-spy working, and a replay worker's child
set-up (setns into the rank's mount namespace, then the rank's user) must work and be stoppable. A
capability dropped from the unit that any of these needs fails a test here. What setpriv cannot
apply (``SystemCallFilter=``, ``RestrictNamespaces=``, ``DevicePolicy=``) is checked by reading the
unit. And the unit's offline security score, ``systemd-analyze security --offline=true``, stays below
5 (it was 9.6 before the sandbox)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests._ebpf_jobs import ebpf_skip_reason
from tests._host import HOST_PREFIX, runnable_by_others

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "deploy" / "systemd" / "scout-sys-watch.service"
MAX_EXPOSURE = 5.0


def unit_settings(text: str | None = None) -> dict[str, list[str]]:
    """``[Service]`` key -> every value it is given, in order (a key may repeat: DeviceAllow=)."""
    out: dict[str, list[str]] = {}
    section = None
    for raw in (UNIT.read_text() if text is None else text).splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        if section == "Service" and "=" in line:
            key, value = line.split("=", 1)
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def capabilities(settings: dict[str, list[str]]) -> list[str]:
    """The bounding set, merged over every ``CapabilityBoundingSet=`` line (systemd ORs them), as
    setpriv's names (``CAP_SYS_PTRACE`` -> ``sys_ptrace``)."""
    caps: list[str] = []
    for value in settings.get("CapabilityBoundingSet", []):
        assert not value.startswith("~"), "an allow list, not a deny list"
        caps += [c.removeprefix("CAP_").lower() for c in value.split() if c not in caps]
    return caps


def _yes(settings: dict[str, list[str]], key: str) -> bool:
    return settings.get(key, ["no"])[-1].lower() in ("yes", "true", "1", "on")


def sandbox(settings: dict[str, list[str]], writable: list[str], caps: list[str] | None = None) -> list[str]:
    """A command prefix that runs what follows it as the unit would run it (see the module's text).
    ``writable``: the folders standing in for StateDirectory= / LogsDirectory= (they must exist).
    ``caps``: another bounding set (default: the unit's)."""
    assert settings.get("ProtectSystem", [""])[-1] == "strict", "the sandbox below is ProtectSystem=strict's"
    rw = [p.lstrip("-") for v in settings.get("ReadWritePaths", []) for p in v.split()]
    rw = [p for p in rw if os.path.isdir(p)] + list(writable)
    caps = capabilities(settings) if caps is None else caps
    lines = ["set -e"]
    # every mount read-only but the API file systems (a mount already read-only is left as it is)
    lines.append("findmnt -rn -o TARGET,OPTIONS | while read -r t o; do case \"$t\" in /dev|/dev/*|/proc|/proc/*|/sys|/sys/*) "
                 "continue;; esac; case \",$o,\" in *,rw,*) mount -o remount,bind,ro \"$t\";; esac; done")
    if _yes(settings, "ProtectKernelTunables"):  # /sys and /proc/sys read-only; /sys/fs/cgroup stays writable
        lines.append("findmnt -rn -o TARGET | while read -r t; do case \"$t\" in /sys|/sys/kernel/*) "
                     "mount -o remount,bind,ro \"$t\";; esac; done")
        lines.append("mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys")
    # the checkout and its venv stand for the installed tree (/opt in a real unit): a clone under /tmp
    # would vanish under PrivateTmp's tmpfs, so it shows through it, read-only
    private = _yes(settings, "PrivateTmp")
    hidden = {p for p in (str(ROOT), sys.prefix) if p.startswith("/tmp/")} if private else set()
    keep = sorted(p for p in hidden if not any(p.startswith(q + "/") for q in hidden))  # the venv in the checkout: once
    binds = [(d, "rw") for d in rw] + [(d, "ro") for d in keep]
    if private:
        # the fresh /tmp is built aside (/dev/shm stays writable), what must show through it bound in by
        # path while the real one is still in view, then moved over /tmp (a bind made after the tmpfs
        # would resolve its source there: an empty folder)
        stage = "/dev/shm/scout-sandbox-tmp"
        lines += [f"mkdir -p {stage}", f"mount -t tmpfs -o mode=1777 tmpfs {stage}"]
        for d, mode in binds:
            if d.startswith("/tmp/"):
                q, dst = shlex.quote(d), shlex.quote(stage + d[len("/tmp"):])
                lines += [f"mkdir -p {dst}", f"mount --bind {q} {dst}", f"mount -o remount,bind,{mode} {dst}"]
        lines += [f"mount -n --move {stage} /tmp", "mount -t tmpfs -o mode=1777 tmpfs /var/tmp"]
        binds = [(d, m) for d, m in binds if not d.startswith("/tmp/")]
    for d, mode in binds:
        q = shlex.quote(d)
        lines += [f"mount --bind {q} {q}", f"mount -o remount,bind,{mode} {q}"]
    setpriv = ["setpriv", "--bounding-set", ",".join(["-all", *(f"+{c}" for c in caps)]), "--inh-caps", "-all"]
    if _yes(settings, "NoNewPrivileges"):
        setpriv.append("--no-new-privs")
    lines.append("exec " + " ".join(shlex.quote(a) for a in setpriv) + ' -- "$@"')
    return ["unshare", "--mount", "--propagation", "private", "bash", "-c", "\n".join(lines), "sandbox"]


def _run(cmd: list[str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env, cwd="/")


def _scout(prefix: list[str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return _run([*prefix, sys.executable, "-m", "scout_sys", *args], timeout=timeout)


def _tools_reason() -> str | None:
    missing = [t for t in ("unshare", "setpriv", "findmnt", "mount") if shutil.which(t) is None]
    return f"{HOST_PREFIX}{', '.join(missing)} (util-linux)" if missing else None


def _sandbox_reason() -> str | None:
    return ebpf_skip_reason() or _tools_reason()


# ---------------------------------------------------------------- the unit, read (no job, no root)

def _exposure(unit: Path) -> float:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip(f"{HOST_PREFIX}systemd-analyze (systemd)")
    out = subprocess.run([analyze, "security", "--offline=true", str(unit)], capture_output=True, text=True,
                         timeout=60, check=False)
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+) ", out.stdout + out.stderr)
    assert m, out.stdout[-2000:] + out.stderr
    return float(m.group(1))


def test_the_unit_scores_below_5_offline(tmp_path):
    assert _exposure(UNIT) < MAX_EXPOSURE
    # the check sees the sandbox: the same unit without it is the 9.6 it was
    bare = tmp_path / UNIT.name
    bare.write_text(UNIT.read_text().split("# ---- privileges")[0] + "\n[Install]\nWantedBy=multi-user.target\n")
    assert _exposure(bare) > 9


def test_what_setpriv_cannot_apply_is_what_the_monitor_needs():
    s = unit_settings()
    assert not s.get("AmbientCapabilities", [""])[-1], "root needs no ambient capabilities"
    assert s["ProtectSystem"] == ["strict"] and s["ProtectHome"] == ["read-only"]  # homes hold the ranks' venvs
    # what would stop a probe or replay: every /proc/PID, the kernel headers, the rank's cgroups
    for key in ("ProtectProc", "ProcSubset", "ProtectKernelModules", "ProtectControlGroups", "PrivateUsers",
                "PrivateNetwork", "PrivateDevices", "MemoryDenyWriteExecute", "User", "DynamicUser"):
        assert key not in s, f"{key}= breaks the monitor (the unit says why it is off)"
        assert re.search(rf"^# (?:\S+= )*{key}=", UNIT.read_text(), re.M), f"no comment on why {key}= is off"
    # system calls: the tracing ones on top of @system-service (which has setns, setuid, process_vm_readv)
    allowed = s["SystemCallFilter"][-1].split()
    assert not allowed[0].startswith("~") and "@system-service" in allowed
    for call in ("bpf", "perf_event_open", "ptrace", "process_vm_readv"):
        assert call in allowed, call
    if shutil.which("systemd-analyze"):
        for call, group in (("setns", "@process"), ("setuid", "@setuid"), ("setgroups", "@setuid"),
                            ("process_vm_readv", "@ipc"), ("sched_setaffinity", "@resources"),
                            ("setpriority", "@resources"), ("kill", "@process")):
            out = subprocess.run(["systemd-analyze", "syscall-filter", group], capture_output=True, text=True,
                                 timeout=30, check=False)
            assert re.search(rf"^\s+{call}$", out.stdout, re.M), (call, group)
            assert group in allowed or group in _system_service(), (call, group)
    assert "mnt" in s["RestrictNamespaces"][-1].split()  # replay's setns(CLONE_NEWNS)
    assert set(s["RestrictAddressFamilies"][-1].split()) == {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}
    assert s["DevicePolicy"] == ["closed"]
    assert {v.split()[0] for v in s["DeviceAllow"]} >= {"char-nvidiactl", "char-nvidia-frontend", "char-nvidia-uvm"}
    assert s["EnvironmentFile"] == ["-/etc/default/scout-sys"]  # the Slurm scripts' file, optional
    assert "$SCOUT_SYS_ARGS" in s["ExecStart"][-1].split()  # their variable, split into options
    assert s["ExecReload"] == ["/bin/kill -HUP $MAINPID"]  # the watch reopens --events on SIGHUP


def _system_service() -> set[str]:
    out = subprocess.run(["systemd-analyze", "syscall-filter", "@system-service"], capture_output=True,
                         text=True, timeout=30, check=False)
    return {w.strip() for w in out.stdout.split() if w.startswith("@")}


# ---------------------------------------------------------------- the monitor, run inside (root, eBPF)

@pytest.mark.ebpf
@pytest.mark.skipif(_sandbox_reason() is not None, reason=f"{_sandbox_reason()}")
def test_doctor_finds_everything_inside_the_sandbox(tmp_path):
    s = unit_settings()
    prefix = sandbox(s, [str(tmp_path)])
    # the sandbox is real: read-only but the stand-in of the state folder, the unit's capabilities only
    probe = _run([*prefix, "sh", "-c", f"touch {tmp_path}/w && echo rw; touch /etc/scout-sys-probe 2>/dev/null "
                  "|| echo ro; grep ^CapBnd /proc/self/status; grep ^NoNewPrivs /proc/self/status"])
    assert probe.returncode == 0, probe.stderr
    bnd = int(re.search(r"CapBnd:\s+([0-9a-f]+)", probe.stdout).group(1), 16)
    assert probe.stdout.split()[:2] == ["rw", "ro"] and bnd and bnd != (1 << 41) - 1, probe.stdout
    assert ("NoNewPrivs:\t1" in probe.stdout) == _yes(s, "NoNewPrivileges"), probe.stdout
    out = _scout(prefix, "doctor")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = {line.split()[1]: line for line in out.stdout.splitlines() if line.split()[:1] in (["OK"], ["MISSING"], ["OFF"])}
    for name in ("privileges", "pid", "btf", "kernel", "debugfs/tracefs", "uprobes", "bcc", "py-spy", "ptrace"):
        assert lines[name].startswith("OK"), out.stdout
    assert "everything needed is usable." in out.stdout


def _as_nobody(tmp: Path) -> str:
    """A python that runs as nobody: the job's ranks are another user's, as on a cluster."""
    tmp.mkdir(exist_ok=True)
    w = tmp / "python-as-nobody"
    w.write_text(f"#!/bin/sh\nexec setpriv --reuid=nobody --regid=nogroup --clear-groups -- {sys.executable} \"$@\"\n")
    w.chmod(0o755)
    tmp.chmod(0o755)
    return str(w)


# a replay worker's child set-up (replay/child.py) for a rank, as runner.WorkerSet._spawn calls it, on
# a `sleep` in place of the worker; then the stop of WorkerSet.close (killpg of a process of another user)
_REPLAY_CHILD = r"""
import json, os, signal, subprocess, sys
from scout_sys.replay.child import preexec
from scout_sys.replay.context import Context, foreign_mount_ns
pid = int(sys.argv[1])
st = os.stat(f"/proc/{pid}")
ns = foreign_mount_ns(pid)  # the service's namespace is not the rank's: the worker must enter it
ctx = Context(python="sleep", env={}, cwd="/", cpus=frozenset(os.sched_getaffinity(0)), nice=10, cgroup_procs=(),
              torch_site=None, uid=st.st_uid, gid=st.st_gid, mntns=ns)
fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
rd, wr = os.pipe2(os.O_CLOEXEC)
try:
    p = subprocess.Popen(["sleep", "60"], cwd="/", start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         preexec_fn=preexec(ctx, None, fd, wr, "cannot enter: {}"))
except (OSError, subprocess.SubprocessError) as e:
    os.close(wr)
    print(json.dumps({"error": os.read(rd, 4000).decode() or str(e)}))
    sys.exit(0)
print(json.dumps({"pid": p.pid}), flush=True)
got = {"ns": os.stat(f"/proc/{p.pid}/ns/mnt").st_ino == ns, "uid": os.stat(f"/proc/{p.pid}").st_uid}
try:
    os.killpg(p.pid, signal.SIGKILL)
    got["killed"] = p.wait(timeout=30) == -signal.SIGKILL
except OSError as e:
    got["killed"] = e.strerror
print(json.dumps(got))
"""


@pytest.mark.ebpf
@pytest.mark.slow
@pytest.mark.skipif(_sandbox_reason() is not None, reason=f"{_sandbox_reason()}")
def test_probes_attach_and_replay_workers_start_inside_the_sandbox(start_job, tmp_path):
    """diagnose --ebpf on a real job of another user (nobody), from inside the sandbox: every rank's
    stack (py-spy), both eBPF probes on; and a replay worker's set-up enters the rank's namespace as
    its user and is stopped. Taking CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH or CAP_SYS_ADMIN out of the
    unit fails the first part, CAP_SYS_CHROOT, CAP_SETUID, CAP_SETGID or CAP_KILL the second."""
    s = unit_settings()
    state = tmp_path / "state"
    state.mkdir()
    prefix = sandbox(s, [str(state)])
    python = _as_nobody(tmp_path / "bin")
    with runnable_by_others(sys.executable, str(ROOT), python):
        job = start_job(2, python=python, env={"HOME": "/tmp", "PYTHONPATH": str(ROOT)},
                        cwd="/tmp")
        job.wait_steps(2, timeout=180)
        out = _scout(prefix, "diagnose", "--job", str(job.pid), "--window", "2.5", "--ebpf", "--json")
        assert out.stdout.strip(), out.stderr
        d = json.loads(out.stdout)
        ranks = d["job"]["ranks"]
        assert len(ranks) == 2 and all(r["where"] and r["state"] != "unknown" for r in ranks), (ranks, out.stderr)
        assert (d["probes"]["stack"], d["probes"]["ebpf-collectives"], d["probes"]["ebpf-sched"]) == ("on", "on", "on"), \
            (d["probes"], out.stderr)
        assert out.returncode == 0 and d["status"] == "healthy", d
        rank = ranks[0]["pid"]
        assert os.stat(f"/proc/{rank}").st_uid != 0
        got = _run([*prefix, sys.executable, "-c", _REPLAY_CHILD, str(rank)], timeout=60)
    lines = [json.loads(x) for x in got.stdout.splitlines() if x.startswith("{")]
    try:
        assert got.returncode == 0 and lines and "error" not in lines[0], (lines, got.stderr)
        assert lines[-1] == {"ns": True, "uid": os.stat(f"/proc/{rank}").st_uid, "killed": True}, (lines, got.stderr)
    finally:
        _stop_leftover(lines)


def _stop_leftover(lines: list[dict]) -> None:
    """A `sleep` the sandbox started but could not stop: this test (every capability) stops it, by pid,
    once sure the pid is still that sleep."""
    if not lines or lines[-1].get("killed") is True:
        return
    pid = next((x["pid"] for x in lines if "pid" in x), None)
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if f.read() == b"sleep\x0060\x00":
                os.kill(pid, signal.SIGKILL)
    except (OSError, TypeError):
        pass
