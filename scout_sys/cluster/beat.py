"""The agent's own watch between two windows: the parts of ``watch`` (watch/sample.py,
watch/progress.py, watch/views.py), summed up as one :class:`~scout_sys.cluster.heartbeat.RankBeat` per
rank for the heartbeat.

Every heartbeat the agent samples its ranks as ``watch`` does each poll: /proc for every rank, the
eBPF and NVML probes, and a few ranks' stacks in turn (each rank at least every 4 s; 5x less often
once eBPF sees every rank's collectives). :class:`~scout_sys.watch.progress.Progress` then says how
long each rank has gone without progress by the best signal it has — the same numbers the
single-host watch compares with stall-after — and the heartbeat carries them, so that
``watch --cluster`` suspects the GPU shape (every rank running, no collective frame) as ``watch``
does. The probes' records (collective positions, exits, signals) are kept for the next window's
answer: the probes report an exit once, to whoever samples first.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from scout_sys.cluster.heartbeat import RankBeat
from scout_sys.consensus import lifecycle, straggler
from scout_sys.model import (
    CollectiveSample,
    DeviceSample,
    ExitRecord,
    Observation,
    OomRecord,
    ProcSample,
    SignalRecord,
    StackSample,
)
from scout_sys.watch.progress import Progress, Rotation
from scout_sys.watch.sample import cheap_sample, dead
from scout_sys.watch.views import Views

if TYPE_CHECKING:
    from scout_sys.monitor import Monitor

STACK_PERIOD = 4.0  # seconds: every rank's stack is read at least this often (Rotation)
HISTORY_SECONDS = 60.0  # collective and GPU samples kept for windows
MAX_EVENTS = 256  # exits, signals, OOMs kept (the newest)
STEP_SECONDS = 10.0  # step-time statistics over this many recent seconds
_SAMPLES = (CollectiveSample, DeviceSample)
_EVENTS = (ExitRecord, SignalRecord, OomRecord)


class LocalWatch:
    def __init__(self, interval: float) -> None:
        """``interval``: seconds between two :meth:`sample` calls (the heartbeat's)."""
        self.interval = interval
        self.forget()

    def forget(self) -> None:
        """New processes (the job restarted, or another job): what the old ones did says nothing."""
        self.progress = Progress()
        self.rotation = Rotation(period=STACK_PERIOD, interval=self.interval)
        self.views = Views()
        self._samples: deque[Observation] = deque()
        self._events: deque[Observation] = deque(maxlen=MAX_EVENTS)
        self._hashes: dict[tuple[str, ...], str] = {}

    def sample(self, mon: Monitor, now: float) -> list[ProcSample]:
        """One cheap sample of every rank (the ``watch`` poll's); its /proc samples."""
        procs, batch, stacks = cheap_sample(mon, self.progress, self.rotation, now)
        self.views.from_stacks(stacks)
        self.remember(batch, now)
        return procs

    def window(self, obs: Sequence[Observation], now: float) -> None:
        """A window's observations: progress, places and records as from a poll."""
        self.progress.observe(obs, now)
        self.views.from_stacks(o for o in obs if isinstance(o, StackSample) and not o.native)
        self.remember(obs, now)

    def remember(self, obs: Iterable[Observation], now: float) -> None:
        for o in obs:
            if isinstance(o, _SAMPLES):
                self._samples.append(o)
            elif isinstance(o, _EVENTS):
                self._events.append(o)
        while self._samples and self._samples[0].time < now - HISTORY_SECONDS:
            self._samples.popleft()

    def records(self) -> list[Observation]:
        """The recent collective and GPU samples, and the exits, signals and OOMs seen."""
        return [*self._samples, *self._events]

    def beats(self, procs: Sequence[ProcSample], now: float) -> list[RankBeat]:
        """One beat per rank of the last /proc sample."""
        seqs = self.progress.seqs()
        steps = straggler.periods(self._samples, now - STEP_SECONDS, now)
        out = []
        # a rank that ended cleanly is no dead rank to its agent either: the job may be finishing
        clean = lifecycle.clean_ends([*procs, *self._events]) if any(dead(p) for p in procs) else frozenset()
        for p in procs:
            stall, signal = self.progress.stalled(p.rank, now)
            view = self.views.views.get(p.rank)
            stack = self.views.stacks.get(p.rank, ())
            out.append(RankBeat(
                rank=p.rank, pid=p.pid, state=p.status,
                pause=0.0 if p.status == "running" or p.main_last_ran is None else max(0.0, now - p.main_last_ran),
                stall=stall, signal=signal, dead=dead(p) and p.pid not in clean,
                where=view.where if view else "", stack=self._hash(stack) if stack else "",
                seqs=tuple(sorted(seqs.get(p.rank, {}).items())), step=steps.get(p.rank)))
        return out

    def _hash(self, stack: tuple[str, ...]) -> str:
        """A short stable hash of a stack (its frames' text): equal stacks, equal hashes, across hosts."""
        h = self._hashes.get(stack)
        if h is None:
            if len(self._hashes) > 4096:
                self._hashes.clear()
            h = self._hashes[stack] = hashlib.blake2b("\n".join(stack).encode(), digest_size=4).hexdigest()
        return h
