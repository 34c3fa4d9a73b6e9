"""``scout-sys watch``: follow a job, open / update / close incidents as it runs.

The Watcher composes small parts, each taking observations and ``now`` and returning findings or
decisions, in the order a poll reads top to bottom:

1. :mod:`~scout_sys.watch.restart` finds the ranks (waiting for them when the watch starts with the
   job) and follows restarts;
2. one cheap sample: /proc for every rank, the eBPF and NVML probes, and a few ranks' stacks in turn
   (:class:`~scout_sys.watch.progress.Rotation`);
3. :mod:`~scout_sys.watch.progress` says how long a strict majority has made no progress;
   :mod:`~scout_sys.watch.hang` decides whether to take a stack window (the Monitor's, judged by the
   same rules as ``diagnose``);
4. :mod:`~scout_sys.watch.straggler` judges a window every few seconds;
5. :mod:`~scout_sys.watch.incidents` turns the findings into events; the
   :mod:`~scout_sys.watch.session` (shared with ``watch --cluster``) feeds the sinks and saves the
   evidence of a new hang (:mod:`~scout_sys.watch.bundle`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from scout_sys.consensus import commonmode, desync, hardware, lifecycle, peers, rules
from scout_sys.consensus.kinds import HANG_KINDS
from scout_sys.job import find_job
from scout_sys.model import (
    HARDWARE,
    PROCESS_EXIT,
    SDC,
    STRAGGLER,
    Diagnosis,
    Event,
    Evidence,
    Incident,
    Job,
    Observation,
    ProcSample,
    StackSample,
)
from scout_sys.monitor import Monitor, default_probes
from scout_sys.probes.jitter import Jitter
from scout_sys.replay.live import ReplayPart
from scout_sys.watch import bundle
from scout_sys.watch.config import WatchConfig
from scout_sys.watch.early import EarlyProbes, early_probes
from scout_sys.watch.hang import CONFIRM_WINDOW, HangWatch, Reading
from scout_sys.watch.incidents import IncidentBook
from scout_sys.watch.progress import Progress, Rotation
from scout_sys.watch.restart import ENDED, FOUND, SAME, RankFinder, selector_pids
from scout_sys.watch.sample import cheap_sample
from scout_sys.watch.sample import dead as _dead
from scout_sys.watch.session import EngineParts, Session, Sessioned
from scout_sys.watch.straggler import StragglerWatch, with_replay
from scout_sys.watch.views import Views

HISTORY_SECONDS = 60.0
WAITING_TEXT = "waiting for the job's ranks…"

__all__ = ["HANG_KINDS", "WAITING_TEXT", "WatchConfig", "Watcher"]


class Watcher(Sessioned, EngineParts):
    """A live job, polled every ``interval`` seconds; a :class:`~scout_sys.tui.source.Source`, every
    member of which it answers itself (the engine does not import the dashboard)."""

    live = True  # the dashboard polls it
    path: str | None = None  # no saved report: live data
    can_replay = True  # the dashboard's `r` (replay_now says when it cannot start a round)

    def __init__(self, selector: str, config: WatchConfig | None = None, *, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep, jitter: Jitter | None = None,
                 key: str | None = None) -> None:
        """``config``: how to follow the job, one value (watch/config.py; None: its defaults). ``jitter``:
        each poll's wait, drawn around ``config.interval`` (probes/jitter.py; a seeded one in tests).
        ``key``: of the jobs the selector covers, that one only (job.job_keys; watch/node.py)."""
        self.config = config = config or WatchConfig()
        self.selector = selector
        self.session = Session(config.state_dir)  # sinks, snapshot, bundles: as for watch --cluster
        self.clock = clock
        self.sleep = sleep
        self.jitter = jitter or Jitter()
        self.finder = RankFinder(selector, lambda sel: find_job(sel, config.topology, key), wait_ranks=config.wait_ranks)
        # probes that must be attached before the ranks start (NCCL communicator creation)
        self.early = EarlyProbes(early_probes() if config.ebpf else [], lambda: selector_pids(selector))
        self.hang = HangWatch(config.stall_after)
        self.progress = Progress()
        self.rotation = Rotation(period=config.stack_period, interval=config.interval)
        self.stragglers = StragglerWatch()
        self.book = IncidentBook()
        self.replay: ReplayPart | None = None
        self._replayed: list[Incident] = []  # the last replay session's findings (sdc, straggler)
        self.monitor: Monitor | None = None
        self.job: Job | None = None
        self.started = 0.0
        self.waiting: str | None = None  # what the watch waits for, before the first job (for people)
        self.ended = False
        self._obs: deque[Observation] = deque()
        self._collectives: dict[tuple[str, int], Any] = {}  # (group, rank) -> latest CollectiveSample
        self.views = Views()
        self._devices: dict[int, dict[str, object]] = {}
        self._notes: list[str] = []
        self._last_diagnosis: Diagnosis | None = None
        self._native_dumps = 0  # bundles' native dumps in flight: they pause ranks (see _hang_step)
        self._native_lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Find the job (raises when the selector names nothing); its ranks may come later."""
        self.started = self.clock()
        self.early.start()
        self._look_for_ranks(self.started)

    def _look_for_ranks(self, now: float) -> None:
        found = self.finder.first(now)
        if found.status == FOUND and found.job is not None:
            self.waiting = None
            self._bind(found.job, now)
        else:
            self.waiting = WAITING_TEXT + (f" ({found.note})" if found.note else "")

    def _bind(self, job: Job, now: float) -> None:
        if self.monitor is not None:
            self.monitor.close()
        self.job = job
        self.progress.forget()
        self._collectives = {}
        self.stragglers.every.reset(now)
        self.monitor = Monitor(job, extra_probes=[*self.early.leases(), *default_probes(self.config.ebpf)], clock=self.clock,
                               sleep=self.sleep, jitter=self.jitter)
        self.monitor.start()
        if self.replay is not None:
            self.replay.close()
        cfg = self.config
        self.replay = ReplayPart(job, every=cfg.replay_every, state_dir=self.state_dir, started=now,
                                 checkpoints=cfg.replay) if cfg.replay or cfg.replay_every else None
        self._replayed = []
        self._publish()

    def close(self, *, background: bool = False, exiting: bool = False) -> None:
        """Detach every probe (``background``: let a short-lived child do the slow part, see
        :meth:`Monitor.close`; ``exiting``: this process exits next, so the early probes' child may
        detach them once it has gone, see :meth:`EarlyProbes.close`)."""
        if self.replay is not None:
            self.replay.close()  # its workers are gone when this returns
            self.replay = None
        if self.monitor is not None:
            self.monitor.close(background=background)
            self.monitor = None
        self.early.close(background=background, exiting=exiting)

    def interrupt(self) -> None:
        """Stop a poll in flight at its next sample (a confirmation window: Monitor.interrupt); that
        poll raises and reports nothing. For ``q``: the prompt need not wait for the window."""
        if self.monitor is not None:
            self.monitor.interrupt()

    def __enter__(self) -> Watcher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, on_event: Callable[[Event], None], stop: threading.Event | None = None, *,
            on_job: Callable[[Job], None] | None = None) -> int:
        """Poll until the job ends or ``stop`` is set; ``on_job`` once its ranks are found. Returns 0 if
        no incident was ever opened, else 1."""
        stop = stop or threading.Event()
        told = False
        while not stop.is_set() and not self.ended:
            t0 = self.clock()
            for e in self.poll():
                on_event(e)
            if not told and self.job is not None:
                told = True
                if on_job is not None:
                    on_job(self.job)
            # each wait drawn around the interval: the polls' stack samples never phase-lock with the steps
            stop.wait(self.hang.poll_wait(self.clock(), t0, self.jitter.interval(self.interval)))
        return 1 if self.ever_opened else 0

    def diagnose_now(self, window: float = 3.0) -> Diagnosis:
        if self.monitor is None:
            raise RuntimeError(self.waiting or "no job")
        return self.monitor.diagnose(window)

    # ------------------------------------------------------------------ one poll
    def poll(self) -> list[Event]:
        """One iteration: its events; the sinks get them and the new snapshot (watch/session.py)."""
        return self.session.poll(self._poll)

    def _poll(self) -> list[Event]:
        now = self.clock()
        if self.job is None:
            self._look_for_ranks(now)  # raises NoRanks when the selector ended without ranks
            return []
        mon, job = self.monitor, self.job
        assert mon is not None
        procs, batch, stacks = cheap_sample(mon, self.progress, self.rotation, now)
        self.views.from_stacks(stacks)
        self._remember(batch, now)
        events: list[Event] = []
        # peer groups learned from the process groups (consensus/peers.py), unless the job came with a layout
        self.job = job = peers.with_learned(job, batch)

        gone = any(p.status == "gone" for p in procs) or (procs and all(not p.alive for p in procs))
        if gone or (job.missing and self.finder.launcher_pid):
            found = self.finder.follow(job, now)
            if found.status == ENDED:
                self.ended = True
                events += self.book.reconcile(_poll_rule(job, list(self._obs), PROCESS_EXIT), now, frozenset())
            elif found.status == FOUND and found.job is not None:
                self._notes.append(found.note)
                self.views.clear()
                self._bind(found.job, now)
            if found.status != SAME:  # ended, restarted, or new ranks still starting: judge nothing now
                self._publish()
                return events

        events += self._hang_step(procs, now)
        self._devices = {r: d.to_json() for r, d in hardware.latest(batch).items()} or self._devices
        events += self.book.reconcile(_poll_rule(job, batch, HARDWARE), now, frozenset({HARDWARE}))
        events += self._replay_step(now)
        if self.stragglers.due(now):
            found = with_replay(self.stragglers.round(job, list(self._obs), now),
                                self.replay.explain if self.replay is not None else None, self._replayed)
            events += self.book.reconcile(found, now, frozenset({STRAGGLER}))
        self._publish()
        return events

    def _hang_step(self, procs: Sequence[ProcSample], now: float) -> list[Event]:
        job, mon = self.job, self.monitor
        assert job is not None and mon is not None
        # a rank that ended cleanly is no dead rank: the job may be finishing (watch/hang.py)
        clean = lifecycle.clean_ends([*procs, *self._obs]) if any(_dead(p) for p in procs) else frozenset()
        decisive = bool(job.missing) or any(_dead(p) and p.pid not in clean for p in procs)
        n = len(job.ranks) + len(job.missing)
        stall, signal = self.progress.majority([r.rank for r in job.ranks], n, now)
        hang_open = bool(self.book.of_kinds(HANG_KINDS))
        # a bundle's native dump holds ranks right now: a window would judge the pause we caused
        # (witnesses frozen mid-collective look like a common-mode hang); decide once it is done
        reading = Reading(stall, signal, decisive=decisive, learning=not job.missing and not mon.settling,
                          finishing=any(p.pid in clean for p in procs), hold=bool(self._native_dumps),
                          desync=not hang_open and self._fingerprints_disagree(mon.job))
        _d, judged = self.hang.round(now, reading, hang_open=hang_open, window=self._confirm)
        if judged is not None:
            findings = [self._with_step_history(f, stall) if commonmode.is_common_mode(f) else f for f in judged]
        elif hang_open:
            findings = self.book.of_kinds(HANG_KINDS)  # between two windows the hang stays as it was
        else:
            # a rank that died, seen by eBPF, while the rest has not stalled yet
            findings = [f for f in _poll_rule(job, list(self._obs), PROCESS_EXIT)
                        if f.ranks and all(any(p.rank == r and not p.alive for p in procs) for r in f.ranks)]
            self.views.from_procs(procs, now)
        return self.book.reconcile(findings, now, HANG_KINDS, on_open=self._on_open)

    def _with_step_history(self, inc: Incident, stall: float) -> Incident:
        """A common-mode hang with what the watch knows of the job's own steps: the recent steady gap
        without progress of a strict majority, and how long now (a long step stays within it)."""
        steps = sorted(v for q in self.stragglers.period.values() for v in q)
        step = steps[len(steps) // 2] if steps else None
        gap = self.hang.steady_gap()
        text = ("the job's step history (watch): " + (f"steps took {step:.2f} s (median)" if step else "no step time yet")
                + ("; its recent steady no-progress gap (a strict majority, p90) was "
                   f"{gap:.2f} s, now {stall:.1f} s" if gap is not None else f"; no steady gap learned yet, now {stall:.1f} s"))
        ev = Evidence("procfs", text, data={"step_history": {"median_step_s": None if step is None else round(step, 3),
                                                             "steady_gap_s": None if gap is None else round(gap, 3),
                                                             "stall_s": round(stall, 3)}})
        summary = inc.summary.replace(", none moved", ", the job's step history, none moved", 1)
        return replace(inc, summary=summary, evidence=inc.evidence + (ev,))

    def _replay_step(self, now: float) -> list[Event]:
        """Start a replay round when one is due (a new straggler, or --replay-every); keep the last
        finished round's findings as this poll's sdc findings (its stragglers join the straggler round)."""
        if self.replay is None:
            return []
        before = self.replay.last
        found = self.replay.step(now, list(self.book.open.values()))
        if self.replay.last is not before:
            self._replayed = found
        if self.replay.last_error:
            self._notes.append(f"replay round failed: {self.replay.last_error}")
            self.replay.last_error = None
        news: list[Any] = list(self.replay.events)  # checkpoint_written (replay/live.py CheckpointEvent)
        self.replay.events.clear()
        return news + self.book.reconcile([f for f in self._replayed if f.kind == SDC], now, frozenset({SDC}))

    def replay_now(self) -> bool:
        """Start a replay round now (the dashboard's key); False when one runs already or replay is off."""
        return self.replay is not None and self.replay.request("asked for", self.clock())

    # ------------------------------------------------------------------ pieces
    def _fingerprints_disagree(self, job: Job) -> bool:
        """The eBPF fingerprints show one rank calling another collective (op, count, dtype) at a
        position where a strict majority agrees: instant evidence, judged every poll (no stall timer).
        Only the fingerprint rule: "behind while the others wait" needs the stall's time anyway."""
        if not self._collectives:
            return False
        return any(desync.fingerprint_differs(f) for f in desync.analyze(job, list(self._collectives.values())))

    def _remember(self, batch: Sequence[Observation], now: float) -> None:
        self._collectives.update(desync.latest(batch))
        self._obs.extend(batch)
        while self._obs and self._obs[0].time < now - HISTORY_SECONDS:
            self._obs.popleft()

    def _confirm(self) -> list[Incident]:
        """A short stack window, judged by the diagnose rules (with eBPF records of the recent past)."""
        assert self.monitor is not None
        t0 = self.clock()
        obs = self.monitor.collect(CONFIRM_WINDOW, proc_interval=0.25, stack_interval=0.5)
        self._remember(obs, self.clock())
        self.progress.observe(obs, self.clock())
        d = self.monitor.decide([*obs, *(o for o in self._obs if not isinstance(o, (ProcSample, StackSample)))],
                                (t0, self.clock()))
        self.views.from_window(d)
        self._notes = list(d.notes)
        self._last_diagnosis = d
        return [i for i in d.incidents if i.kind in HANG_KINDS]

    def _native_dump(self, mon: Monitor) -> list[StackSample]:
        """Every rank's native stacks, for a bundle (in its thread); counted while it pauses ranks."""
        start = self.clock()
        with self._native_lock:
            self._native_dumps += 1
            self.progress.held(start)
        try:
            return mon.stacks.dump(native=True)
        finally:
            with self._native_lock:
                self._native_dumps -= 1
                self.progress.held(start, self.clock())

    def _on_open(self, inc: Incident) -> tuple[Incident, str | None]:
        """A new incident: save a bundle for hangs, and say where it went."""
        if inc.kind not in HANG_KINDS:
            return inc, None
        assert self.job is not None and self.monitor is not None
        mon, job = self.monitor, self.job
        return self.session.save_bundle(
            inc, lambda state_dir: bundle.save(state_dir, inc, job, self._last_diagnosis, list(self._obs),
                                               native_dump=lambda: self._native_dump(mon)),
            "procfs", self._notes.append)

    def _publish(self) -> None:
        """This poll's snapshot (watch/session.py), with what only one host has: step times and wait
        fractions, the eBPF sequences and lost records, whether the job ended."""
        assert self.job is not None and self.monitor is not None
        self.session.publish(
            self.clock(), self.started, self.job, hang=self.hang, book=self.book, views=self.views,
            probes=self.monitor.probe_status, devices=self._devices, notes=self._notes, pauses=self.progress.pauses(),
            step_times={r: tuple(v) for r, v in self.stragglers.period.items()},
            wait_fractions={r: tuple(1.0 - x for x in v) for r, v in self.stragglers.busy.items()},
            ended=self.ended, seqs=self.progress.seqs(), lost_events=self.monitor.lost_events())


def _poll_rule(job: Job, obs: Sequence[Observation], kind: str) -> list[Incident]:
    """A poll's findings of ``kind``, as its rules return them (consensus/rules.py)."""
    return rules.decide(job, obs, cadence=rules.POLL, kinds={kind}).listed
