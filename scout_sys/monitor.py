"""The Monitor: probes → consensus → diagnosis, over one window. ``diagnose``, ``watch``
(scout_sys/watch/), the dashboard and the cluster agent all drive this one Monitor.

Probes observe, consensus decides, the Monitor only schedules and keeps state. It never imports
torch and never pauses the job: stacks are read with ``py-spy --nonblocking``; only once a hang is
confirmed may a native (pausing) dump of the origin ranks be taken, since pausing a hung rank costs
nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from scout_sys.consensus import desync, hang, peers, rules
from scout_sys.errors import ProbeUnavailable
from scout_sys.model import (
    ATTRIBUTED,
    HANG,
    INCONCLUSIVE,
    Activity,
    Diagnosis,
    Evidence,
    Incident,
    Job,
    Observation,
    StackSample,
)
from scout_sys.probes import Probe
from scout_sys.probes.jitter import Jitter
from scout_sys.probes.procfs import ProcfsProbe
from scout_sys.probes.pystack import StackDumper, check_access

STARTING = "starting"
CLOSE_TIMEOUT = 1.0  # seconds close() waits for a probe still compiling; it detaches itself after
BACKGROUND_JOIN = 0.1  # the same for close(background=True): someone waits for the prompt


class Interrupted(Exception):
    """A window stopped half-way (:meth:`Monitor.interrupt`): its samples are not judged."""


class Monitor:
    def __init__(self, job: Job, *, extra_probes: Sequence[Probe] = (), clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep, jitter: Jitter | None = None) -> None:
        """``jitter``: where each stack sample of a window falls in its slot (a seeded one in tests)."""
        self.job = job
        self.clock = clock
        self.sleep = sleep
        self.jitter = jitter or Jitter()
        self.procfs = ProcfsProbe()
        self.stacks = StackDumper()
        self.extra: list[Probe] = list(extra_probes)
        self.probe_status: dict[str, str | None] = {}
        self._started: list[object] = []
        self._lock = threading.Lock()
        self._bg: threading.Thread | None = None
        self._closing = False
        self._background = False
        self._interrupted = threading.Event()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start procfs and stacks now; the kernel probes (compiling takes seconds) in the
        background, so the first window is not delayed. Their data joins once they are attached."""
        for p in (self.procfs, self.stacks):
            self._start_one(p)
        for p in self.extra:
            self.probe_status[p.name] = STARTING
        if self.extra:
            self._bg = threading.Thread(target=lambda: [self._start_one(p) for p in self.extra],
                                        name="probe-start", daemon=True)
            self._bg.start()

    def _start_one(self, p: Probe | ProcfsProbe | StackDumper) -> None:
        name = p.name
        try:
            reason = p.check()
            if reason is None:
                p.start(self.job)
                with self._lock:
                    closing = self._closing
                    if not closing:
                        self._started.append(p)
                if closing:  # closed while this one compiled: detach it, never under the lock close() needs
                    self._late_close(p)
                    return
        except ProbeUnavailable as e:
            reason = str(e)
        except Exception as e:  # noqa: BLE001 - a failing probe is reported, never fatal
            reason = f"failed to start: {e}"
        with self._lock:
            self.probe_status[name] = reason

    def _late_close(self, p: object) -> None:
        """A probe that finished starting after close(): detached in a short-lived child when close
        asked for that (its uprobes' unregistration takes seconds), else here, in the probe thread."""
        if self._background and hasattr(p, "handoff") and detach_in_child([p]):
            return
        try:
            p.close()  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001, S110 - detaching is best effort; our exit closes the rest
            pass

    def wait_started(self, timeout: float | None = None) -> None:
        if self._bg is not None:
            self._bg.join(timeout)

    @property
    def settling(self) -> bool:
        """Some probe is still starting (compiling)."""
        return any(v == STARTING for v in self.probe_status.values())

    def close(self, timeout: float = CLOSE_TIMEOUT, *, background: bool = False) -> None:
        """Detach every probe. Never waits forever: a probe still compiling after ``timeout`` detaches
        itself when it is done (and its perf-event fds close with this process anyway).

        ``background``: for a person waiting for the prompt (``q`` in the dashboard). Unregistering a
        uprobe costs the kernel about 0.1 s each (an RCU grace period), seconds for the collective
        probe's dozens; a short-lived child that holds the same perf-event fds detaches them while
        this process exits at once (the probes stay attached those few seconds longer)."""
        with self._lock:
            self._closing = True
            self._background = background
        if self._bg is not None:
            # a person waits (background): a probe still compiling detaches itself in a child when done
            self._bg.join(min(timeout, BACKGROUND_JOIN) if background else timeout)
            self._bg = None
        with self._lock:
            started, self._started = self._started, []
        if background:
            slow = [p for p in started if hasattr(p, "handoff")]
            if slow and detach_in_child(slow):
                started = [p for p in started if p not in slow]
        for p in reversed(started):
            try:
                p.close()  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - closing must go on for every probe
                pass

    def interrupt(self) -> None:
        """Someone waits for the prompt (``q``): a window in progress (a watch's confirmation, up to a
        second and a half on a busy machine) stops at its next sample by raising :class:`Interrupted`,
        so that closing need not wait for it; no finding comes from the half window."""
        self._interrupted.set()

    def __enter__(self) -> Monitor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _on(self, probe: object) -> bool:
        with self._lock:
            return probe in self._started

    # ------------------------------------------------------------------ sampling
    def sample_extra(self, now: float | None = None) -> list[Observation]:
        """One sample of every started probe beyond procfs (eBPF, NVML)."""
        now = self.clock() if now is None else now
        out: list[Observation] = []
        for p in self.extra:
            if self._on(p):
                try:
                    out += p.sample(now)
                except Exception as e:  # noqa: BLE001 - a failing probe is reported, never fatal
                    self.probe_status[p.name] = f"sampling failed: {e}"
        return out

    def lost_events(self) -> int | None:
        """Updates the started eBPF probes dropped (bounded kernel maps full); None: none reports any."""
        counts = [p.health().lost for p in self.extra if self._on(p) and p.name.startswith("ebpf")]
        return sum(counts) if counts else None

    def health_notes(self) -> list[str]:
        """What the started probes say about themselves: features off, events lost."""
        notes = []
        for p in self.extra:
            if self._on(p):
                h = p.health()
                notes += [f"{p.name}: {n}" for n in h.notes]
                if h.lost:
                    notes.append(f"{p.name}: {h.lost} updates lost (a bounded map was full)")
        return notes

    def collect(self, window: float, *, proc_interval: float = 0.25, stack_interval: float | None = None
                ) -> list[Observation]:
        """Sample every probe over ``window`` seconds; stacks once in every ``stack_interval`` (default:
        :func:`stack_interval_for` the window), at a random point of it (:class:`Jitter`: never phase-locked
        with the job's steps), and at the end; /proc every ``proc_interval``."""
        if stack_interval is None:
            stack_interval = stack_interval_for(window)
        obs: list[Observation] = []
        t0 = self.clock()
        deadline = t0 + window
        # on a schedule from t0: a dump's own time does not thin the samples. Stacks: the k-th falls at a
        # random point of its slot [t0 + k x interval, t0 + (k + 1) x interval)
        next_proc = slot = t0
        next_stack = slot + self.jitter.offset(stack_interval)
        while True:
            if self._interrupted.is_set():
                raise Interrupted("the window was interrupted")
            now = self.clock()
            last = now >= deadline
            if not self._on(self.procfs):
                next_proc = deadline  # nothing to schedule: never a busy loop
            elif now >= next_proc or last:
                batch = self.procfs.sample(now)
                obs += batch
                next_proc = _next(next_proc, proc_interval, now)
                if all(not s.alive for s in batch) and batch:
                    last = True  # nothing left to watch
            if not self._on(self.stacks):
                next_stack = deadline
            elif now >= next_stack or last:
                obs += self.stacks.dump()
                slot = _next_slot(slot, stack_interval, self.clock())
                next_stack = slot + self.jitter.offset(stack_interval)
            if last:
                obs += self.sample_extra()
                return obs
            self.sleep(max(0.0, min(next_proc, next_stack, deadline) - self.clock()))

    # ------------------------------------------------------------------ deciding
    def decide(self, obs: Sequence[Observation], window: tuple[float, float]) -> Diagnosis:
        # the hang and desync votes keep the layout the job came with (without one, the wait-for graph
        # follows the learned process groups); stragglers and the report use the learned peers
        job = peers.with_learned(self.job, obs)
        d = rules.decide(self.job, obs, cadence=rules.WINDOW, window=window, peers=job)
        incidents, acts, notes = d.incidents, d.acts, d.notes
        return Diagnosis(
            time=self.clock(),
            job=job,
            views={r: a.view() for r, a in acts.items()},
            incidents=tuple(incidents),
            probes={k: ("not attached within the window" if v == STARTING else v)
                    for k, v in self.probe_status.items()},
            window=window[1] - window[0],
            notes=tuple(list(job.notes) + notes + self.health_notes()),
        )

    def native_evidence(self, incidents: Sequence[Incident]) -> tuple[Incident, ...]:
        """Add native stacks of attributed hang origins (pausing them is harmless now)."""
        origins = {r for i in incidents if i.kind == HANG and i.status == ATTRIBUTED for r in i.ranks}
        if not origins or not self._on(self.stacks):
            return tuple(incidents)
        dumps: dict[int, StackSample] = {s.rank: s for s in self.stacks.dump(origins, native=True)}
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
        check_access(obs)
        d = self.decide(obs, (t0, self.clock()))
        if not d.incidents and (short := too_short(self.job, obs, (t0, d.time))) is not None:
            d = replace(d, incidents=(short,))
        if native and d.incidents:
            d = replace(d, incidents=self.native_evidence(d.incidents))
        return d


