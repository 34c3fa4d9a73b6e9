"""What the eBPF probes share: prerequisites, program text, clocks, and reading a rank's /proc.

bcc is imported lazily (``load_bcc``): a monitor without it still runs every other probe.
Everything that can fail because a process vanished substitutes a value instead of raising.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from scout_sys.probes.ebpf.distro import find_system_bcc, import_package, setup_hint

HERE = Path(__file__).resolve().parent
DEBUGFS_EVENTS = Path("/sys/kernel/debug/tracing/events")
UPROBE_PMU = Path("/sys/bus/event_source/devices/uprobe/type")

CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39


def effective_caps(pid: int | str = "self") -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def privilege_reason() -> str | None:
    """None when this process may load BPF programs and open perf events."""
    caps = effective_caps()
    if caps & (1 << CAP_SYS_ADMIN) or (caps & (1 << CAP_BPF) and caps & (1 << CAP_PERFMON)):
        return None
    return "needs root or CAP_BPF+CAP_PERFMON: sudo scout-sys ..."


PROC_PID_INIT_INO = 0xEFFFFFFC  # the kernel's initial PID namespace (include/linux/proc_ns.h)


def pidns_reason(ns_link: str = "/proc/self/ns/pid") -> str | None:
    """None when this process sees the kernel's own pids. In a PID namespace of its own (a container
    without --pid=host, nsenter into a node's namespace) /proc numbers the ranks as that namespace does
    while the probes see the kernel's pids: no record would ever match a rank, so none is attached."""
    try:
        ino = os.stat(ns_link).st_ino
    except OSError:
        return None
    if ino == PROC_PID_INIT_INO:
        return None
    return ("the monitor runs in a PID namespace of its own, where /proc's pids are not the kernel's that eBPF "
            "sees: run it in the host's PID namespace (--pid=host, hostPID: true)")


def headers_reason() -> str | None:
    build = Path("/lib/modules") / os.uname().release / "build"
    if (build / "include").is_dir():
        return None
    return f"no kernel headers at {build} (bcc compiles against them); {setup_hint()}"


EBPF_NEEDS_ROOT = "eBPF needs root (or CAP_BPF+CAP_PERFMON)"


def debugfs_reason() -> str | None:
    try:
        if DEBUGFS_EVENTS.is_dir():
            return None
    except PermissionError:  # mounted, but root's (mode 0700): not a missing mount, a missing privilege
        return f"{DEBUGFS_EVENTS.parent} is root's (mode 0700): {EBPF_NEEDS_ROOT}: sudo scout-sys ..."
    return f"debugfs/tracefs not mounted at /sys/kernel/debug; {setup_hint()}"


_BCC: ModuleType | None = None
_BCC_ERROR: str | None = None
BCC_FROM_SYSTEM = False  # True: not on this Python's path, imported from the system's dist-packages


def _import_bcc() -> ModuleType:
    """``bcc`` as this environment imports it, else the distro's (only its package: distro.py)."""
    try:
        import bcc  # type: ignore[import-not-found]

        return bcc
    except ModuleNotFoundError as e:
        if e.name != "bcc":
            raise
        pkg = find_system_bcc()
        if pkg is None:
            raise ModuleNotFoundError("no bcc module here or in the system's dist-packages", name="bcc") from None
        global BCC_FROM_SYSTEM
        module = import_package(pkg)
        BCC_FROM_SYSTEM = True
        return module


def load_bcc() -> tuple[ModuleType | None, str | None]:
    """The distro ``bcc`` module, or why it cannot be imported. Imported once."""
    global _BCC, _BCC_ERROR
    if _BCC is None and _BCC_ERROR is None:
        try:
            bcc = _import_bcc()
            if not hasattr(bcc, "BPF"):
                _BCC_ERROR = f"the `bcc` module at {bcc.__file__} is not BCC (pip uninstall bcc); {setup_hint()}"
            else:
                _BCC = bcc
        except Exception as e:  # ImportError, or libbcc.so missing (OSError)
            _BCC_ERROR = f"bcc not importable ({type(e).__name__}: {e}); {setup_hint()}"
    return _BCC, _BCC_ERROR


