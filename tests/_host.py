"""What this host can do, checked by the tests themselves, never through the product's own
availability functions: a product regression that wrongly says "eBPF unavailable" must fail a test,
not turn it into a skip.

Each function returns why the capability is missing, or None. A skip for a capability that `make`
cannot provide (a cgroup controller the host did not mount) starts with ``HOST_PREFIX``; conftest's
hook lets only those through under `make test` (see tests/README.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import stat
import tempfile
from pathlib import Path

HOST_PREFIX = "host lacks "  # a skip that no `make` step could have prevented


def root_reason() -> str | None:
    return None if os.geteuid() == 0 else "not root (eBPF needs root)"


def ebpf_reason() -> str | None:
    """Root, BTF, the uprobe PMU, kernel headers for the running kernel, debugfs/tracefs, and the
    distro bcc module on the path: what scripts/setup-ebpf.sh sets up."""
    build = Path("/lib/modules") / os.uname().release / "build" / "include"
    missing = [what for what, ok in (
        ("root", os.geteuid() == 0),
        ("/sys/kernel/btf/vmlinux", Path("/sys/kernel/btf/vmlinux").exists()),
        ("the uprobe PMU /sys/bus/event_source/devices/uprobe", Path("/sys/bus/event_source/devices/uprobe/type").exists()),
        (f"kernel headers at {build.parent}", build.is_dir()),
        ("debugfs at /sys/kernel/debug/tracing", Path("/sys/kernel/debug/tracing/events").is_dir()),
        ("a `bcc` module", importlib.util.find_spec("bcc") is not None),
    ) if not ok]
    return f"eBPF prerequisites missing: {', '.join(missing)}" if missing else None


def libnccl() -> Path | None:
    """The real libnccl.so.2 of the nvidia-nccl-cu12 wheel (requirements-test.txt), or None."""
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except ModuleNotFoundError:  # no ``nvidia`` package at all (a venv without the test wheels)
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(list(spec.submodule_search_locations)[0]) / "lib" / "libnccl.so.2"
    return lib if lib.exists() else None


def cgroup_memory() -> tuple[str, str] | None:
    """(version, root) of a writable cgroup memory controller: ("2", "/sys/fs/cgroup") or
    ("1", "/sys/fs/cgroup/memory"); None when the host has none."""
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    if v2.exists() and "memory" in v2.read_text().split() and os.access("/sys/fs/cgroup", os.W_OK):
        return "2", "/sys/fs/cgroup"
    v1 = Path("/sys/fs/cgroup/memory")
    if (v1 / "memory.limit_in_bytes").exists() and os.access(v1, os.W_OK):
        return "1", str(v1)
    return None


@contextlib.contextmanager
def runnable_by_others(*paths: str):
    """Let other users reach ``paths`` (this interpreter, the venv, the checkout) for the length of
    a test: each ancestor directory that lacks the others' search bit (a 0700 home holding pyenv or
    the checkout) gets it, and gets its old mode back at exit. Nothing is made readable that was
    not: only traversal is granted, as `chmod o+x` would. One test at a time holds it (a lock file),
    so a parallel test never sees a mode restored under it."""
    changed: list[tuple[Path, int]] = []
    lock = open(os.path.join(tempfile.gettempdir(), "scout-sys-tests-others.lock"), "w")  # noqa: SIM115
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        for p in paths:
            for d in Path(os.path.realpath(p)).parents:
                mode = d.stat().st_mode
                if not mode & stat.S_IXOTH and all(d != c for c, _ in changed):
                    os.chmod(d, mode | stat.S_IXOTH)
                    changed.append((d, mode))
        yield
    finally:
        for d, mode in reversed(changed):
            os.chmod(d, stat.S_IMODE(mode))
        lock.close()
