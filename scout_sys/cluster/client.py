"""``diagnose --cluster``: ask every agent for a window, decide over the whole job.

The client checks the run record with its token first — a wrong token is refused right there, in
one line — then posts one sealed window request and collects the sealed answers until every agent
answered or the deadline (the window plus :data:`ANSWER_GRACE`) passed. Every store exchange has its
own timeout (:data:`~scout_sys.cluster.store.EXCHANGE_TIMEOUT`), shorter than that deadline. Answers
that do not verify are ignored and reported; agents that do not answer leave their ranks *not
observed*.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from scout_sys.cluster import answer, heartbeat, wire
from scout_sys.cluster.heartbeat import Heartbeat
from scout_sys.cluster.merge import ANSWERED, AgentState, Answer, decide
from scout_sys.cluster.store import Store
from scout_sys.errors import BadToken, ScoutError
from scout_sys.model import Diagnosis

ANSWER_GRACE = 4.0  # seconds beyond the window for agents to notice the request, sample and answer


class ClusterClient:
    def __init__(self, addr: tuple[str, int], token: bytes, *, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.source = f"{addr[0]}:{addr[1]}"
        self.token, self.clock, self.sleep = token, clock, sleep
        self.store = Store(*addr)
        raw = self.store.get(wire.RUN)
        if raw is None:
            raise ScoutError(f"no scout-sys run at {self.source} (the store answers, but no agent of node rank 0 "
                             "has published a run record)")
        try:
            run = wire.unseal(token, wire.RUN, raw)
        except wire.Forged:
            raise BadToken(f"token refused: the run at {self.source} is not signed with the token of --token-file "
                           "(wrong token, or another job's store)") from None
        self.nonce: str = run["nonce"]
        self.nnodes = int(run.get("nnodes", 1))
        self.last_answers: dict[int, Answer] = {}  # the last window's verified answers (evidence bundles)

    def heartbeats(self) -> dict[int, tuple[Heartbeat | None, str]]:
        """node -> (its last verified heartbeat or None, what is wrong with it or "")."""
        out: dict[int, tuple[Heartbeat | None, str]] = {}
        for node in range(self.nnodes):
            key = wire.hb_key(node)
            raw = self.store.get(key)
            if raw is None:
                out[node] = (None, "never reported")
                continue
            try:
                out[node] = (heartbeat.decode(wire.unseal(self.token, key, raw, self.nonce)), "")
            except wire.Stale:
                out[node] = (None, "not reported since the leader restarted")
            except wire.Forged as e:
                out[node] = (None, f"forged heartbeat ignored ({e})")
        return out

    def diagnose(self, window: float) -> tuple[Diagnosis, dict[str, Any]]:
        with gc_paused():
            return self._diagnose(window)

    def _diagnose(self, window: float) -> tuple[Diagnosis, dict[str, Any]]:
        beats = self.heartbeats()
        rid = self.store.add(wire.REQS, 1)
        key = wire.req_key(rid)
        self.store.set(key, wire.seal(self.token, key, self.nonce, {"id": rid, "window": window,
                                                                    "time": self.clock()}))
        deadline = self.clock() + window + ANSWER_GRACE
        answers: dict[int, Answer] = {}
        problems: dict[int, tuple[str, str]] = {}
        ignored: dict[str, None] = {}  # every forged value seen, reported even when the real one followed
        while len(answers) < self.nnodes and self.clock() < deadline:
            for node in range(self.nnodes):
                if node in answers:
                    continue
                akey = wire.answer_key(rid, node)
                raw = self.store.get(akey)
                if raw is None:
                    continue
                try:
                    answers[node] = answer.decode(wire.unseal(self.token, akey, raw, self.nonce), node)
                    problems.pop(node, None)
                except wire.Forged as e:  # keep waiting: the real agent may still answer
                    problems[node] = ("forged", f"an answer that does not verify was ignored ({e})")
                    ignored[f"ignored a forged answer for node {node} ({e})"] = None
                except wire.Stale:
                    problems[node] = ("stale", "an answer of another run was ignored")
            self.sleep(0.1)
        states = []
        ws = 0
        for node in range(self.nnodes):
            hb, hb_problem = beats[node]
            host = (answers[node].host if node in answers else hb.host if hb else None) or "?"
            ranks = tuple(hb.ranks()) if hb else ()
            ws = max(ws, (hb.world_size or 0) if hb else 0)
            a = answers.get(node)
            if a is not None and a.error is None:
                states.append(AgentState(node, host, ANSWERED, ranks=tuple(sorted(a.acts))))
            elif a is not None:
                states.append(AgentState(node, host, "error", a.error or "", ranks))
            else:
                state, detail = problems.get(node, ("no answer", f"no answer within {window + ANSWER_GRACE:g} s"))
                if hb is not None:
                    detail += f"; last heartbeat {max(0.0, self.clock() - hb.time):.0f} s ago"
                elif hb_problem:
                    detail += f"; {hb_problem}"
                states.append(AgentState(node, host, state, detail, ranks))
        self.last_answers = answers
        for k in [key, *(wire.answer_key(rid, n) for n in answers)]:
            self.store.delete(k)  # the store holds only what is in flight
        if not any(s.state == ANSWERED for s in states):
            raise ScoutError(f"no agent answered within {window + ANSWER_GRACE:g} s: "
                             + "; ".join(f"node {s.node} ({s.host}) {s.state}: {s.detail}" for s in states))
        ignored.update({f"node {n}: {p}": None for n, (_, p) in beats.items() if p.startswith("forged")})
        d, cluster = decide(list(answers.values()), states, world_size=ws, source=self.source, now=self.clock())
        cluster["ignored"] = list(ignored)
        return replace(d, notes=d.notes + tuple(ignored)), cluster

    def close(self) -> None:
        self.store.close()


@contextmanager
def gc_paused() -> Iterator[None]:
    """Decoding many agents' answers makes millions of small objects and no cyclic garbage; the
    cyclic collector's passes over them were a third of the decoding time at 64k ranks. It is paused
    while a verdict is made, and resumes after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def to_json(d: Diagnosis, cluster: dict[str, Any]) -> dict[str, Any]:
    """``scout-sys/diagnosis/v1`` of the whole job, with the agents' part under ``"cluster"``."""
    return {**d.to_json(), "cluster": cluster}
