"""Probes are detached when the monitor dies, even by SIGKILL: bcc attaches uprobes through perf
event fds (not the debugfs uprobe_events list), and the kernel frees them with the process.
Also: close() gives back every perf event fd and BPF program the probe created."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

import pytest

from tests._ebpf_jobs import ROOT, ebpf_skip_reason
from tests._host import libnccl as _libnccl

REASON = ebpf_skip_reason()
pytestmark = [pytest.mark.ebpf,
              pytest.mark.skipif(REASON is not None, reason=f"eBPF unavailable: {REASON}"),
              pytest.mark.skipif(_libnccl() is None, reason="nvidia-nccl-cu12 wheel not installed")]

UPROBE_EVENTS = "/sys/kernel/debug/tracing/uprobe_events"


def bpf_prog_ids() -> set[int]:
    """Every loaded BPF program id (bpf(BPF_PROG_GET_NEXT_ID) until ENOENT)."""
    libc = ctypes.CDLL(None, use_errno=True)
    attr = (ctypes.c_uint32 * 4)()
    ids, start = set(), 0
    while True:
        attr[0], attr[1] = start, 0
        if libc.syscall(321, 11, ctypes.byref(attr), ctypes.sizeof(attr)) != 0:  # __NR_bpf, PROG_GET_NEXT_ID
            return ids
        start = attr[1]
        ids.add(start)


def held_bpf_prog_ids(pid: int | str = "self") -> set[int]:
    """The BPF programs the process holds an fd of (its own: the other xdist worker's watch loads
    programs at the same time, so a before/after difference of :func:`bpf_prog_ids` is not ours)."""
    ids = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:bpf-prog":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                ids |= {int(line.split()[1]) for line in f if line.startswith("prog_id:")}
        except OSError:
            pass
    return ids


def gone(ids: set[int], seconds: float = 15.0) -> bool:
    """Whether the programs ``ids`` are unloaded within ``seconds`` (the kernel frees them deferred)."""
    deadline = time.monotonic() + seconds
    while ids & bpf_prog_ids() and time.monotonic() < deadline:
        time.sleep(0.2)
    return not ids & bpf_prog_ids()


def perf_event_fds(pid: int | str = "self") -> int:
    """How many perf event fds the process holds (one per attached uprobe / uretprobe)."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[perf_event]"
        except OSError:
            pass
    return n


def uprobe_events_naming(lib: str) -> list[str]:
    """Entries of the debugfs uprobe list that name the library (bcc names them after its path)."""
    name = os.path.basename(lib).replace(".", "_")
    return [line for line in open(UPROBE_EVENTS).read().splitlines() if name in line]


def _kill(p: subprocess.Popen) -> None:
    for fn in (os.killpg, os.kill):
        try:
            fn(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait(10)


def test_sigkill_of_monitor_detaches_everything() -> None:
    target = subprocess.Popen([sys.executable, str(ROOT / "tests" / "jobs" / "nccl_calls.py"), str(_libnccl())],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    monitor = None
    try:
        assert target.stdout is not None and target.stdout.readline().startswith("ready")
        monitor = subprocess.Popen([sys.executable, str(ROOT / "tests" / "jobs" / "probe_holder.py"), str(target.pid)],
                                   stdout=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True,
                                   env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert monitor.stdout is not None
        line = monitor.stdout.readline().split()
        assert line[0] == "attached" and int(line[1]) > 0, line
        ours = held_bpf_prog_ids(monitor.pid)
        assert ours, "the monitor loaded no BPF program"
        # fd-based: one perf event fd per uprobe in the monitor, no entry in the debugfs list
        assert perf_event_fds(monitor.pid) == int(line[1])
        assert uprobe_events_naming(str(_libnccl())) == []
        monitor.send_signal(signal.SIGKILL)
        monitor.wait(10)
        assert gone(ours), "BPF programs outlived the SIGKILLed monitor"
        assert uprobe_events_naming(str(_libnccl())) == []
    finally:
        if monitor is not None:
            _kill(monitor)
        _kill(target)


def test_a_normal_exit_beside_a_close_in_progress_prints_nothing_and_detaches_everything() -> None:
    """bcc registers its own cleanup at exit; a watch stopped while its probe thread was still
    attaching or closing (under load) ran it on fds already closed: "Failed to detach BPF from
    uprobe" tracebacks at the user (a CI failure of test_package). The probes own their cleanup:
    nothing runs at exit, and the kernel detaches what the exiting process still held."""
    target = subprocess.Popen([sys.executable, str(ROOT / "tests" / "jobs" / "nccl_calls.py"), str(_libnccl())],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    monitor = None
    try:
        assert target.stdout is not None and target.stdout.readline().startswith("ready")
        monitor = subprocess.Popen([sys.executable, str(ROOT / "tests" / "jobs" / "probe_holder.py"), str(target.pid),
                                    "exit"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                   start_new_session=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        out, err = monitor.communicate(timeout=120)
        assert out.split()[0] == "attached" and int(out.split()[1]) > 0, out
        assert (monitor.returncode, err) == (0, ""), err
        assert uprobe_events_naming(str(_libnccl())) == []
    finally:
        if monitor is not None:
            _kill(monitor)
        _kill(target)
