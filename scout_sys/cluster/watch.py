"""``watch --cluster``: the whole job live, as a stream of events.

The steady path reads only the agents' heartbeats (a few bytes per rank, no waiting on anyone).
Each agent runs the single-host watch's progress part on its ranks and sends, per rank, how long it
has gone without progress and by which signal (collective sequence numbers, the main thread of a
rank inside a collective, or the stack staying at one place: cluster/beat.py). From there the rule
is ``watch``'s own, not a copy: the strict majority's stall (watch.progress.majority_of, over the
ranks of the agents that report) goes to a :class:`~scout_sys.watch.hang.HangWatch`, which suspects
at stall-after (adaptive as on one host) or on a stopped, gone or missing rank, backs off after a
window that found nothing and reconfirms an open hang. A confirmation is a short window from every
agent and the same whole-job consensus as ``diagnose --cluster``. So the GPU shape (every rank
running, no collective frame) is suspected across hosts exactly as on one host.

Agents that stop reporting, and come back, are events of their own (``agent_lost`` /
``agent_back``): the monitor's faults, never the job's. Their ranks are left out of the majority.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from scout_sys.cluster.client import gc_paused
from scout_sys.cluster.heartbeat import Heartbeat, RankBeat
from scout_sys.consensus.kinds import HANG_KINDS
from scout_sys.errors import BadToken, ScoutError, StoreUnreachable
from scout_sys.model import Diagnosis, Event, Incident
from scout_sys.watch.config import WatchConfig
from scout_sys.watch.hang import CONFIRM_WINDOW, HangWatch, Reading
from scout_sys.watch.incidents import IncidentBook
from scout_sys.watch.progress import majority_of
from scout_sys.watch.session import EngineParts

LOST_AFTER = 5.0  # seconds without a new heartbeat: the agent is lost
RETRY_EVERY = 2.0
DEFAULT_CONFIG = WatchConfig(interval=1.0)  # heartbeats come every second or so: polling faster reads the same


class Client(Protocol):
    def heartbeats(self) -> dict[int, tuple[Heartbeat | None, str]]: ...
    def diagnose(self, window: float) -> tuple[Diagnosis, dict[str, Any]]: ...


@dataclass(frozen=True)
class AgentEvent:
    event: str  # "agent_lost" | "agent_back"
    time: float
    node: int
    host: str
    ranks: tuple[int, ...]
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"event": self.event, "time": round(self.time, 3), "node": self.node, "host": self.host,
                "ranks": list(self.ranks), "detail": self.detail}


@dataclass(frozen=True)
class Seen:
    """A rank as the watch last saw it: its agent (node, host), its beat, and how long ago that
    beat arrived (by this watch's clock: hosts' clocks are never compared)."""

    node: int
    host: str
    beat: RankBeat
    age: float


class ClusterWatcher(EngineParts):
    def __init__(self, connect: Callable[[], Client], config: WatchConfig | None = None, *,
                 clock: Callable[[], float] = time.time, say: Callable[[str], None] = lambda _t: None) -> None:
        """``connect``: a new client of the store (called again after the store was unreachable);
        ``config``: the watch's settings this one reads (interval, stall_after, state_dir), one value
        (None: :data:`DEFAULT_CONFIG`, its interval 1 s)."""
        self.config = config or DEFAULT_CONFIG
        self.connect, self.clock, self.say = connect, clock, say
        self.client: Client | None = None
        self._unreachable = False
        self.hang = HangWatch(self.config.stall_after)
        self.book = IncidentBook()
        self.last: Diagnosis | None = None
        self.cluster: dict[str, Any] = {}
        self._seen: list[tuple[int, Heartbeat, float]] = []  # (node, heartbeat, age) of agents not lost
        self._ranks: dict[int, Seen] | None = None
        self._beats: dict[int, tuple[int, float]] = {}  # node -> (seq, when we saw it change)
        self._lost: set[int] = set()

    @property
    def ranks(self) -> dict[int, Seen]:
        """The observed ranks (of agents not lost) as the last heartbeats describe them (built when
        asked: a poll reads only what the suspicion needs)."""
        if self._ranks is None:
            self._ranks = {b.rank: Seen(node, hb.host, b, age) for node, hb, age in self._seen for b in hb.beats}
        return self._ranks

    def poll(self) -> list[Event | AgentEvent]:
        with gc_paused():  # thousands of heartbeats' small objects: see client.gc_paused
            return self._poll()

    def _poll(self) -> list[Event | AgentEvent]:
        if self.client is None:
            self.client = self.connect()
            if self._unreachable:
                self.say("the store is reachable again: watching")
            self._unreachable = False
        client = self.client
        now = self.clock()
        beats = client.heartbeats()
        events: list[Event | AgentEvent] = list(self._agents(beats, now))
        hang_open = bool(self.book.of_kinds(HANG_KINDS))
        _d, judged = self.hang.round(now, self._reading(beats, now), hang_open=hang_open,
                                     window=lambda: self._window(client))
        if judged is not None:
            unobserved = frozenset(u["rank"] for u in self.cluster.get("not_observed", ()))
            events += self.book.reconcile(judged, self.clock(), None, on_open=self._on_open, unobserved=unobserved)
        return events

    def _on_open(self, inc: Incident) -> tuple[Incident, str | None]:
        """A new incident, as the book will keep and publish it, and its bundle's folder: here as it is,
        none (ClusterSource saves one, as the one-host Watcher does: watch/incidents.py OnOpen)."""
        return inc, None

    def _reading(self, beats: dict[int, tuple[Heartbeat | None, str]], now: float) -> Reading:
        """The heartbeats' reading of the job's progress (watch/hang.py), over the agents not lost."""
        self._seen, missing, settling, dead, finishing = [], False, False, False, False
        stalls: list[tuple[float, str]] = []
        n = 0
        for node, (hb, _) in beats.items():
            if hb is None or node in self._lost:
                continue
            age = max(0.0, now - self._beats[node][1])
            self._seen.append((node, hb, age))
            # a rank's stall goes on while its beat gets older (it has not been seen progressing since),
            # except during a window its agent announced (busy_for): that window's stacks feed its next beat
            older = max(0.0, age - hb.busy_for)
            for _rank, s, signal, gone in hb.stalls():
                stalls.append((s + older, signal))
                dead |= gone
            missing |= bool(hb.missing)
            settling |= hb.settling
            finishing |= hb.finishing()
            n += len(hb.missing)
        self._ranks = None
        stall, signal = majority_of(stalls, n + len(stalls))
        learning = not (missing or settling or self._lost) and all(hb for hb, _ in beats.values())
        return Reading(stall, signal, decisive=missing or dead, learning=learning, finishing=finishing)

    def _window(self, client: Client) -> list[Incident]:
        """A confirmation window from every agent, judged as ``diagnose --cluster`` judges it."""
        self.last, self.cluster = client.diagnose(CONFIRM_WINDOW)
        return list(self.last.incidents)

    def _agents(self, beats: dict[int, tuple[Heartbeat | None, str]], now: float) -> list[AgentEvent]:
        out = []
        for node, (hb, problem) in sorted(beats.items()):
            host = hb.host if hb else "?"
            ranks = tuple(hb.ranks()) if hb else ()
            seq = hb.seq if hb else -1
            old = self._beats.get(node)
            if old is None or seq != old[0]:
                self._beats[node] = (seq, now)
                if node in self._lost and hb is not None:
                    self._lost.discard(node)
                    out.append(AgentEvent("agent_back", now, node, host, ranks))
            elif node not in self._lost and now - old[1] >= LOST_AFTER + (hb.busy_for if hb else 0.0):
                self._lost.add(node)
                out.append(AgentEvent("agent_lost", now, node, host, ranks,
                                      f"no heartbeat for {now - old[1]:.0f} s{'; ' + problem if problem else ''}: "
                                      "its ranks are not observed"))
        return out

    def run(self, on_event: Callable[[Event | AgentEvent], None], stop: threading.Event) -> int:
        """Poll until ``stop``. Returns 1 if an incident was ever opened, else 0."""
        while not stop.is_set():
            t0 = self.clock()
            try:
                events = self.poll()
            except StoreUnreachable as e:
                if not self._unreachable:
                    self.say(f"{e}; retrying every {RETRY_EVERY:g} s")
                self._unreachable, self.client = True, None
                stop.wait(RETRY_EVERY)
                continue
            except BadToken:
                raise
            except ScoutError as e:  # e.g. no agent answered this window: say so, go on
                self.say(str(e))
                stop.wait(RETRY_EVERY)
                continue
            for e in events:
                on_event(e)
            stop.wait(self.hang.poll_wait(self.clock(), t0, self.interval))
        return 1 if self.ever_opened else 0