STACK_SAMPLES = 12  # a window's stack samples at least: with 7 (every 0.5 s in 3 s), a 4x compute
# straggler caught in its own all-reduce 2 times in 7 looked like its peers one window in five
STACK_INTERVAL = (0.25, 0.5)  # seconds: the densest (py-spy's cost: ~30 ms of CPU a rank) and sparsest


def _next(due: float, interval: float, now: float) -> float:
    """The next time on the schedule; after an overrun, now (one late sample, never a burst)."""
    return max(due + interval, now)


def _next_slot(slot: float, interval: float, now: float) -> float:
    """The next stack slot; after a dump that ran past it whole, the one beginning now (one late sample,
    never a burst). A dump that ran into it only leaves its sample due at once or later in it."""
    nxt = slot + interval
    return nxt if now < nxt + interval else now


def stack_interval_for(window: float) -> float:
    """How often one window dumps the ranks' stacks: a dozen samples at least, never more often than every
    0.25 s (3 s: every 0.25 s; 6 s and longer: every 0.5 s)."""
    lo, hi = STACK_INTERVAL
    return min(hi, max(lo, window / STACK_SAMPLES))


STILL_SLACK = 0.1  # seconds: a main thread that last ran this soon after the window began did not run in it


def too_short(job: Job, obs: Sequence[Observation], window: tuple[float, float]) -> Incident | None:
    """``diagnose``'s window showed no progress at all: every rank stayed at one place (asleep or
    waiting with its main thread not run since the window began, or spinning), and no collective
    began or ended (eBPF). A step longer than the window looks just like a hang then: an inconclusive
    hang that says so (exit status 1), never "healthy". A healthy job whose steps are shorter than
    the window always shows one of them moving."""
    acts = hang.activities(job, obs)
    if not acts or len(acts) < len(job.ranks):
        return None

    def still(a: Activity) -> bool:
        if a.state == "busy":
            return True
        return a.state in ("waiting", "idle") and (a.last_ran is None or a.last_ran <= window[0] + STILL_SLACK)

    if not all(still(a) for a in acts.values()):
        return None
    if any(t >= window[0] for t in desync.last_progress(obs).values()):
        return None
    seconds = window[1] - window[0]
    ev = [Evidence("stack", f"rank {a.rank} {a.state} at {a.where or '?'} for the whole window", rank=a.rank,
                   data={"state": a.state, "stack": list(a.stack)}) for a in acts.values()]
    return Incident(
        kind=HANG, status=INCONCLUSIVE, ranks=(), hosts=tuple(sorted({job.host_of(r) for r in acts})),
        since=window[0],
        summary=(f"no rank made progress during the {seconds:.1f} s window: the window was too short to tell a "
                 f"step longer than {seconds:.1f} s from a hang; diagnose again with a longer --window, "
                 "or watch the job"),
        evidence=tuple(ev))


