"""The dashboard's chain view (key ``w``): from a waiting rank to the origin it waits for, one step a
line, with the process group and the collective of each wait.

Read from the open incidents' evidence, as ``diagnose --json`` writes it (consensus/waitfor.py): the
``wait_for`` edges (waiters → awaited, with the group's members and the collective) and the ``chain``
lists. A selected rank that waits gets its own chain first (the shortest path along the edges to an
origin of the incident); then the incident's representative chains. Pure: no textual, no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text

from scout_sys.model import Incident
from scout_sys.report import printable
from scout_sys.text import compress, ranks_text

MAX_CHAINS = 8


@dataclass(frozen=True)
class Step:
    rank: int
    group: tuple[int, ...] = ()  # the process group it waits in (empty: the chain ends here)
    collective: str = ""


@dataclass(frozen=True)
class Chain:
    incident: Incident
    steps: tuple[Step, ...]  # waiter first, the rank where the chain ends last
    origin: bool  # the chain ends at an origin of the incident


def _edges(inc: Incident) -> list[dict[str, Any]]:
    return [e for ev in inc.evidence for e in (ev.data.get("wait_for") or ()) if isinstance(e, Mapping)]


def _step(rank: int, nxt: int | None, edges: Sequence[Mapping[str, Any]]) -> Step:
    if nxt is None:
        return Step(rank)
    for e in edges:
        if rank in e.get("waiters", ()) and nxt in e.get("awaited", ()):
            return Step(rank, tuple(e.get("group", ())), str(e.get("collective", "")))
    return Step(rank)


def _path(start: int, edges: Sequence[Mapping[str, Any]], origins: set[int]) -> list[int] | None:
    """The shortest path along the edges from ``start`` to an origin (breadth first)."""
    nexts: dict[int, list[int]] = {}
    for e in edges:
        for w in e.get("waiters", ()):
            nexts.setdefault(w, []).extend(a for a in e.get("awaited", ()) if a not in nexts.get(w, ()))
    prev: dict[int, int | None] = {start: None}
    todo = deque([start])
    while todo:
        r = todo.popleft()
        if r in origins and r != start:
            out = [r]
            while prev[out[-1]] is not None:
                out.append(prev[out[-1]])  # type: ignore[arg-type]
            return out[::-1]
        for n in nexts.get(r, ()):
            if n not in prev:
                prev[n] = r
                todo.append(n)
    return None


def chains(incidents: Sequence[Incident], selected: int | None = None) -> list[Chain]:
    """The chains to show: the selected rank's first (when it waits), then each incident's own."""
    out: list[Chain] = []
    seen: set[tuple[int, ...]] = set()

    def add(inc: Incident, path: Sequence[int], edges: Sequence[Mapping[str, Any]]) -> None:
        key = tuple(path)
        if len(path) < 2 or key in seen or len(out) >= MAX_CHAINS:
            return
        seen.add(key)
        steps = tuple(_step(r, path[i + 1] if i + 1 < len(path) else None, edges) for i, r in enumerate(path))
        out.append(Chain(inc, steps, path[-1] in inc.ranks))

    for inc in incidents:
        edges = _edges(inc)
        if selected is not None and edges and selected not in inc.ranks:
            p = _path(selected, edges, set(inc.ranks))
            if p:
                add(inc, p, edges)
    for inc in incidents:
        edges = _edges(inc)
        for ev in inc.evidence:
            c = ev.data.get("chain")
            if isinstance(c, list) and all(isinstance(r, int) for r in c):
                add(inc, c, edges)
    return out


def _members(g: Sequence[int]) -> str:
    """``{1, 3}``, as the wait-for lines of ``diagnose`` say it; a large group compressed: ``{0-255}``."""
    return "{" + (", ".join(map(str, g)) if len(g) <= 8 else compress(list(g))) + "}"


def chains_text(incidents: Sequence[Incident], views: Mapping[int, Any], selected: int | None = None) -> Text:
    """The chain view's body."""
    t = Text()
    cs = chains(incidents, selected)
    if not cs:
        t.append("no wait-for chain: ", "bold")
        t.append("no open incident carries a wait-for graph (it is built when ranks wait in collectives of\n"
                 "different process groups and no peer group names the origin; docs/layouts.md)\n")
        return t
    for c in cs:
        inc = c.incident
        head = f"{inc.kind} ({inc.status})" + (f": {ranks_text(inc.ranks)}" if inc.ranks else "")
        t.append(f"rank {c.steps[0].rank} → rank {c.steps[-1].rank}", "bold")
        t.append("   " + printable(head) + "\n", "dim")
        for i, s in enumerate(c.steps):
            t.append("  " + "   " * i + ("└▶ " if i else "") + f"rank {s.rank}", "bold" if i == 0 else "")
            if s.group:
                t.append("  waits in ")
                t.append(printable(s.collective or "a collective"), "cyan")
                t.append(f" of group {_members(s.group)} for")
            else:
                v = views.get(s.rank)
                state = getattr(v, "state", None) or "not observed on this host"
                if c.origin:
                    t.append("  ORIGIN", "bold red")
                    coll = getattr(v, "collective", "") if state == "waiting" else ""
                    t.append(f"  {printable(state)}" + (f" in another collective of its group: {printable(coll)}"
                                                        if coll else ""))
                    where = "" if coll else getattr(v, "where", "")
                    if where:
                        t.append(" at " + printable(where), "dim")
                else:
                    coll = getattr(v, "collective", "") if state == "waiting" else ""
                    t.append(f"  {printable(state)}" + (f" in {printable(coll)}" if coll else "") +
                             " (the chain ends here, not at an origin)")
            t.append("\n")
        t.append("\n")
    return t
