"""The Monitor: probes → consensus → diagnosis. ``diagnose`` (and later ``watch``, the dashboard and
the cluster agent) drive this one loop.

Probes observe, consensus decides, the Monitor only schedules and keeps state. It never imports
torch and never pauses the job: stacks are read with ``py-spy --nonblocking``; only once a hang is
confirmed may a native (pausing) dump of the origin ranks be taken, since pausing a hung rank costs
nothing.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Any

from scout_sys.consensus import desync, hang, hardware, lifecycle, straggler
from scout_sys.consensus.hang import where_of
from scout_sys.consensus.patterns import collective_of, short_path
from scout_sys.errors import SUDO_HINT, PermissionDenied, ProbeUnavailable, ScoutError
from scout_sys.job import find_job
from scout_sys.model import (
    ATTRIBUTED,
    DESYNC,
    HANG,
    HARDWARE,
    PROCESS_EXIT,
    PROCESS_STALL,
    STRAGGLER,
    Diagnosis,
    Event,
    Evidence,
    Incident,
    Job,
    Observation,
    ProcSample,
    RankView,
    Snapshot,
    StackSample,
)
from scout_sys.probes.procfs import ProcfsProbe
from scout_sys.probes.pystack import PyStackProbe

# Extra probes (eBPF, NVML) register here as factories returning objects with the probe contract.
ProbeFactory = Callable[[], object]


class Monitor:
    def __init__(self, job: Job, *, extra_probes: Sequence[object] = (), clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.job = job
        self.clock = clock
        self.sleep = sleep
        self.procfs = ProcfsProbe()
        self.stacks = PyStackProbe()
        self.extra = list(extra_probes)
        self.probe_status: dict[str, str | None] = {}
        self._started: list[object] = []
        self._lock = threading.Lock()
        self._bg: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start procfs and stacks now; the kernel probes (compiling takes seconds) in the
        background, so the first window is not delayed. Their data joins once they are attached."""
        for p in (self.procfs, self.stacks):
            self._start_one(p)
        for p in self.extra:
            self.probe_status[getattr(p, "name", type(p).__name__)] = "starting"
        if self.extra:
            self._bg = threading.Thread(target=lambda: [self._start_one(p) for p in self.extra],
                                        name="probe-start", daemon=True)
            self._bg.start()

    def _start_one(self, p: object) -> None:
        name = getattr(p, "name", type(p).__name__)
        try:
            reason = p.available()  # type: ignore[attr-defined]
            if reason is None:
                p.start(self.job)  # type: ignore[attr-defined]
                with self._lock:
                    self._started.append(p)
        except ProbeUnavailable as e:
            reason = str(e)
        except Exception as e:  # noqa: BLE001 - a failing probe is reported, never fatal
            reason = f"failed to start: {e}"
        with self._lock:
            self.probe_status[name] = reason

    def wait_started(self, timeout: float | None = None) -> None:
        if self._bg is not None:
            self._bg.join(timeout)

    def close(self) -> None:
        if self._bg is not None:
            self._bg.join()  # never leave a probe attached behind us
            self._bg = None
        with self._lock:
            started, self._started = self._started, []
        for p in reversed(started):
            try:
                p.close()  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - closing must go on for every probe
                pass

    def __enter__(self) -> Monitor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _on(self, probe: object) -> bool:
        with self._lock:
            return probe in self._started

    # ------------------------------------------------------------------ sampling
    def _sample_extra(self) -> list[Observation]:
        out: list[Observation] = []
        for p in self.extra:
            if self._on(p):
                try:
                    out += p.sample()  # type: ignore[attr-defined]
                except Exception as e:  # noqa: BLE001 - a failing probe is reported, never fatal
                    self.probe_status[getattr(p, "name", "?")] = f"sampling failed: {e}"
        return out

    def collect(self, window: float, *, proc_interval: float = 0.25, stack_interval: float = 0.75) -> list[Observation]:
        """Sample every probe over ``window`` seconds; stacks at the start, every
        ``stack_interval`` and at the end; /proc every ``proc_interval``."""
        obs: list[Observation] = []
        t0 = self.clock()
        deadline = t0 + window
        next_stack = t0
        while True:
            now = self.clock()
            last = now >= deadline
            if self._on(self.procfs):
                batch = self.procfs.sample()
                obs += batch
                if all(not s.alive for s in batch) and batch:
                    last = True  # nothing left to watch
            if self._on(self.stacks) and (now >= next_stack or last):
                obs += self.stacks.sample()
                next_stack = self.clock() + stack_interval
            if last:
                obs += self._sample_extra()
                return obs
            self.sleep(max(0.0, min(proc_interval, deadline - self.clock())))

    # ------------------------------------------------------------------ deciding
    def decide(self, obs: Sequence[Observation], window: tuple[float, float]) -> Diagnosis:
        incidents, acts, notes = hang.analyze(self.job, obs, window=window)
        incidents = merge_findings(incidents, desync.analyze(self.job, obs), lifecycle.analyze(self.job, obs),
                                   hardware.analyze(self.job, obs))
        return Diagnosis(
            time=self.clock(),
            job=self.job,
            views={r: a.view() for r, a in acts.items()},
            incidents=tuple(incidents),
            probes={k: ("not attached within the window" if v == "starting" else v)
                    for k, v in self.probe_status.items()},
            window=window[1] - window[0],
            notes=tuple(list(self.job.notes) + notes),
        )

    def native_evidence(self, incidents: Sequence[Incident]) -> tuple[Incident, ...]:
        """Add native stacks of attributed hang origins (pausing them is harmless now)."""
        origins = {r for i in incidents if i.kind == HANG and i.status == ATTRIBUTED for r in i.ranks}
        if not origins or not self._on(self.stacks):
            return tuple(incidents)
        dumps: dict[int, StackSample] = {s.rank: s for s in self.stacks.sample(native=True, ranks=origins)}
        out = []
        for inc in incidents:
            extra = []
            for r in inc.ranks:
                s = dumps.get(r)
                if s is None:
                    continue
                main = s.main()
                if s.error or main is None:
                    extra.append(Evidence("stack", f"rank {r} native stack unavailable: {s.error}", rank=r))
                else:
                    extra.append(Evidence("stack", f"rank {r} native stack (py-spy --native)", rank=r,
                                          data={"native": True,
                                                "stack": [f"{f.file}:{f.line} {f.function}" for f in main.frames]}))
            out.append(replace(inc, evidence=inc.evidence + tuple(extra)) if extra else inc)
        return tuple(out)

    def diagnose(self, window: float = 3.0, *, native: bool = False) -> Diagnosis:
        """One shot: sample over ``window``, decide. The Monitor must be started."""
        t0 = self.clock()
        obs = self.collect(window)
        _check_stack_permission(obs)
        d = self.decide(obs, (t0, self.clock()))
        if native and d.incidents:
            d = replace(d, incidents=self.native_evidence(d.incidents))
        return d