def _keep_only_kernel_objects(keep: int) -> None:
    """In a child forked to detach probes: close every inherited fd but ``keep`` and the kernel
    objects (perf events, BPF programs and maps: ``anon_inode:``) its probes hold. A fork copies the
    fds of every thread's work in flight: another thread's ``subprocess`` spawn (its exec-status pipe,
    its child's stdout), a metrics socket. Kept open in a child that lives until this process exits,
    they would make that spawn wait for ever (no EOF) and keep the port bound after our exit."""
    import os

    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in fds:
        if fd in (0, 1, 2, keep):
            continue
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("anon_inode:"):
                continue
            os.close(fd)
        except OSError:
            pass  # the listing's own fd (gone already), or one closed meanwhile


def detach_in_child(probes: Sequence[object]) -> bool:
    """Fork a child (its own session, no terminal) that detaches ``probes`` once this process has
    exited; this process forgets them without detaching. Whoever drops the last reference to a perf
    event pays for its unregistration, so the child waits (on a pipe this process holds open until it
    exits) before closing its copies. False (nothing done) when the fork fails."""
    import os

    try:
        r, w = os.pipe()
        pid = os.fork()
    except OSError:
        return False
    if pid == 0:  # the child: only this thread exists here
        try:
            os.close(w)
            _keep_only_kernel_objects(r)
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.read(r, 1)  # EOF: the parent has exited (or closed its end)
            for p in probes:
                try:
                    p.close()  # type: ignore[attr-defined]
                except Exception:  # noqa: BLE001, S110 - detaching is best effort; our exit closes the rest
                    pass
        finally:
            os._exit(0)
    os.close(r)  # ``w`` stays open until this process exits
    for p in probes:
        p.handoff()  # type: ignore[attr-defined]
    return True


def default_extra_probes() -> list[Probe]:
    """The kernel probes, when this build has them (their ``available()`` says whether they can run)."""
    probes: list[Probe] = []
    try:
        from scout_sys.probes.ebpf.collectives import CollectiveProbe
        from scout_sys.probes.ebpf.sched import SchedProbe
    except ImportError:
        return probes
    # Within the 1% budget (benchmarks/ebpf_overhead.py): collective entry points, not Gloo's
    # per-message transport calls; exits and signals, not every context switch (per-thread CPU time
    # comes from /proc schedstat at no cost to the job). The exit probe first: it attaches in a fifth of
    # the collective probe's time, and until it has, a rank its launcher reaps at once leaves no exit
    # status (a job ending cleanly would read as a rank that died).
    probes += [SchedProbe(switches=False), CollectiveProbe(transport=False)]
    return probes


def default_probes(ebpf: bool = True) -> list[Probe]:
    """Every probe beyond procfs and stacks: GPU telemetry, and the kernel probes when asked."""
    from scout_sys.probes.nvml import NvmlProbe
    from scout_sys.probes.pgroups import ProcessGroupProbe

    return [NvmlProbe(), ProcessGroupProbe(), *(default_extra_probes() if ebpf else [])]
