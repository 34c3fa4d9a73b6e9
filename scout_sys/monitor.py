"""The Monitor: probes → consensus → diagnosis. ``diagnose`` (and later ``watch``, the dashboard and
the cluster agent) drive this one loop.

Probes observe, consensus decides, the Monitor only schedules and keeps state. It never imports
torch and never pauses the job: stacks are read with ``py-spy --nonblocking``; only once a hang is
confirmed may a native (pausing) dump of the origin ranks be taken, since pausing a hung rank costs
nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from scout_sys.consensus import hang
from scout_sys.errors import SUDO_HINT, PermissionDenied, ProbeUnavailable
from scout_sys.model import ATTRIBUTED, HANG, Diagnosis, Evidence, Incident, Job, Observation, StackSample
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

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        for p in (self.procfs, self.stacks, *self.extra):
            name = getattr(p, "name", type(p).__name__)
            reason = p.available()  # type: ignore[attr-defined]
            if reason is None:
                try:
                    p.start(self.job)  # type: ignore[attr-defined]
                    self._started.append(p)
                except ProbeUnavailable as e:
                    reason = str(e)
            self.probe_status[name] = reason

    def close(self) -> None:
        while self._started:
            p = self._started.pop()
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
        return probe in self._started

    # ------------------------------------------------------------------ sampling
    def _sample_extra(self) -> list[Observation]:
        out: list[Observation] = []
        for p in self.extra:
            if self._on(p):
                out += p.sample()  # type: ignore[attr-defined]
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
        return Diagnosis(
            time=self.clock(),
            job=self.job,
            views={r: a.view() for r, a in acts.items()},
            incidents=tuple(incidents),
            probes=dict(self.probe_status),
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
