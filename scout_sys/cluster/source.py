"""``watch --cluster`` as a dashboard :class:`~scout_sys.tui.source.Source` with the watch's sinks and
evidence bundles.

:class:`ClusterSource` is the :class:`~scout_sys.cluster.watch.ClusterWatcher` (suspicion from the
agents' heartbeats, confirmation windows, the incident book, lost agents) plus what ``watch --job``
gives a person around its events:

- after each poll, a :class:`~scout_sys.model.Snapshot` of the whole job: every rank with the host
  its agent reports (the dashboard groups the grid by it), the state and place from the heartbeats (the
  agent's latest stack sample), the stack from the last confirmation window, a lost agent's ranks
  *unknown* (not observed), and one
  entry per agent (``Snapshot.agents``);
- the sinks (``--prometheus``, ``--on-incident``, ``--events``: scout_sys/exporters) fed every event
  and snapshot, by the session the Watcher uses too (scout_sys/watch/session.py);
- an evidence bundle when a hang-like incident opens (scout_sys/watch/bundle.py's folder and modes):
  the whole-job diagnosis with its ``cluster`` part, each agent's window (its ranks' activities with
  their main-thread stacks, its records, probes) and the heartbeats the suspicion read.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Optional

from scout_sys.cluster import wire
from scout_sys.cluster.answer import Answer
from scout_sys.cluster.client import to_json
from scout_sys.cluster.heartbeat import Heartbeat, RankBeat
from scout_sys.cluster.watch import AgentEvent, Client, ClusterWatcher
from scout_sys.consensus import hardware
from scout_sys.consensus.kinds import HANG_KINDS
from scout_sys.errors import ScoutError, StoreUnreachable
from scout_sys.model import Diagnosis, Event, Incident, Job, ProcSample, Rank, RankView
from scout_sys.model_job import WIRE, job_to_json, layout_fields
from scout_sys.watch import bundle
from scout_sys.watch.config import WatchConfig
from scout_sys.watch.session import Session, Sessioned
from scout_sys.watch.views import Views

WAITING = "waiting for the agents' heartbeats…"
NO_AGENT = "(no agent)"  # the grid's group for ranks no agent reports
Beats = Mapping[int, tuple[Optional[Heartbeat], str]]  # a runtime alias: no ``X | None`` before 3.10


class _Tap:
    """A store client that keeps what the watcher read through it last: the heartbeats, and (from
    :class:`~scout_sys.cluster.client.ClusterClient`) the last window's answers. It is a
    :class:`~scout_sys.cluster.watch.Client` itself: the watcher reaches the client through these
    methods only."""

    def __init__(self, client: Client) -> None:
        self.inner = client
        self.beats: Beats = {}

    def heartbeats(self) -> dict[int, tuple[Heartbeat | None, str]]:
        beats = self.inner.heartbeats()
        self.beats = beats
        return beats

    def diagnose(self, window: float) -> tuple[Diagnosis, dict[str, Any]]:
        return self.inner.diagnose(window)

    @property
    def answers(self) -> Mapping[int, Answer]:
        return getattr(self.inner, "last_answers", {})

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


class ClusterSource(ClusterWatcher, Sessioned):
    """The whole job live: a Source for the dashboard, and the headless loop (``run``) with sinks.
    Its own state is named ``_src_*``, apart from the ClusterWatcher's."""

    # the dashboard's Source members the watcher does not answer otherwise (tui/source.py)
    live = True
    path: str | None = None  # no saved report: live data
    can_replay = False  # replay runs beside one host's ranks (watch --job), not from the store

    def __init__(self, connect: Callable[[], Client], config: WatchConfig | None = None, *, store: str,
                 say: Callable[[str], None] = lambda _t: None, clock: Callable[[], float] = time.time) -> None:
        """``store``: HOST:PORT, for people; ``config`` and ``clock``: ClusterWatcher's; bundles go under
        ``config.state_dir``."""
        self._src_outer_say = say
        self._src_said: deque[str] = deque(maxlen=10)
        super().__init__(lambda: _Tap(connect()), config, say=self._src_say, clock=clock)
        self.store_name = store
        self.session = Session(self.config.state_dir)  # sinks, snapshot, bundles: as for watch --job
        self.started = self.clock()
        self.waiting: str | None = WAITING
        self._src_views = Views()
        self._src_beats: Beats = {}
        self._src_answers: Mapping[int, Answer] = {}
        self._src_down: dict[int, str] = {}  # node -> why its ranks are not observed (agent_lost)
        self._src_hosts: dict[int, str] = {}  # node -> the host it last reported
        self._src_shown: Diagnosis | None = None  # the window the views show
        self._src_devices: dict[int, dict[str, object]] = {}

    def _src_say(self, text: str) -> None:
        self._src_said.append(text)
        self._src_outer_say(text)

    # ------------------------------------------------------------------ one poll
    def poll(self) -> list[Event | AgentEvent]:
        """One poll of the agents; the sinks get its events and the new snapshot (watch/session.py)."""
        return self.session.poll(self._src_poll)

    def _src_poll(self) -> list[Event | AgentEvent]:
        try:
            events = super().poll()
        except StoreUnreachable:
            self.client = None  # the next poll connects again (the dashboard polls without run())
            raise
        tap = self.client
        if isinstance(tap, _Tap):
            self._src_beats = tap.beats
            if self.last is not self._src_shown:
                self._src_answers = tap.answers
        for e in events:
            if isinstance(e, AgentEvent):
                if e.event == "agent_lost":
                    self._src_down[e.node] = e.detail
                else:
                    self._src_down.pop(e.node, None)
        self._src_publish()
        return events

    def diagnose_now(self, window: float = 3.0) -> Diagnosis:
        """A whole-job window now (the dashboard's ``d``); its places and stacks are shown from the next poll."""
        if self.client is None:
            raise ScoutError(f"the store at {self.store_name} is not reachable right now")
        d = self.client.diagnose(window)[0]
        self._src_views.from_window(d)  # never during a poll: the dashboard calls its source from one thread
        return d

    def replay_now(self) -> bool:
        return False  # can_replay: no replay from here

    def interrupt(self) -> None:
        """Nothing to stop: a whole-job window is the agents' (each ends its own at the window's end)."""

    def close(self) -> None:
        close = getattr(self.client, "close", None)
        if close is not None:
            close()
        self.client = None

    # ------------------------------------------------------------------ evidence bundles
    def _on_open(self, inc: Incident) -> tuple[Incident, str | None]:
        """A new hang-like incident: save its bundle (the heartbeats and window answers this poll read),
        and add where it went to the incident."""
        tap = self.client
        if inc.kind not in HANG_KINDS or not isinstance(tap, _Tap):
            return inc, None
        beats, answers = tap.beats, tap.answers
        return self.session.save_bundle(
            inc, lambda state_dir: save_bundle(state_dir, inc, self.last, self.cluster, answers, beats),
            "cluster", self._src_say)

    # ------------------------------------------------------------------ the snapshot
    def _src_publish(self) -> None:
        now = self.clock()
        d = self.last
        if d is not None and d is not self._src_shown:  # a new window: its places and stacks
            self._src_shown = d
            self._src_views.from_window(d)
            self._src_devices = {r: s.to_json() for a in self._src_answers.values()
                                 for r, s in hardware.latest(a.records).items()} or self._src_devices
        up = {n: hb for n, (hb, _) in self._src_beats.items() if hb is not None and n not in self._src_down}
        for n, (hb, _) in self._src_beats.items():
            if hb is not None:
                self._src_hosts[n] = hb.host
        entries = {n: hb.beats for n, (hb, _) in self._src_beats.items() if hb is not None}
        procs = [ProcSample(time=now, rank=b.rank, pid=b.pid or 0, status=b.state, main_last_ran=now - b.pause)
                 for n in up for b in entries[n]]
        if self.book.of_kinds(HANG_KINDS):  # while a hang is open its window's views stand (witnesses "waiting")
            procs = [p for p in procs if p.rank not in self._src_views.views]
        self._src_views.from_procs(procs, now)
        fresh = {p.rank for p in procs}
        for b in (b for n in up for b in entries[n] if b.where and b.rank in fresh):  # the agents' latest samples
            self._src_views.views[b.rank] = replace(self._src_views.views[b.rank], where=b.where)
        job = self._src_job(entries, d)
        unseen = set(job.remote) | {r for r in range(job.world_size) if r not in job.by_rank()
                                    and r not in job.missing}
        for r in unseen:  # a lost or silent agent's ranks (and ranks no agent reports): not observed
            old = self._src_views.views.get(r)
            self._src_views.views[r] = RankView(rank=r, state="unknown", where=old.where if old else "",
                                                stack=old.stack if old else ())
        if self._src_beats and any(hb is not None for hb, _ in self._src_beats.values()):
            self.waiting = None
        elif self.snapshot is None:
            return
        self.session.publish(now, self.started, job, hang=self.hang, book=self.book, views=self._src_views,
                             probes=d.probes if d is not None else {}, devices=self._src_devices,
                             notes=[*(d.notes if d is not None else ()), *self._src_said],
                             pauses={b.rank: b.pause for n in up for b in entries[n]}, agents=tuple(self._src_agents()))

    def _src_unanswered(self, d: Diagnosis | None) -> set[int]:
        """Ranks the last window could not see (their agent did not answer), until that agent reports
        again: the heartbeat it left behind says nothing of them now."""
        if d is None:
            return set()
        out = set()
        for u in self.cluster.get("not_observed", ()):
            hb = self._src_beats.get(u.get("node"), (None, ""))[0] if u.get("node") is not None else None
            if hb is None or hb.time <= d.time:
                out.add(int(u["rank"]))
        return out

    def _src_job(self, entries: Mapping[int, tuple[RankBeat, ...]], d: Diagnosis | None) -> Job:
        """Every rank an agent reports, with that agent's host (the last window's Rank when it is the same
        process: devices, coordinates), and the last window's peer groups."""
        known = d.job.by_rank() if d is not None else {}
        ranks: dict[int, Rank] = {}
        ws = 0
        for n, hb in sorted((n, hb) for n, (hb, _) in self._src_beats.items() if hb is not None):
            ws = max(ws, hb.world_size or 0)
            for b in entries[n]:
                k = known.get(b.rank)
                ranks[b.rank] = k if k is not None and k.pid == b.pid else Rank(
                    rank=b.rank, pid=b.pid or 0, host=self._src_hosts[n], group_rank=n)
        missing = tuple(m for m in (d.job.missing if d is not None else ()) if m not in ranks)
        remote = {b.rank for n in self._src_down for b in entries.get(n, ())}
        remote |= self._src_unanswered(d)
        lost = len(self._src_down)
        return Job(ranks=tuple(ranks[r] for r in sorted(ranks)),
                   world_size=max(ws, d.job.world_size if d is not None else 0, max(ranks, default=-1) + 1),
                   launcher=f"{len(self._src_beats)} agents via {self.store_name}" + (f", {lost} lost" if lost else ""),
                   launcher_pid=None, host=NO_AGENT, missing=missing,
                   remote=tuple(sorted(remote)), missing_hosts=d.job.missing_hosts if d is not None else (),
                   **layout_fields(d.job if d is not None else None))

    def _src_agents(self) -> list[dict[str, Any]]:
        out = []
        for n, (hb, problem) in sorted(self._src_beats.items()):
            state = "lost" if n in self._src_down else "up" if hb is not None else "never reported"
            out.append({"node": n, "host": self._src_hosts.get(n, "?"), "state": state,
                        "ranks": [b.rank for b in hb.beats] if hb else [],
                        "detail": self._src_down.get(n) or problem})
        return out