# One compile at a time in this process: bcc's compiler (clang/LLVM in libbcc) is not safe to run from
# two threads at once — it crashed the monitor (SIGSEGV) when two jobs' watches (watch --every-job), or a
# watch's early NCCL probe and its collective probe, compiled together.
_COMPILE = threading.Lock()


def compile_program(bcc: ModuleType, text: str) -> Any:
    """``bcc.BPF(text=...)``, one at a time (:data:`_COMPILE`), owned by us (:func:`owned`), and the
    compiler's heap handed back afterwards (:func:`release_compile_heap`)."""
    with _COMPILE:
        bpf = owned(bcc.BPF(text=text.encode()))
        release_compile_heap()
    return bpf


def release_compile_heap() -> None:
    """Hand the heap clang/LLVM took to compile a program back to the kernel (glibc's ``malloc_trim``):
    about 30 MB of RSS a program (measured: RssAnon 52 -> 22 MB after one small program) that glibc would
    otherwise keep for the watch's whole life. Nothing where the C library has no such call (musl)."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def common_reason() -> str | None:
    """Why no eBPF probe can run here, or None."""
    for check in (privilege_reason, pidns_reason, headers_reason, debugfs_reason):
        reason = check()
        if reason:
            return reason
    return load_bcc()[1]


COMMON_HEADER = "scout_common.bpf.h"


def render(template: str, subs: Mapping[str, Any]) -> str:
    """Read ``template`` beside this file, paste in the shared header where it is included, and
    replace each whole-word token of ``subs``."""
    text = (HERE / template).read_text()
    text = text.replace(f'#include "{COMMON_HEADER}"', (HERE / COMMON_HEADER).read_text())
    for token, value in subs.items():
        text = re.sub(rf"\b{re.escape(token)}\b", str(value), text)
    return text


class Clock:
    """Converts bpf_ktime_get_ns() (CLOCK_MONOTONIC) to unix time."""

    def __init__(self) -> None:
        self.offset = time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)

    def unix(self, ns: int) -> float | None:
        return ns / 1e9 + self.offset if ns else None


def host_pid(pid: int) -> int:
    """The pid as the kernel (and BPF's bpf_get_current_pid_tgid) sees it, from NSpid.

    /proc shows the pids of the namespace it was mounted for: the first NSpid entry. The monitor is
    expected to run in the host pid namespace (``--pid=host`` in a container), where they agree.
    """
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return pid


@dataclass(frozen=True)
class MappedLib:
    path: str  # as the process sees it (inside its mount namespace)
    open_path: str  # how this process can open it: through /proc/PID/root
    dev_ino: tuple[int, int]


def mapped_libs(pid: int, patterns: Iterable[str]) -> list[MappedLib]:
    """Executable-mapped files of ``pid`` whose basename matches one of ``patterns`` (regexes)."""
    regs = [re.compile(p) for p in patterns]
    out: dict[tuple[int, int], MappedLib] = {}
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/") or parts[5].endswith("(deleted)"):
            continue
        path = parts[5]
        if not any(r.search(os.path.basename(path)) for r in regs):
            continue
        open_path = f"/proc/{pid}/root{path}"
        try:
            st = os.stat(open_path)
        except OSError:
            continue
        key = (st.st_dev, st.st_ino)
        out.setdefault(key, MappedLib(path, open_path, key))
    return list(out.values())


def attach_mode_reason() -> str | None:
    """None when uprobes go through the perf PMU (fd-based: freed when the monitor dies)."""
    if UPROBE_PMU.exists():
        return None
    return "kernel has no uprobe PMU (/sys/bus/event_source/devices/uprobe): uprobes unavailable"


def _typed(kind: Any, x: Any) -> Any:
    """A batch read's element as bcc's walk gives it: indexing a ctypes array of a simple type
    (a u32 key, a u64 value) returns a Python int; the probes read ``.value`` of it."""
    return x if hasattr(x, "_fields_") else kind(x)


class BccProbe:
    """What the bcc probes share: compile a rendered program, fill its ``pids`` filter map with the
    job's ranks, count lost updates, detach on close. A subclass sets ``name`` and ``program`` and
    implements ``check()``, ``_render(job)`` (the program text), ``_attach_programs()`` and ``sample(now)``."""

    name = "ebpf"
    program = ""  # the .bpf.c file beside this one

    def __init__(self) -> None:
        self._bpf: Any = None
        self._batch = True  # BPF_MAP_LOOKUP_BATCH works here (kernel >= 5.6); False once it failed
        self._ranks: dict[int, int] = {}  # host tgid -> rank
        self.text = ""  # the generated program (what a hidden --ebpf prints)
        self.notes: list[str] = []

    def check(self) -> str | None:
        return common_reason()

    def start(self, job: Any) -> None:
        from scout_sys.errors import ProbeUnavailable

        reason = self.check()
        if reason:
            raise ProbeUnavailable(reason)
        bcc, _ = load_bcc()
        assert bcc is not None
        self._ranks = {host_pid(r.pid): r.rank for r in job.ranks}
        self.text = self._render(job)
        try:
            self._bpf = compile_program(bcc, self.text)
            pids = self._bpf[b"pids"]
            for tgid, rank in self._ranks.items():
                pids[pids.Key(tgid)] = pids.Leaf(rank)
            self._attach_programs()
        except ProbeUnavailable:
            self.close()
            raise
        except Exception as e:
            self.close()
            raise ProbeUnavailable(f"loading the {self.program} program failed: {e}") from e

    def _render(self, job: Any) -> str:
        raise NotImplementedError

    def _attach_programs(self) -> None:
        """Attach what the program's section names do not attach by themselves (uprobes)."""

    def entries(self, name: str) -> list[tuple[Any, Any]]:
        """Every (key, value) of the map ``name``, read with one BPF_MAP_LOOKUP_BATCH syscall
        (kernel >= 5.6) instead of bcc's walk of two syscalls an entry (next key, then lookup: a poll
        of the collective probe's 128-entry history map on 8 ranks was 256 of them). Where the batch
        call fails (an older kernel, a map type without it) the walk, from then on."""
        table = self._bpf[name.encode()]
        if self._batch:
            try:
                return [(_typed(table.Key, k), _typed(table.Leaf, v)) for k, v in table.items_lookup_batch()]
            except Exception:  # noqa: BLE001 - EINVAL / ENOTSUPP / an old bcc: the per-key walk works everywhere
                self._batch = False
        return table.items()

    def lost(self) -> int:
        if self._bpf is None:
            return 0
        table = self._bpf[b"lost"]
        return int(table[table.Key(0)].value)  # a one-slot array: one lookup, not a walk

    def health(self) -> Any:
        from scout_sys.probes import Health

        return Health(notes=tuple(self.notes), lost=self.lost())

    def handoff(self) -> None:
        """Forget the program without detaching it: another process holding the same fds (a child
        forked to detach them: Monitor.close(background=True)) does that."""
        import atexit

        bpf, self._bpf = self._bpf, None
        if bpf is not None:
            atexit.unregister(bpf.cleanup)

    def close(self) -> None:
        bpf, self._bpf = self._bpf, None  # taken once: a second close (another thread) finds None
        if bpf is not None:
            detach_all(bpf)


def owned(bpf: Any) -> Any:
    """``bpf`` without the cleanup bcc registers to run at exit: ours detach it (close(), or the
    child of Monitor.close(background=True)), and the uprobes are fd-based (the perf PMU: the only
    attach mode we use, attach_mode_reason), so whatever is still attached when the monitor exits is
    detached by the kernel as its fds close. At exit bcc's cleanup would race a probe thread still
    attaching or closing the same fds (a watch stopped while its probe compiles under load): it
    printed "Failed to detach BPF from uprobe" tracebacks at the user, on fds already closed."""
    import atexit

    atexit.unregister(bpf.cleanup)
    return bpf


def detach_all(bpf: Any) -> None:
    """Detach what ``bpf`` still holds, once. bcc registered the same cleanup at exit: it is
    unregistered here whatever happened, or a cleanup that failed part way would run again at exit
    on fds already closed (and their numbers maybe reused) and print a traceback to the user."""
    import atexit

    try:
        bpf.cleanup()
    except Exception:  # noqa: BLE001, S110 - best effort; the kernel drops our fds when we exit
        pass
    finally:
        atexit.unregister(bpf.cleanup)
