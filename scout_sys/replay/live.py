"""Replay in the live loop (for ``watch``): a part that takes the open incidents and ``now`` and
returns findings, as the other parts of the loop do.

- When a ``straggler`` incident from the job's own signals (procfs / eBPF) is open and its ranks
  were not replayed since, it starts a replay session in the background, to tell a slow device
  (replay names the same device ``straggler``, source ``replay``) from a slow network, input
  pipeline or collective (every device runs the kernels at the same speed).
- Every ``every`` seconds (``--replay-every``; off by default) it starts one too.
- With ``checkpoints=True`` (watch's default, off with ``--no-replay``) it looks every few seconds
  for checkpoint files the ranks write (``replay/spy.py``), reports each once
  (:class:`CheckpointEvent`, ``checkpoint_written``), and after each one runs one round (``covers``
  it in the ledger: the round lies in the interval before the next checkpoint, which certify asks
  for), at the workers' low priority, with a bounded duty cycle (``DUTY``: the time between two
  checkpoint rounds is at least the last round's duration / DUTY), skipped and said so when the host
  is busy (load average over ``BUSY_LOAD`` per CPU).
- One session at a time, in a thread; the loop never waits for it. ``step()`` returns the
  findings of a finished session once: the replay's incidents (``sdc``, ``straggler``); the rounds
  of the last sessions stay (``recent``), and :meth:`ReplayPart.explain` tells by them whether a
  straggler from the job's signals has a slow device or one as fast as its peers'.

Wiring into the Watcher (a few lines): build ``ReplayPart(job, every=..., state_dir=...)`` at bind
time; in ``poll()`` call ``part.step(now, open_incidents)`` and reconcile what it returns like
other findings; ``part.close()`` in ``close()``.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from scout_sys.consensus import replay as replay_rules
from scout_sys.model import ATTRIBUTED, SDC, STRAGGLER, DeviceRound, Evidence, Incident, Job
from scout_sys.replay import ledger
from scout_sys.replay.runner import ReplayCancelled, ReplayResult, run_rounds
from scout_sys.replay.spy import CheckpointSpy

Runner = Callable[..., ReplayResult]
DUTY = 0.2  # at most this share of the wall clock in checkpoint rounds
BUSY_LOAD = 6.0  # 1-minute load average per CPU above which a checkpoint round is skipped (workers are niced)
SPY_EVERY = 2.0  # seconds between two looks for checkpoint files
SETTLE = 1.0  # a file modified less than this long ago may still be being written
RECENT = 2 * replay_rules.CONFIRM  # replay rounds kept, over sessions, to explain a straggler by
# A checkpoint's coverage as it is written, from the rounds of this job since the previous one (what
# certify will find in the ledger; certify also reads the content and other jobs' sdc on its GPUs).
COVERED, NOT_COVERED = "covered", "not covered"
COVERAGE = {
    COVERED: "covered (a clean replay round since the previous checkpoint; certify checks its content)",
    NOT_COVERED: "not covered (no clean replay round since the previous checkpoint: unverified)",
    ledger.SDC: "after an sdc replay round since the previous checkpoint: do not restart from it",
    ledger.INCONCLUSIVE: "after an inconclusive replay round since the previous checkpoint: rejected",
}


@dataclass(frozen=True)
class CheckpointEvent:
    """``checkpoint_written``: the watched job wrote a checkpoint (docs/json.md)."""

    event: str
    time: float
    path: str
    written: float
    replay: str  # what coverage does about it: "round started", "skipped: ...", "waiting: ..."
    coverage: str = NOT_COVERED  # what the rounds since the previous checkpoint say of it (COVERAGE)
    job: str | None = None  # which job, when one watch follows several (watch --every-job)

    def to_json(self) -> dict[str, Any]:
        out = {"event": self.event, "time": round(self.time, 3), "path": self.path,
               "written": round(self.written, 3), "coverage": self.coverage, "replay": self.replay}
        return out if self.job is None else {**out, "job": self.job}

    def text(self) -> str:
        return f"checkpoint {self.path} written, {COVERAGE[self.coverage]}; replay: {self.replay}"


class ReplayPart:
    def __init__(self, job: Job, *, every: float | None = None, rounds: int = 2, state_dir: str | None = None,
                 runner: Runner = run_rounds, started: float = 0.0, checkpoints: bool = False,
                 load: Callable[[], float] | None = None, **kw: Any) -> None:
        self.job = job
        self.every = every
        self.rounds = rounds
        self.state_dir = state_dir
        self.runner = runner  # run_rounds; injectable so the scheduling is testable on a fake clock
        self.kw = kw
        self._next = started + every if every else None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._done: tuple[str, tuple[int, ...], ReplayResult | None, str | None] | None = None
        self._replayed: set[tuple[int, ...]] = set()  # straggler ranks already replayed for
        self.last: ReplayResult | None = None
        # the last rounds of every session (a checkpoint's one round, a straggler's two), oldest first
        self.recent: deque[tuple[DeviceRound, ...]] = deque(maxlen=RECENT)
        self.last_error: str | None = None
        self.running_since: float | None = None
        self.spy = CheckpointSpy([r.pid for r in job.ranks], started) if checkpoints else None
        self._next_spy = started
        self._load = load or _load_per_cpu
        self._pending: tuple[str, float] | None = None  # the newest checkpoint no round followed yet
        self._last_round: tuple[float, float] = (float("-inf"), 0.0)  # (end, duration) of the last session
        self.events: list[CheckpointEvent] = []  # checkpoint_written events, taken by the watch
        self.skipped = 0
        self._ident: dict[str, Any] | None = None
        # (session end, round result) of the recent rounds, and per folder when its newest checkpoint was
        # written: a checkpoint's coverage is the rounds since the previous one in its folder, as certify
        # reads it (the newest older sibling); another folder's file (a scratch file) takes none of them
        self._rounds: deque[tuple[float, str]] = deque(maxlen=256)
        self._newest: dict[str, float] = {}
        self._ended_wall = 0.0  # when the last session ended (unix s)

    def ident(self) -> dict[str, Any]:
        """The job's identity for the ledger, with the folders it was seen writing checkpoints in
        (read from /proc once, while the job runs: the same key on every line, its end included)."""
        if self._ident is None:
            self._ident = ledger.identity(self.job)
        dirs = sorted(os.path.abspath(d) for d in self.spy.dirs) if self.spy else []
        return {**self._ident, "checkpoint_dirs": dirs}

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def request(self, reason: str, now: float, ranks: tuple[int, ...] = (), *, rounds: int | None = None,
                covers: str | None = None) -> bool:
        """Start a session now unless one runs. Returns whether one started (the dashboard's key)."""
        if self.running:
            return False
        self._stop.clear()
        self.running_since = now
        kw = dict(self.kw)
        if self.runner is run_rounds:
            kw.update(ident=self.ident(), covers=covers)
        n = rounds or self.rounds

        def work() -> None:
            t0 = time.monotonic()
            try:
                res = self.runner(self.job, n, state_dir=self.state_dir, stop=self._stop, **kw)
                self._ended_wall = time.time()
                self._done = (reason, ranks, res, None)
            except ReplayCancelled:
                self._done = None
            except Exception as e:  # noqa: BLE001 - a failed session is reported, the loop goes on
                self._done = (reason, ranks, None, str(e) or type(e).__name__)
            self._last_round = (time.monotonic(), time.monotonic() - t0)

        self._thread = threading.Thread(target=work, name="replay", daemon=True)
        self._thread.start()
        return True

    def step(self, now: float, incidents: Sequence[Incident]) -> list[Incident]:
        """The findings of a session that finished since the last call; then start what is due."""
        out: list[Incident] = []
        if self._done is not None and not self.running:
            reason, _ranks, res, err = self._done
            self._done = None
            self.running_since = None
            if res is None:
                self.last_error = err
            else:
                self.last, self.last_error = res, None
                self.recent.extend(res.rounds)
                ends = res.ended or (self._ended_wall,) * len(res.rounds)  # the ledger's times
                self._rounds.extend((end, ledger.result_of(self.job, rnd, dv)[1])
                                    for end, rnd, dv in zip(ends, res.rounds, res.digests))
                note = Evidence("replay", f"replay round started for: {reason}")
                out = [replace(i, evidence=i.evidence + (note,)) for i in res.diagnosis.incidents
                       if i.kind in (SDC, STRAGGLER)]
        for inc in incidents:
            if inc.kind == STRAGGLER and inc.status == ATTRIBUTED and not replay_rules.from_replay(inc) \
                    and inc.ranks not in self._replayed and not self.running and self._done is None:
                self._replayed.add(inc.ranks)
                self.request(f"straggler rank(s) {','.join(map(str, inc.ranks))}", now, inc.ranks)
        if self._next is not None and now >= self._next and self._done is None:
            self._next = now + (self.every or 0.0)
            self.request("periodic", now)
        self._coverage(now)
        return out

    def _coverage(self, now: float) -> None:
        """Look for new checkpoints; after each, one round (duty cycle, host load permitting)."""
        if self.spy is None:
            return
        if now >= self._next_spy:
            self._next_spy = now + SPY_EVERY
            wall = time.time()
            for path, t in sorted(self.spy.scan(settled=wall - SETTLE), key=lambda pt: pt[1]):
                self._pending = (path, t)
                self._note(ledger.CHECKPOINT, t, seen=round(wall, 3), checkpoint=os.path.abspath(path))
                self.events.append(CheckpointEvent("checkpoint_written", now, path, t, self._plan(), self._coverage_of(path, t)))
        if self._pending is None or self.running or self._done is not None:
            return
        why = self._plan()
        if why == "round started" and self.request(f"checkpoint {self._pending[0]}", now, rounds=1,
                                                   covers=self._pending[0]):
            self._pending = None
        elif why.startswith("skipped"):
            self.skipped += 1
            self._pending = None  # said so in its event; the next checkpoint gets the next chance

    def _coverage_of(self, path: str, t: float) -> str:
        """The coverage of checkpoint ``path`` written at ``t``, from the rounds that ended after the
        previous checkpoint in its folder and before it."""
        folder = os.path.dirname(os.path.abspath(path))
        prev = self._newest.get(folder, float("-inf"))
        self._newest[folder] = max(prev, t)
        since = [r for end, r in self._rounds if prev < end <= t]
        for bad in (ledger.SDC, ledger.INCONCLUSIVE):
            if bad in since:
                return bad
        return COVERED if ledger.CLEAN in since else NOT_COVERED

    def _plan(self) -> str:
        end, took = self._last_round
        wait = took / DUTY - took - (time.monotonic() - end)
        if self.running:
            return "waiting: a replay round runs"
        if wait > 0:
            return f"waiting: duty cycle ({wait:.0f} s)"
        load = self._load()
        if load > BUSY_LOAD:
            return f"skipped: host busy (load {load:.1f} per CPU)"
        return "round started"

    def explain(self, inc: Incident) -> Incident:
        """A straggler from the job's signals, with what the recent replay rounds say of its device
        (consensus/replay.py :func:`~scout_sys.consensus.replay.explain_straggler`)."""
        return replay_rules.explain_straggler(inc, self.recent)

    def _note(self, event: str, t: float, **fields: Any) -> None:
        """A line of what the watch saw in the ledger (coverage on): which checkpoints the job wrote,
        and until when it ran, so that certify matches a checkpoint to the job that wrote it."""
        if self.spy is None or not self.state_dir:
            return
        try:
            ledger.note(self.state_dir, self.ident(), event, t, **fields)
        except OSError as e:
            self.last_error = f"cannot write the replay ledger: {e}"

    def close(self) -> None:
        """Stop a running session (its workers are gone when this returns); say in the ledger until
        when the job was seen, and whether it still runs."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._ident is not None or (self.spy is not None and self.spy.seen):
            self._note(ledger.SEEN, time.time(), alive=ledger.alive(self.ident()))


def _load_per_cpu() -> float:
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return 0.0
