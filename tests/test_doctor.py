"""scout-sys doctor: one line per prerequisite, the fix for the missing ones, exit 0 when usable."""

from __future__ import annotations

import ctypes
import io
import os
import subprocess
import sys

import pytest

from scout_sys import doctor
from tests._ebpf_jobs import ROOT, ebpf_skip_reason

NAMES = ["privileges", "pid namespace", "btf", "kernel headers", "debugfs/tracefs", "uprobes", "bcc", "py-spy", "ptrace", "nvml",
         "nccl groups"]


def test_one_line_per_check() -> None:
    out = io.StringIO()
    rc = doctor.run(out)
    lines = out.getvalue().splitlines()
    assert len(lines) == len(NAMES) + 1
    for line, name in zip(lines[:-1], NAMES):
        word, rest = line.split(None, 1)
        assert word in ("OK", "MISSING", "OFF") and rest.startswith(name), line
    bad = [c for c in doctor.checks() if c.needed and not c.ok]
    assert rc == (1 if bad else 0)
    for c in bad:  # every missing prerequisite says what to do
        assert any(w in c.detail for w in ("run", "mount", "install", "use a kernel", "echo", "pip")), c


@pytest.mark.ebpf
@pytest.mark.skipif(ebpf_skip_reason() is not None, reason=f"{ebpf_skip_reason()}")
def test_usable_here_after_setup() -> None:
    """On a machine after `make` as root (CI): everything needed is usable, exit 0."""
    assert doctor.run(io.StringIO()) == 0


def _drop_all_capabilities() -> None:
    """In the child before exec: empty the bounding set, so even uid 0 execs with no capability."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(64):
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP; EINVAL past the last capability


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop capabilities in a child")
def test_unprivileged_gets_the_fix() -> None:
    code = "import sys; from scout_sys import doctor; sys.exit(doctor.run())"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                       preexec_fn=_drop_all_capabilities)
    assert p.returncode == 1, p.stdout + p.stderr
    line = next(x for x in p.stdout.splitlines() if "privileges" in x)
    assert line.startswith("MISSING") and "sudo" in line


def test_nvml_absent_is_not_a_failure() -> None:
    c = doctor.check_nvml()
    if not c.ok:
        assert not c.needed and "GPU signals off" in c.detail


@pytest.mark.skipif(os.geteuid() != 0, reason="a PID namespace of one's own needs root (unshare --pid)")
def test_a_monitor_in_a_pid_namespace_of_its_own_attaches_no_probe() -> None:
    # nsenter into a node's namespace, or a container without --pid=host: /proc's pids are the
    # namespace's, the probes' the kernel's; no record would ever match a rank
    from scout_sys.probes.ebpf._common import pidns_reason

    assert pidns_reason() is None  # the host's own namespace (as CI and the tests run)
    code = "from scout_sys.probes.ebpf._common import common_reason; print(common_reason())"
    out = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert "PID namespace of its own" in out.stdout and "--pid=host" in out.stdout, out.stdout
    # and doctor says so on its own line, as a missing prerequisite of the eBPF probes
    out = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "scout_sys", "doctor"],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    line = next(x for x in out.stdout.splitlines() if "pid namespace" in x)
    assert out.returncode == 1 and line.startswith("MISSING") and "--pid=host" in line, out.stdout
    here = io.StringIO()
    doctor.run(here)
    assert "OK       pid namespace" in here.getvalue(), here.getvalue()  # the host's own namespace
