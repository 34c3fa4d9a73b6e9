"""Who waits for whom: the wait-for graph over the job's process groups, and where its chains end.

A rank waiting in a collective of process group G (its global members) waits for the members of G
that are not in that collective. Those are either waiting themselves, in a collective of another
group (the chain goes on through them), or they wait for no one — the chain ends there:

- stuck outside every collective (``idle``, ``busy``, ``unknown``), ``stopped`` / ``disk-sleep``,
  ``exited``: an **origin**;
- waiting in *another* collective of the same group G: a **desync** origin when G's strict
  majority (of members waiting in G) agrees on the collective and it is in the minority.
  Point-to-point waits (send / recv, a pipeline schedule's batch) are never desync origins nor
  votes: stages legitimately wait at different calls of one pipeline group;
- not observed on this host (``elsewhere``): the chain runs elsewhere; nothing beyond it is named;
- ``running`` (its stack moves): a pause, not a hang.

Attributed only when every chain ends at an origin on this host (the chains agree), the waiting
ranks are a strict majority of the ranks observed, and every group of three or more members that
holds an origin and in which ranks wait confirms it: a strict majority of its members waits in its
collective (:mod:`consensus.c3`). Otherwise inconclusive, with the graph as evidence.

The edges are kept as bundles — (group, collective): its waiters → the members they await — so a
group of 65,536 ranks costs 65,536 entries, not their square. Pure: no I/O, no clocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from scout_sys.consensus import c3
from scout_sys.text import ranks_text

ATTRIBUTED = c3.ATTRIBUTED
INCONCLUSIVE = c3.INCONCLUSIVE
NONE = "none"  # no rank waits in a known group: the graph has nothing to say

ORIGIN_STATES = frozenset({"idle", "busy", "unknown", "stopped", "disk-sleep", "exited"})
DESYNC_STATE = "desync"  # an origin that waits in another collective of the same group

# how a chain ends, when not at an origin
ELSEWHERE, PROGRESS, NO_GROUP, COMMON, TIE = "elsewhere", "progress", "no-group", "common", "tie"
_WHY = {
    ELSEWHERE: "a rank not observed on this host",
    PROGRESS: "a rank that is still progressing (a pause, not a hang)",
    NO_GROUP: "a waiting rank whose process group is not known",
    COMMON: "a group whose members all wait in one collective (the origin is outside it)",
    TIE: "a group whose members wait in different collectives with no strict majority",
}
MAX_CHAINS = 8  # representative chains kept for people


@dataclass(frozen=True)
class Wait:
    """One rank's place: its state (``consensus.hang`` states) and, when waiting, where."""

    rank: int
    state: str
    group: int | None = None  # index into the groups: the process group it waits in
    collective: str = ""  # what it waits in (comparable across ranks: op and call site)
    p2p: bool = False  # a point-to-point wait (send / recv between pipeline stages)


@dataclass(frozen=True)
class Edge:
    """Every rank of ``waiters`` waits in ``collective`` of ``members`` for every rank of ``awaited``."""

    group: int
    members: tuple[int, ...]
    collective: str
    waiters: tuple[int, ...]
    awaited: tuple[int, ...]

    def to_json(self, limit: int = 64) -> dict[str, Any]:
        out: dict[str, Any] = {"group": list(self.members[:limit]), "collective": self.collective,
                               "waiters": list(self.waiters[:limit]), "awaited": list(self.awaited[:limit])}
        for k, v in (("group", self.members), ("waiters", self.waiters), ("awaited", self.awaited)):
            if len(v) > limit:
                out[f"{k}_size"] = len(v)
        return out


@dataclass(frozen=True)
class Graph:
    status: str  # attributed | inconclusive | none
    edges: tuple[Edge, ...] = ()
    origins: tuple[int, ...] = ()  # where every chain ends (attributed), else candidates seen
    kinds: Mapping[int, str] = field(default_factory=dict)  # origin -> its state ("desync" for desync)
    chains: tuple[tuple[int, ...], ...] = ()  # representative chains, waiter first, origin last
    reason: str = ""  # why inconclusive (or ""), for people
    ends: frozenset[str] = frozenset()  # how chains end when not at an origin (ELSEWHERE, PROGRESS, ...)

    @property
    def pause(self) -> bool:
        """Nobody is named and every chain ends at a progressing rank: a pause, not a hang."""
        return self.status == NONE and self.ends == {PROGRESS}

    def edges_json(self, limit: int = 256) -> list[dict[str, Any]]:
        return [e.to_json() for e in self.edges[:limit]]

    def edge_of(self, waiter: int) -> Edge | None:
        for e in self.edges:
            if waiter in e.waiters:
                return e
        return None