def _check_stack_permission(obs: Sequence[Observation]) -> None:
    """No stack of any rank could be read for lack of permission: say so instead of guessing."""
    stacks = [o for o in obs if isinstance(o, StackSample)]
    if stacks and all(s.error and ("ermission" in s.error or "EPERM" in s.error or "ptrace" in s.error)
                      for s in stacks):
        raise PermissionDenied(f"py-spy may not read the ranks' memory ({stacks[0].error}): {SUDO_HINT}")


def merge_findings(*lists: Sequence[Incident]) -> list[Incident]:
    """One incident per (kind, ranks): the same finding from two signal sources (stacks and eBPF)
    becomes one incident whose evidence holds both; the first list's summary wins.

    A rank that the stack rules found outside any collective (hung, stopped, gone) is also *behind*
    in collective sequence: the eBPF "behind" desync about it corroborates that finding instead of
    standing as a second incident."""
    out: dict[tuple, Incident] = {}
    for findings in lists:
        for inc in findings:
            key = (inc.kind, inc.ranks) if inc.ranks else (inc.kind, inc.status, ())
            if key not in out and inc.kind == DESYNC and inc.ranks:
                key = next((k for k, o in out.items() if o.kind in (HANG, PROCESS_STALL, PROCESS_EXIT)
                            and set(inc.ranks) <= set(o.ranks)), key)
            if key in out:
                prev = out[key]
                out[key] = replace(prev, evidence=prev.evidence + inc.evidence, since=min(prev.since, inc.since))
            else:
                out[key] = inc
    return list(out.values())