# ---------------------------------------------------------------------- the bundle


def save_bundle(state_dir: str, inc: Incident, d: Diagnosis | None, cluster: Mapping[str, Any],
                answers: Mapping[int, Answer], beats: Beats) -> str:
    """A cluster incident's bundle; returns its folder. Raises OSError.

    ``diagnosis.json``: the whole-job diagnosis (``scout-sys/diagnosis/v1`` with its ``cluster`` part)
    and the incident; ``agent-<node>.json``: that agent's window (host, window, probes, its ranks'
    activities with their main-thread stacks, its records); ``heartbeats.json``: what the suspicion read.
    """
    path = bundle.new_folder(state_dir, inc)
    diag = to_json(d, dict(cluster)) if d is not None else {}
    diag["incident"] = inc.to_json()
    bundle.write_json(os.path.join(path, "diagnosis.json"), diag)
    for n, a in sorted(answers.items()):
        bundle.write_json(os.path.join(path, f"agent-{n}.json"), {
            "node": n, "host": a.host, "error": a.error, "window": list(a.window), "probes": dict(a.probes),
            "notes": list(a.notes), "job": job_to_json(a.job, WIRE) if a.job is not None else None,
            "ranks": {str(r): wire.activity_to_json(act) for r, act in sorted(a.acts.items())},
            "records": [wire.record_to_json(o) for o in a.records]})
    bundle.write_json(os.path.join(path, "heartbeats.json"),
                      {str(n): {"heartbeat": (dict(hb.body) if hb else {}) or None,
                                "problem": p} for n, (hb, p) in sorted(beats.items())})
    return path


__all__ = ["NO_AGENT", "WAITING", "ClusterSource", "save_bundle"]