def analyze(waits: Mapping[int, Wait], groups: Sequence[Sequence[int]]) -> Graph:
    """The wait-for graph of ``waits`` (every rank observed on this host; any other rank is
    elsewhere) over ``groups`` (process groups as sorted global members), and its verdict."""
    # 1. Bundles: (group, collective) -> waiters.
    by_key: dict[tuple[int, str], list[int]] = {}
    no_group: list[int] = []
    p2p: set[tuple[int, str]] = set()
    for r, w in waits.items():
        if w.state != "waiting":
            continue
        if w.group is None or not 0 <= w.group < len(groups):
            no_group.append(r)
        else:
            by_key.setdefault((w.group, w.collective), []).append(r)
            if w.p2p:
                p2p.add((w.group, w.collective))
    if not by_key:
        return Graph(NONE)

    # 2. Another collective of the same group: C3 among the members waiting in the group's
    #    collectives. A point-to-point wait awaits its neighbour stage, whatever the others call.
    per_group: dict[int, list[tuple[str, list[int]]]] = {}
    if len({g for g, _ in by_key}) < len(by_key):  # some group has waiters in two collectives
        for (g, c), rs in by_key.items():
            if (g, c) not in p2p:
                per_group.setdefault(g, []).append((c, rs))
    desync: dict[int, str] = {}  # rank -> DESYNC_STATE | TIE
    for entries in per_group.values():
        if len(entries) < 2:
            continue
        v = c3.vote({r: c for c, rs in entries for r in rs})
        for c, rs in entries:
            if not v.attributed:
                desync.update((r, TIE) for r in rs)
            elif c != v.signature:
                desync.update((r, DESYNC_STATE) for r in rs)

    # 3. Edges.
    edges: list[Edge] = []
    bundle_of: dict[int, int] = {}
    for (g, c), rs in sorted(by_key.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        if desync.get(rs[0]) is not None:
            continue  # a desync origin (or a tie) ends chains; it follows none
        inside = set(rs)
        members = tuple(groups[g])
        awaited = tuple(m for m in members if m not in inside)
        bundle_of.update((r, len(edges)) for r in rs)
        edges.append(Edge(g, members, c, tuple(sorted(rs)), awaited))

    def end(r: int) -> str | None:
        """How a chain ends at ``r`` (None: it goes on through r's own edge)."""
        if r in bundle_of:
            return None
        w = waits.get(r)
        if w is None or w.state == "elsewhere":
            return ELSEWHERE
        if r in desync:
            return desync[r]
        if w.state == "waiting":
            return NO_GROUP
        if w.state in ORIGIN_STATES:
            return w.state
        return PROGRESS

    # 4. Per bundle, where its chains end: an iterative Tarjan over bundles (successors first).
    succ: list[list[int]] = []
    ends: list[set[int]] = []  # origin ranks reached directly
    bad: list[set[str]] = []
    origin_like = ORIGIN_STATES | {DESYNC_STATE}
    for e in edges:
        nxt = {bundle_of[m] for m in e.awaited if m in bundle_of}
        succ.append(list(nxt))
        direct: set[int] = set()
        why: set[str] = set() if e.awaited else {COMMON}
        for m in e.awaited:
            if m not in bundle_of:
                how = end(m)
                if how in origin_like:
                    direct.add(m)
                else:
                    why.add(how)  # type: ignore[arg-type]
        ends.append(direct)
        bad.append(why)
    comp = _scc(succ)
    ncomp = max(comp, default=-1) + 1
    c_ends: list[set[int]] = [set() for _ in range(ncomp)]
    c_bad: list[set[str]] = [set() for _ in range(ncomp)]
    members_of: list[list[int]] = [[] for _ in range(ncomp)]
    for i, c in enumerate(comp):
        members_of[c].append(i)
    for c in range(ncomp):  # Tarjan numbers components successors-first
        for i in members_of[c]:
            c_ends[c] |= ends[i]
            c_bad[c] |= bad[i]
            for j in succ[i]:
                if comp[j] != c:
                    c_ends[c] |= c_ends[comp[j]]
                    c_bad[c] |= c_bad[comp[j]]
        if not c_ends[c] and not c_bad[c]:
            c_bad[c].add("cycle")

    origins = sorted(set().union(*c_ends) if c_ends else set())
    kinds = {r: (DESYNC_STATE if desync.get(r) == DESYNC_STATE else waits[r].state) for r in origins}
    chains = _chains(edges, bundle_of, end)
    graph = Graph(INCONCLUSIVE, tuple(edges), tuple(origins), kinds, chains)
    problems = set().union(*c_bad) if c_bad else set()
    if no_group:
        problems.add(NO_GROUP)
    if problems:
        if problems <= {PROGRESS} and not origins:
            return Graph(NONE, tuple(edges), (), {}, chains, _WHY[PROGRESS], frozenset(problems))
        texts = {**_WHY, NO_GROUP: f"{_WHY[NO_GROUP]} ({ranks_text(no_group)})" if no_group else _WHY[NO_GROUP]}
        why = "; ".join(texts.get(p, "a cycle of waits with no rank outside it") for p in sorted(problems))
        return _replace(graph, reason=f"chains end at {why}", ends=frozenset(problems))
    # 5. The witnesses (every waiting rank, all of whose chains end at the origins) are a strict
    #    majority of the ranks observed here: one waiting rank of two names nobody.
    witnesses = sum(len(e.waiters) for e in edges)
    if not c3.strict_majority(witnesses, len(waits)):
        return _replace(graph, reason=f"only {witnesses} of {len(waits)} ranks wait: no strict majority of "
                        "witnesses confirms the origin")
    # 6. Every group of 3+ members that holds an origin and in which ranks wait: its strict majority
    #    waits in its collective.
    waiting_in: dict[int, int] = {}
    for (g, _c), rs in by_key.items():
        waiting_in[g] = waiting_in.get(g, 0) + len(rs)
    for g, cnt in waiting_in.items():
        members = groups[g]
        if len(members) >= 3 and any(o in kinds for o in members) and not c3.strict_majority(cnt, len(members)):
            return _replace(graph, reason=f"only {cnt} of the {len(members)} members of group "
                            f"{members_text(members)} wait in it: no strict majority confirms the origin")
    return _replace(graph, status=ATTRIBUTED)


def _replace(g: Graph, **kw: Any) -> Graph:

    return replace(g, **kw)


def _scc(succ: Sequence[Sequence[int]]) -> list[int]:
    """Component id per node, numbered so that every successor component comes first (Tarjan)."""
    n = len(succ)
    index = [-1] * n
    low = [0] * n
    on = [False] * n
    comp = [-1] * n
    stack: list[int] = []
    counter = 0
    ncomp = 0
    for root in range(n):
        if index[root] != -1:
            continue
        work = [(root, 0)]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on[root] = True
        while work:
            v, i = work[-1]
            if i < len(succ[v]):
                work[-1] = (v, i + 1)
                w = succ[v][i]
                if index[w] == -1:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on[w] = True
                    work.append((w, 0))
                elif on[w]:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on[w] = False
                    comp[w] = ncomp
                    if w == v:
                        break
                ncomp += 1
    return comp


def _chains(edges: Sequence[Edge], bundle_of: Mapping[int, int], end) -> tuple[tuple[int, ...], ...]:
    """A few chains for people: from waiters nobody waits for (else any waiter), first awaited
    rank each step, until the chain ends or loops."""
    awaited_somewhere = {m for e in edges for m in e.awaited}
    starts = [next((r for r in e.waiters if r not in awaited_somewhere), None) for e in edges]
    if all(s is None for s in starts):
        starts = [e.waiters[0] for e in edges]  # every waiter is awaited: cycles; start anywhere
    out: list[tuple[int, ...]] = []
    seen_ends: set[tuple[int, ...]] = set()
    for s in starts:
        if s is None:
            continue
        path, here = [s], s
        while here in bundle_of:
            e = edges[bundle_of[here]]
            nxt = next((m for m in e.awaited if end(m) is not None), e.awaited[0] if e.awaited else None)
            if nxt is None or nxt in path:
                break
            path.append(nxt)
            here = nxt
        key = tuple(path[1:])
        if key in seen_ends:
            continue
        seen_ends.add(key)
        out.append(tuple(path))
        if len(out) >= MAX_CHAINS:
            break
    return tuple(out)


def members_text(members: Sequence[int]) -> str:
    ms = sorted(members)
    if len(ms) > 8:
        return "{" + ", ".join(map(str, ms[:6])) + f", ... ({len(ms)} ranks)" + "}"
    return "{" + ", ".join(map(str, ms)) + "}"


def chain_text(graph: Graph, chain: Sequence[int], waits: Mapping[int, Wait]) -> str:
    """``rank 1 waits in all_reduce of group {1, 3} for rank 3, which waits in ... for rank 2, which is idle``."""
    parts = []
    for i, r in enumerate(chain):
        e = graph.edge_of(r) if i < len(chain) - 1 else None
        head = f"rank {r}" if i == 0 else f"rank {r}, which"
        if e is not None:
            parts.append(f"{head} waits in {e.collective} of group {members_text(e.members)} for")
        else:
            w = waits.get(r)
            state = "is not observed on this host" if w is None else (
                "waits in another collective of its group" if graph.kinds.get(r) == DESYNC_STATE
                else _waiting_end(w) if w.state == "waiting" else f"is {w.state}")
            parts.append(f"{head} {state}")
    return " ".join(parts)


def _waiting_end(w: Wait) -> str:
    """A chain that ends at a rank that waits itself: where, and why it goes no further."""
    where = f"waits in {w.collective}" if w.collective else "waits"
    if w.group is None:
        return f"{where} (its process group is not known)"
    return f"{where}, where its group's other waiting members are in another collective (no strict majority)"