def default_extra_probes() -> list[object]:
    """The kernel probes, when this build has them (their ``available()`` says whether they can run)."""
    probes: list[object] = []
    try:
        from scout_sys.probes.ebpf.collectives import CollectiveProbe
        from scout_sys.probes.ebpf.sched import SchedProbe
    except ImportError:
        return probes
    # Within the 1% budget (benchmarks/ebpf_overhead.py): collective entry points, not Gloo's
    # per-message transport calls; exits and signals, not every context switch (per-thread CPU time
    # comes from /proc schedstat at no cost to the job).
    probes += [CollectiveProbe(transport=False), SchedProbe(switches=False)]
    return probes


def default_probes(ebpf: bool = True) -> list[object]:
    """Every probe beyond procfs and stacks: GPU telemetry, and the kernel probes when asked."""
    from scout_sys.probes.nvml import NvmlProbe
    from scout_sys.probes.pgroups import ProcessGroupProbe

    return [NvmlProbe(), ProcessGroupProbe(), *(default_extra_probes() if ebpf else [])]


# ====================================================================== watch: the continuous loop

HANG_KINDS = frozenset({HANG, PROCESS_STALL, PROCESS_EXIT, DESYNC})
CLOSE_AFTER = 2  # polls without a finding before its incident closes (hysteresis)
MIN_STALL_AFTER = 5.0
MAX_STALL_AFTER = 600.0
CONFIRM_WINDOW = 1.0  # seconds of stacks taken to confirm a suspected hang
RECONFIRM_EVERY = 5.0  # while a hang stays open
STACKS_EVERY = 10.0  # background stack refresh for the dashboard (py-spy costs ~30 ms a rank)
STRAGGLER_WINDOW = 5.0
HISTORY_SECONDS = 60.0
RESTART_GRACE = 10.0  # seconds to wait for every rank of a restarted job to appear


def default_state_dir() -> str:
    if os.geteuid() == 0:
        return "/var/lib/scout-sys"
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(base, "scout-sys")


