"""``scout-sys doctor``: is every prerequisite here, and how to fix the ones that are not.

One line per check: ``OK``, ``MISSING`` (needed: exit status 1) or ``OFF`` (optional: a signal is
off, exit status unaffected), then what was found or the fix. Reads only; changes nothing.
"""

from __future__ import annotations

import ctypes.util
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from scout_sys.probes.ebpf import _common, distro


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str  # what was found, or the fix
    needed: bool = True

    def line(self) -> str:
        word = "OK" if self.ok else ("MISSING" if self.needed else "OFF")
        return f"{word:<8} {self.name:<16} {self.detail}"


def check_privilege() -> Check:
    reason = _common.privilege_reason()
    if reason is None:
        who = "root" if os.geteuid() == 0 else "CAP_BPF+CAP_PERFMON"
        return Check("privileges", True, f"{who}: may load BPF programs and trace other processes")
    if os.geteuid() != 0:  # the usual case: one line that says what to run
        return Check("privileges", False, f"{_common.EBPF_NEEDS_ROOT}; this is uid {os.geteuid()}: run "
                     "`sudo scout-sys doctor`, and diagnose / watch with sudo too (without root: docs/operations.md)")
    return Check("privileges", False, reason)


def check_pid_namespace() -> Check:
    reason = _common.pidns_reason()
    if reason is None:
        return Check("pid namespace", True, "the host's: /proc's pids are the kernel's that eBPF sees")
    return Check("pid namespace", False, reason)


def check_btf() -> Check:
    p = Path("/sys/kernel/btf/vmlinux")
    if p.exists():
        return Check("btf", True, str(p))
    return Check("btf", False, f"no {p}: exit codes come from exit_group() only; use a kernel with "
                 "CONFIG_DEBUG_INFO_BTF=y", needed=False)


def check_headers() -> Check:
    reason = _common.headers_reason()
    build = Path("/lib/modules") / os.uname().release / "build"
    if reason is None:
        return Check("kernel headers", True, f"{build} -> {os.path.realpath(build)}")
    return Check("kernel headers", False, f"{reason.split(';')[0]}; {distro.setup_hint()}")


def check_tracefs() -> Check:
    reason = _common.debugfs_reason()
    if reason is None:
        return Check("debugfs/tracefs", True, str(_common.DEBUGFS_EVENTS.parent))
    if _common.EBPF_NEEDS_ROOT in reason:  # mounted, only not readable as this user: privileges above says why
        return Check("debugfs/tracefs", False, f"{_common.DEBUGFS_EVENTS.parent} mounted, readable by root only "
                     "(mode 0700): see privileges")
    return Check("debugfs/tracefs", False, "not mounted: mount -t debugfs debugfs /sys/kernel/debug"
                 + ("; " + distro.setup_hint() if distro.source_checkout() else ""))


def check_uprobes() -> Check:
    reason = _common.attach_mode_reason()
    if reason is None:
        return Check("uprobes", True, "perf uprobe PMU (fd-based: detached when the monitor exits)")
    return Check("uprobes", False, reason + "; use a kernel with CONFIG_UPROBE_EVENTS=y")


def check_bcc() -> Check:
    bcc, reason = _common.load_bcc()
    if bcc is not None:
        how = "imported from the system's dist-packages" if _common.BCC_FROM_SYSTEM else "on this Python's path"
        return Check("bcc", True, f"{Path(bcc.__file__).parent} (distro bcc, {how})")
    return Check("bcc", False, reason or "bcc not importable")


def check_pyspy() -> Check:
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if os.access(exe, os.X_OK):
        return Check("py-spy", True, exe)
    return Check("py-spy", False, "not found: pip install py-spy" + (" (make)" if distro.source_checkout() else ""))


def check_ptrace() -> Check:
    p = Path("/proc/sys/kernel/yama/ptrace_scope")
    try:
        scope = int(p.read_text().strip())
    except (OSError, ValueError):
        return Check("ptrace", True, "no Yama LSM: ptrace limited by ownership only")
    if scope == 0 or (scope in (1, 2) and os.geteuid() == 0):
        return Check("ptrace", True, f"{p} = {scope}")
    if scope == 3:
        return Check("ptrace", False, f"{p} = 3: ptrace disabled until reboot; stacks unavailable")
    return Check("ptrace", False, f"{p} = {scope}: run as root, or echo 0 > {p}")


def check_nvml() -> Check:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return Check("nvml", False, "pynvml missing: pip install nvidia-ml-py; GPU signals off", needed=False)
    if ctypes.util.find_library("nvidia-ml") is None and not Path("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").exists():
        return Check("nvml", False, "not present (no NVIDIA driver) — GPU signals off", needed=False)
    try:
        pynvml.nvmlInit()
        try:
            n = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # NVMLError subclasses: driver missing, version mismatch, ...
        return Check("nvml", False, f"not usable ({e}) — GPU signals off", needed=False)
    return Check("nvml", True, f"{n} GPU(s)")


def check_nccl() -> Check:
    """The NCCL library the communicator probe (ebpf-comms) attaches to, beside this Python; a job's
    own installation is looked for when ``watch`` starts with it."""
    import glob
    import site

    from scout_sys.probes.ebpf._elf import function_symbols
    from scout_sys.probes.ebpf.comms import FUNCS, LIB_GLOBS

    for d in site.getsitepackages():
        for pattern in LIB_GLOBS:
            for path in sorted(glob.glob(os.path.join(d, pattern))):
                if function_symbols(path, "|".join(FUNCS).encode()):
                    return Check("nccl groups", True, f"{path}: communicator creation probed when watch "
                                 "starts with the job", needed=False)
    return Check("nccl groups", False, f"no libnccl with ncclCommInitRank beside this Python ({sys.prefix}); a "
                 "job's own is looked for when watch starts — else NCCL groups need --topology", needed=False)


CHECKS: tuple[Callable[[], Check], ...] = (
    check_privilege, check_pid_namespace, check_btf, check_headers, check_tracefs, check_uprobes, check_bcc, check_pyspy,
    check_ptrace, check_nvml, check_nccl,
)


def checks() -> list[Check]:
    out = []
    for fn in CHECKS:
        try:
            out.append(fn())
        except Exception as e:  # a check that breaks is a finding, not a crash
            out.append(Check(fn.__name__.removeprefix("check_"), False, f"check failed: {e}"))
    return out


def run(out: TextIO = sys.stdout) -> int:
    """Print one line per prerequisite; 0 when everything needed is usable, else 1."""
    results = checks()
    for c in results:
        print(c.line(), file=out)
    bad = [c for c in results if c.needed and not c.ok]
    if bad:
        print(f"{len(bad)} prerequisite(s) missing: eBPF probes off ({', '.join(c.name for c in bad)}); "
              "diagnose still works from /proc and stacks.", file=out)
        return 1
    print("everything needed is usable.", file=out)
    return 0
