"""Probes that must be in place before the ranks start: NCCL communicator creation (ebpf-comms).

A job makes its communicators in its first seconds; the watch's other kernel probes are compiled once
the ranks are found (probes start in the Monitor's background thread), too late to see them. So when
the watch starts, :class:`EarlyProbes` prepares the creation probe in its own thread: it looks for the
NCCL library the job will load (mapped by the selected processes or their children, or installed in
their Python: probes/ebpf/comms.py ``candidate_libs``), compiles and attaches to it, retrying while
the launcher has not imported torch yet. Each Monitor the watch builds (one per incarnation of the
job) gets a :class:`Lease`: it binds the probe to that Monitor's ranks and never detaches it, so a
restarted job's new communicators are seen too; the watch detaches it when it ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from scout_sys.errors import ProbeUnavailable
from scout_sys.model import Job, Observation
from scout_sys.probes import NO_NCCL

RETRY = 0.25  # seconds between the first looks for the NCCL library; then 1.2x longer each, up to 2 s
GIVE_UP = 600.0  # seconds after which a job that never loads NCCL is taken for one that does not use it


def _descendants(pids: list[int]) -> list[int]:
    import psutil

    out = list(pids)
    for pid in pids:
        try:
            out += [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            continue
    return out


class Lease:
    """The probe contract (scout_sys.probes) over a shared, already prepared probe: ``close`` unbinds."""

    def __init__(self, early: EarlyProbes, probe: Any) -> None:
        self.early, self.probe = early, probe
        self.name = probe.name

    def check(self) -> str | None:
        return self.early.reason or self.probe.check()

    def start(self, job: Job) -> None:
        if self.early.reason:
            raise ProbeUnavailable(self.early.reason)
        self.probe.start(job)  # waits for the compile the watch started, at most; or prepares now

    def sample(self, now: float) -> list[Observation]:
        return self.probe.sample(now)

    def health(self) -> Any:
        return self.probe.health()

    def close(self) -> None:
        self.probe.unbind()


class EarlyProbes:
    """Prepare ``probes`` (each with ``prepare(pids)``) from the processes ``pids()`` names, in a thread."""

    def __init__(self, probes: list[Any], pids: Callable[[], list[int]], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.probes = probes
        self.pids = pids
        self.clock = clock
        self.reason: str | None = None  # why the probes could not be prepared (None: prepared or trying)
        self._done = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not self.probes:
            self._done.set()
            return
        self._thread = threading.Thread(target=self._run, name="early-probes", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = self.clock()
        delay = RETRY
        try:
            for p in self.probes:
                reason = p.check()
                if reason:
                    self.reason = reason
                    return
                while not self._stop.is_set():
                    pids = _descendants(self.pids())
                    if not pids:  # nothing of the job exists yet (an env: selector's watch waits for it):
                        t0 = self.clock()  # the time to give up counts from its first process
                    try:
                        p.prepare(pids)
                        break
                    except ProbeUnavailable as e:
                        if not str(e).startswith(NO_NCCL) or self.clock() - t0 > GIVE_UP:
                            self.reason = str(e)
                            return
                        self._stop.wait(delay)  # the launcher has not imported torch yet
                        delay = min(2.0, delay * 1.2)
        except Exception as e:  # noqa: BLE001 - a failing probe is reported, never fatal
            self.reason = f"failed to start: {e}"
        finally:
            self._done.set()

    def wait(self, timeout: float | None) -> bool:
        return self._done.wait(timeout)

    def leases(self) -> list[Lease]:
        return [Lease(self, p) for p in self.probes]

    def close(self, *, background: bool = False, exiting: bool = False) -> None:
        """Detach (``background``: someone waits for the prompt; a probe still compiling is not waited
        for more than a moment). Unregistering a uprobe costs the kernel up to ~0.1 s each (1.5-2 s for this
        probe's 18). When this process exits next (``exiting``, or ``background``), a short-lived child
        holding the same fds does it once this process has gone, as Monitor.close(background=True) does,
        so that the watch's exit never waits for it. Otherwise (one job's watch of ``watch --every-job``
        ends, and the node's watch goes on for days) they are detached here: a child would hold them
        attached until the node's watch exits. Closed once: a second call (the watch's own exit after
        the dashboard's background close) returns at once instead of waiting a second more for a probe
        still compiling."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(0.1 if background else 1.0)
        probes = [p for p in self.probes if getattr(p, "_bpf", None) is not None]
        self.probes = []
        if not probes:
            return
        from scout_sys.monitor import detach_in_child

        if (background or exiting) and detach_in_child(probes):
            return
        for p in probes:
            try:
                p.close()
            except Exception:  # noqa: BLE001, S110 - detaching is best effort; our exit closes the rest
                pass


def early_probes() -> list[Any]:
    """The probes to prepare when the watch starts (the kernel ones: only with eBPF on)."""
    try:
        from scout_sys.probes.ebpf.comms import CommProbe
    except ImportError:
        return []
    return [CommProbe()]