class Watcher:
    """``scout-sys watch``: follow a job, open / update / close incidents as it runs.

    The steady path reads /proc only (a few files per rank per poll). A hang is *suspected* when a
    strict majority of ranks' main threads has not run for ``stall_after`` seconds (or a rank stops
    or dies); it is *confirmed* by a short stack window and the same rules as ``diagnose``.
    ``stall_after`` adapts: four times the longest main-thread pause seen while the job was healthy,
    never below 5 s. Stragglers are judged every 5 s and confirmed over 3 windows.
    """

    def __init__(self, selector: str, *, interval: float = 0.5, stall_after: float | None = None,
                 state_dir: str | None = None, ebpf: bool = True, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep, topology: str | None = None,
                 stack_refresh: float | None = STACKS_EVERY) -> None:
        self.selector = selector
        # Stacks of a healthy job are only for people (the dashboard's stack groups): every py-spy
        # dump costs ~30 ms of a CPU per rank, so headless watches take stacks only to confirm a hang.
        self.stack_refresh = stack_refresh
        self.topology = topology  # --topology (scout_sys.topology); None: from the command line or activity
        self.interval = interval
        self.fixed_stall_after = stall_after
        self.state_dir = state_dir or default_state_dir()
        self.ebpf = ebpf
        self.clock = clock
        self.sleep = sleep
        self.monitor: Monitor | None = None
        self.job: Job | None = None
        self.started = 0.0
        self._obs: deque[Observation] = deque()
        self._open: dict[tuple, Incident] = {}
        self._misses: dict[tuple, int] = {}
        self._closed: deque[Incident] = deque(maxlen=50)
        self._seq = 0
        self._healthy_pause = 0.0  # longest majority main-thread pause seen while healthy
        self._pause = 0.0  # the majority's main-thread pause at the last poll
        self._last_confirm = 0.0
        self._last_stacks = 0.0
        self._last_straggler = 0.0
        self._last_rediscover = 0.0
        self._restart_seen = 0.0  # when new rank processes were first seen after ranks went away
        self._last_diagnosis: Diagnosis | None = None  # the last confirming window, for bundles
        self._restarting = False
        self._stragglers: deque[straggler.WindowVerdict] = deque(maxlen=straggler.CONFIRM)
        self._views: dict[int, RankView] = {}
        self._stacks: dict[int, tuple[str, ...]] = {}
        self._busy: dict[int, deque[float]] = {}
        self._lag: dict[int, deque[float]] = {}
        self._period: dict[int, deque[float]] = {}
        self._bundle: str | None = None
        self._devices: dict[int, dict[str, object]] = {}
        self._notes: list[str] = []
        self.ever_opened = False
        self.ended = False
        self._launcher_pid: int | None = None
        self.snapshot: Snapshot | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.job = find_job(self.selector, self.topology)
        self._launcher_pid = self.job.launcher_pid
        self._bind(self.job)
        self.started = self.clock()
        self._publish()

    def _bind(self, job: Job) -> None:
        if self.monitor is not None:
            self.monitor.close()
        self.job = job
        self.monitor = Monitor(job, extra_probes=default_probes(self.ebpf), clock=self.clock,
                               sleep=self.sleep)
        self.monitor.start()

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.close()
            self.monitor = None

    def __enter__(self) -> Watcher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def stall_after(self) -> float:
        if self.fixed_stall_after is not None:
            return self.fixed_stall_after
        return min(MAX_STALL_AFTER, max(MIN_STALL_AFTER, 4.0 * self._healthy_pause))

    # ------------------------------------------------------------------ one poll
    def poll(self) -> list[Event]:
        assert self.monitor is not None and self.job is not None, "start() first"
        mon, now = self.monitor, self.clock()
        procs = mon.procfs.sample()
        batch: list[Observation] = [*procs, *mon._sample_extra()]
        self._remember(batch, now)
        events: list[Event] = []

        respawning = bool(self.job.missing) and bool(self._launcher_pid) and _alive(self._launcher_pid or 0)
        if procs and all(not p.alive for p in procs) or any(p.status == "gone" for p in procs) or respawning:
            events += self._follow_restart(now)
            if self.ended or self.monitor is not mon or self._restarting:
                self._publish()
                return events

        suspect, pause = self._suspect(procs, now)
        self._pause, last_pause = pause, self._pause
        findings: list[Incident]
        hang_open = any(k[0] in HANG_KINDS for k in self._open)
        if hang_open:
            # Only a fresh stack window may close a hang: /proc alone is fooled by the blip a native
            # dump (ptrace) causes in a blocked thread. Progress seen in /proc brings that window forward.
            since = now - self._last_confirm
            if since >= RECONFIRM_EVERY or (not suspect and since >= CONFIRM_WINDOW):
                findings = self._confirm(now)
            else:
                findings = [i for k, i in self._open.items() if k[0] in HANG_KINDS]
        elif suspect:
            findings = self._confirm(now)
            trigger = Evidence("procfs", f"the main threads of a strict majority of ranks had not run for "
                               f"{pause:.1f} s (stall-after {self.stall_after:.1f} s)",
                               data={"pause": round(pause, 3), "stall_after": round(self.stall_after, 3)})
            findings = [replace(f, evidence=f.evidence + (trigger,)) if f.kind == HANG else f for f in findings]
        else:
            settling = any(v == "starting" for v in self.monitor.probe_status.values())
            if pause < last_pause and not settling:  # the majority ran again: a healthy pause; learn it
                self._healthy_pause = max(self._healthy_pause, last_pause)
            findings = lifecycle.analyze(self.job, list(self._obs))  # a rank that died, seen by eBPF
            findings = [f for f in findings if f.ranks and all(self._gone(r, procs) for r in f.ranks)]
            self._light_views(procs, now)
        events += self._reconcile(findings, now, HANG_KINDS)

        self._devices = {r: d.to_json() for r, d in hardware.latest(batch).items()} or self._devices
        events += self._reconcile(hardware.analyze(self.job, batch), now, frozenset({HARDWARE}))
        if now - self._last_straggler >= STRAGGLER_WINDOW:
            events += self._straggler_round(now)
        if not suspect and self.stack_refresh is not None and now - self._last_stacks >= self.stack_refresh:
            self._refresh_stacks(now)
        self._publish()
        return events

    def run(self, on_event: Callable[[Event], None], stop: threading.Event | None = None) -> int:
        """Poll until the job ends or ``stop`` is set. Returns 0 if no incident was ever opened, else 1."""
        stop = stop or threading.Event()
        while not stop.is_set() and not self.ended:
            t0 = self.clock()
            for e in self.poll():
                on_event(e)
            stop.wait(max(0.0, self.interval - (self.clock() - t0)))
        return 1 if self.ever_opened else 0

    def diagnose_now(self, window: float = 3.0) -> Diagnosis:
        assert self.monitor is not None
        return self.monitor.diagnose(window)

    # ------------------------------------------------------------------ pieces
    def _remember(self, batch: Sequence[Observation], now: float) -> None:
        self._obs.extend(batch)
        while self._obs and self._obs[0].time < now - HISTORY_SECONDS:
            self._obs.popleft()

    @staticmethod
    def _gone(rank: int, procs: Sequence[ProcSample]) -> bool:
        return any(p.rank == rank and not p.alive for p in procs)

    def _suspect(self, procs: Sequence[ProcSample], now: float) -> tuple[bool, float]:
        """(is a hang suspected, the majority's current main-thread pause in seconds)."""
        assert self.job is not None
        n = len(self.job.ranks) + len(self.job.missing)
        if self.job.missing or any(p.status in ("stopped", "tracing-stop", "zombie", "gone") for p in procs):
            return True, 0.0
        pauses = sorted(
            (0.0 if p.status == "running" or p.main_last_ran is None else max(0.0, now - p.main_last_ran))
            for p in procs)
        if not pauses:
            return False, 0.0
        # the pause that a strict majority of ranks has reached (the (n//2+1)-th longest)
        k = n // 2 + 1
        majority_pause = pauses[-k] if len(pauses) >= k else 0.0
        return majority_pause >= self.stall_after, majority_pause

    def _confirm(self, now: float) -> list[Incident]:
        assert self.monitor is not None and self.job is not None
        self._last_confirm = now
        t0 = self.clock()
        obs = self.monitor.collect(CONFIRM_WINDOW, proc_interval=0.25, stack_interval=0.5)
        self._remember(obs, self.clock())
        d = self.monitor.decide([*obs, *(o for o in self._obs if not isinstance(o, (ProcSample, StackSample)))],
                                (t0, self.clock()))
        self._views = dict(d.views)
        self._stacks = {r: v.stack for r, v in d.views.items() if v.stack}
        self._notes = list(d.notes)
        self._last_diagnosis = d
        return [i for i in d.incidents if i.kind in HANG_KINDS]

    def _light_views(self, procs: Sequence[ProcSample], now: float) -> None:
        """Per-rank state from /proc alone, keeping the last stack's place."""
        for p in procs:
            old = self._views.get(p.rank)
            if not p.alive:
                state = "exited"
            elif p.status in ("stopped", "tracing-stop"):
                state = "stopped"
            elif p.status == "disk-sleep":
                state = "disk-sleep"
            elif p.status == "running" or (p.main_last_ran is not None and now - p.main_last_ran < 1.0):
                state = "running"
            else:
                state = "idle"
            self._views[p.rank] = RankView(rank=p.rank, state=state, where=old.where if old else "",
                                           collective=None, cpu_percent=old.cpu_percent if old else None,
                                           stack=old.stack if old else ())

    def _refresh_stacks(self, now: float) -> None:
        assert self.monitor is not None
        self._last_stacks = now
        for s in self.monitor.stacks.sample():
            main = s.main()
            if main is not None and not s.error:
                stack = tuple(f"{short_path(f.file)}:{f.line} {f.function}" for f in main.frames)
                self._stacks[s.rank] = stack
                old = self._views.get(s.rank)
                w = collective_of(main.frames)
                self._views[s.rank] = RankView(rank=s.rank, state=old.state if old else "running",
                                               where=where_of(main.frames),
                                               collective=w.label() if w else None,
                                               cpu_percent=old.cpu_percent if old else None, stack=stack)

    def _straggler_round(self, now: float) -> list[Event]:
        assert self.job is not None
        start = max(self._last_straggler, now - STRAGGLER_WINDOW) if self._last_straggler else now - STRAGGLER_WINDOW
        self._last_straggler = now
        obs = [o for o in self._obs if o.time >= start - 0.01]
        w = straggler.window_verdict(self.job, obs, start, now)
        series = self._busy if w.metric == "busy" else self._lag
        for r, v in w.values.items():
            series.setdefault(r, deque(maxlen=60)).append(v)
        for r, v in w.periods.items():
            self._period.setdefault(r, deque(maxlen=60)).append(v)
        self._stragglers.append(w)
        inc = straggler.confirm(self.job, list(self._stragglers))
        return self._reconcile([inc] if inc else [], now, frozenset({STRAGGLER}))

    def _follow_restart(self, now: float) -> list[Event]:
        """Some ranks are gone: the job may have restarted (new pids for the same ranks) or ended."""
        if now - self._last_rediscover < 1.0:
            return []
        self._last_rediscover = now
        assert self.job is not None
        old = {(r.rank, r.pid) for r in self.job.ranks}
        for sel in (self.selector, str(self._launcher_pid) if self._launcher_pid else None):
            if not sel:
                continue
            try:
                job = find_job(sel, self.topology)
            except ScoutError:
                continue
            new = {(r.rank, r.pid) for r in job.ranks}
            live_new = {p for _r, p in new} - {p for _r, p in old}
            if live_new:
                # The launcher starts the new ranks one by one: wait (judging nothing) until all of
                # them are there, or RESTART_GRACE has passed, before following them.
                self._restart_seen = self._restart_seen or now
                if job.missing and now - self._restart_seen < RESTART_GRACE:
                    self._restarting = True
                    return []
                self._restarting = False
                self._restart_seen = 0.0
                self._notes.append(f"job restarted: following {len(job.ranks)} new rank processes")
                self._bind(job)
                self._views = {}
                return []
            self._restarting = False
            return []  # same processes: let the rules judge the dead ones
        if self._launcher_pid and _alive(self._launcher_pid):
            return []  # the launcher lives on: ranks between two elastic restarts
        # nothing left to find: the job is over
        self.ended = True
        findings = lifecycle.analyze(self.job, list(self._obs))
        return self._reconcile(findings, now, frozenset()) if findings else []

    # ------------------------------------------------------------------ incidents
    def _reconcile(self, findings: Sequence[Incident], now: float, kinds: frozenset[str]) -> list[Event]:
        events: list[Event] = []
        seen = set()
        for f in findings:
            key = f.key()
            seen.add(key)
            self._misses[key] = 0
            old = self._open.get(key)
            if old is None:
                self._seq += 1
                inc = replace(f, id=f"inc-{self._seq}")
                bundle = self._save_bundle(inc) if inc.kind in HANG_KINDS else None
                if bundle:
                    inc = replace(inc, evidence=inc.evidence + (
                        Evidence("procfs", f"evidence bundle saved to {bundle}", data={"bundle": bundle}),))
                self._open[key] = inc
                self.ever_opened = True
                events.append(Event("incident_opened", now, inc, bundle))
            else:
                inc = replace(f, id=old.id, since=min(old.since, f.since),
                              evidence=f.evidence + tuple(e for e in old.evidence if "bundle" in e.data))
                if _shape(inc.summary) != _shape(old.summary):  # not for every new number
                    events.append(Event("incident_updated", now, inc))
                self._open[key] = inc
        for key in list(self._open):
            if key in seen or key[0] not in kinds:
                continue
            self._misses[key] = self._misses.get(key, 0) + 1
            if self._misses[key] >= CLOSE_AFTER:
                inc = self._open.pop(key)
                self._closed.append(inc)
                events.append(Event("incident_closed", now, inc))
        return events

    def _save_bundle(self, inc: Incident) -> str | None:
        """Save what a person needs before launchers and watchdogs kill the job: every rank's stacks
        (native ones too: pausing a hung rank is harmless), process states, collective state."""
        assert self.monitor is not None and self.job is not None
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(inc.since))
        path = os.path.join(self.state_dir, "bundles", f"{stamp}-{inc.id}-{inc.kind}")
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            self._notes.append(f"cannot save the evidence bundle under {self.state_dir}: {e}")
            return None
        d = self._last_diagnosis
        diag = d.to_json() if d is not None else {}
        diag["incident"] = inc.to_json()
        _write_json(os.path.join(path, "diagnosis.json"), diag)
        _write_json(os.path.join(path, "procfs.json"), _proc_details(self.job))
        _write_json(os.path.join(path, "observations.json"), [_obs_json(o) for o in list(self._obs)[-2000:]])
        self._bundle = path
        mon = self.monitor
        threading.Thread(target=_save_native, args=(mon, path), name="bundle", daemon=True).start()
        return path

    def _publish(self) -> None:
        assert self.job is not None and self.monitor is not None
        self.snapshot = Snapshot(
            time=self.clock(), started=self.started, job=self.job, views=dict(self._views),
            incidents=tuple(self._open.values()), closed=tuple(self._closed),
            probes=dict(self.monitor.probe_status), stall_after=self.stall_after,
            step_times={r: tuple(v) for r, v in self._period.items()},
            wait_fractions={r: tuple(1.0 - x for x in v) for r, v in self._busy.items()},
            stacks=dict(self._stacks), devices=dict(self._devices), ended=self.ended, bundle=self._bundle,
            notes=tuple(self._notes[-10:]),
        )


def _shape(text: str) -> str:
    return re.sub(r"\d+(\.\d+)?", "#", text)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _write_json(path: str, obj: object) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)


def _obs_json(o: Observation) -> dict[str, Any]:
    d = asdict(o)
    d["type"] = type(o).__name__
    return d


def _proc_details(job: Job) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in job.ranks:
        info: dict[str, Any] = {"pid": r.pid}
        for name in ("status", "wchan", "stack", "sched", "schedstat", "cmdline"):
            try:
                with open(f"/proc/{r.pid}/{name}", "rb") as f:
                    info[name] = f.read().decode(errors="replace").replace("\0", " ")
            except OSError as e:
                info[name] = f"unreadable: {e.strerror}"
        out[str(r.rank)] = info
    return out


def _save_native(mon: Monitor, path: str) -> None:
    try:
        dumps = mon.stacks.sample(native=True)
        _write_json(os.path.join(path, "stacks-native.json"),
                    {str(s.rank): {"pid": s.pid, "error": s.error,
                                   "threads": [t.to_json() for t in s.threads]} for s in dumps})
    except Exception as e:  # noqa: BLE001 - the bundle is best effort; say what is missing
        _write_json(os.path.join(path, "stacks-native.json"), {"error": str(e)})
