"""``watch --cluster``: the whole job live, as a stream of events.

The steady path reads only the agents' heartbeats (a few bytes per rank, no waiting on anyone). A
hang is *suspected* when a strict majority of the observed ranks' main threads has not run for
``stall_after`` seconds, or a rank is stopped or gone; it is *confirmed* by a short window from every
agent and the same whole-job consensus as ``diagnose --cluster``. While a hang stays open it is
confirmed again every few seconds; it closes after two confirmations without it. ``stall_after``
adapts as in ``watch``: four times the longest pause the majority made while healthy, at least 5 s.

Agents that stop reporting, and come back, are events of their own (``agent_lost`` /
``agent_back``): the monitor's faults, never the job's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from scout_sys.errors import BadToken, ScoutError, StoreUnreachable
from scout_sys.model import Diagnosis, Event
from scout_sys.watch.incidents import IncidentBook

MIN_STALL_AFTER = 5.0
CONFIRM_WINDOW = 1.0
RECONFIRM_EVERY = 5.0
LOST_AFTER = 5.0  # seconds without a new heartbeat: the agent is lost
RETRY_EVERY = 2.0


class Client(Protocol):
    def heartbeats(self) -> dict[int, tuple[dict[str, Any] | None, str]]: ...
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


class ClusterWatcher:
    def __init__(self, connect: Callable[[], Client], *, stall_after: float | None = None, interval: float = 1.0,
                 clock: Callable[[], float] = time.time, say: Callable[[str], None] = lambda _t: None) -> None:
        """``connect``: a new client of the store (called again after the store was unreachable)."""
        self.connect, self.clock, self.interval, self.say = connect, clock, interval, say
        self.client: Client | None = None
        self._unreachable = False
        self.fixed_stall_after = stall_after
        self.book = IncidentBook()
        self.last: Diagnosis | None = None
        self.cluster: dict[str, Any] = {}
        self._healthy_pause = 0.0
        self._pause = 0.0
        self._last_confirm = 0.0
        self._beats: dict[int, tuple[int, float]] = {}  # node -> (seq, when we saw it change)
        self._lost: set[int] = set()

    @property
    def stall_after(self) -> float:
        if self.fixed_stall_after is not None:
            return self.fixed_stall_after
        return max(MIN_STALL_AFTER, 4.0 * self._healthy_pause)

    def poll(self) -> list[Event | AgentEvent]:
        if self.client is None:
            self.client = self.connect()
            if self._unreachable:
                self.say("the store is reachable again: watching")
            self._unreachable = False
        client = self.client
        now = self.clock()
        beats = client.heartbeats()
        events: list[Event | AgentEvent] = list(self._agents(beats, now))
        ranks = [r for node, (hb, _) in beats.items() if hb and node not in self._lost for r in hb.get("ranks", ())]
        pauses = sorted(float(r.get("p", 0.0)) for r in ranks)
        k = len(pauses) // 2 + 1
        pause = pauses[-k] if pauses else 0.0
        decisive = any(r.get("s") in ("stopped", "tracing-stop", "zombie", "gone", "disk-sleep") for r in ranks)
        suspect = bool(pauses) and (pause >= self.stall_after or decisive)
        if not suspect and pause < self._pause and not self.book.open:
            self._healthy_pause = max(self._healthy_pause, self._pause)  # the majority ran again: learn it
        self._pause = pause
        since = now - self._last_confirm
        # while a hang is open, progress in the heartbeats brings the next confirmation forward
        if (suspect and not self.book.open and since >= RECONFIRM_EVERY) or (self.book.open and since >= (CONFIRM_WINDOW if not suspect
                                                                              else RECONFIRM_EVERY)):
            self._last_confirm = now
            self.last, self.cluster = client.diagnose(CONFIRM_WINDOW)
            unobserved = frozenset(u["rank"] for u in self.cluster.get("not_observed", ()))
            events += self.book.reconcile(list(self.last.incidents), self.clock(), None, unobserved=unobserved)
        return events

    def _agents(self, beats: dict[int, tuple[dict[str, Any] | None, str]], now: float) -> list[AgentEvent]:
        out = []
        for node, (hb, problem) in sorted(beats.items()):
            host = (hb or {}).get("host", "?")
            ranks = tuple(int(r["r"]) for r in (hb or {}).get("ranks", ()))
            seq = int(hb["seq"]) if hb else -1
            old = self._beats.get(node)
            if old is None or seq != old[0]:
                self._beats[node] = (seq, now)
                if node in self._lost and hb is not None:
                    self._lost.discard(node)
                    out.append(AgentEvent("agent_back", now, node, host, ranks))
            elif node not in self._lost and now - old[1] >= LOST_AFTER + float((hb or {}).get("busy_for") or 0.0):
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
            stop.wait(max(0.0, self.interval - (self.clock() - t0)))
        return 1 if self.book.ever_opened else 0
