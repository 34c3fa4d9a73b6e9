"""An agent's heartbeat: its one codec, used by the agent that writes it and every reader.

The agent builds a :class:`Heartbeat` and :func:`encode` gives the body it seals (cluster/wire.py);
a reader unseals a body and :func:`decode` gives the Heartbeat back, decoded once at the boundary.
The per-rank part (one :class:`RankBeat` per rank) stays as it was sent until it is asked for: a
poll of ``watch --cluster`` reads only each rank's stall (:meth:`Heartbeat.stalls`), without
building a RankBeat for each of 64k ranks every poll.

Bodies of version 1 (state and pause per rank, ``"ranks"``) and version 2 (positional rows,
:data:`_ROW`) are both read. Pure: no I/O.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from scout_sys.model import COLLECTIVES, MAIN_THREAD, STACK

__all__ = ["HB_VERSION", "MAX_GROUPS", "MAX_WHERE", "Heartbeat", "RankBeat", "decode", "encode", "encode_ranks"]

HB_VERSION = 2  # heartbeat body: 1 = state and pause per rank; 2 adds progress, place, collectives, step time
MAX_WHERE = 80  # characters of a place's text
MAX_GROUPS = 8  # process groups whose sequence numbers a rank's beat carries

_SIGNALS = {COLLECTIVES: "c", MAIN_THREAD: "m", STACK: "s"}
_SIGNAL_OF = {v: k for k, v in _SIGNALS.items()}
_DEAD_V1 = frozenset({"stopped", "tracing-stop", "zombie", "gone"})
_ENDED = frozenset({"zombie", "gone"})


@dataclass(frozen=True, **({"slots": True} if sys.version_info >= (3, 10) else {}))  # slots: from 3.10
class RankBeat:
    """One rank in a heartbeat: a few values, no stacks.

    ``stall``: seconds since the rank was last seen progressing by ``signal``, the best one its
    agent's watch has (watch/progress.py: collective sequence numbers, else the main thread for a
    rank inside a collective, else the stack staying at one place); ``dead``: stopped or gone (not
    a py-spy read's pause); ``where`` and ``stack``: the place and a short hash of the rank's latest
    stack sample; ``seqs``: its collective sequence number per process group (eBPF); ``step``: the
    median seconds between its collectives over the last few seconds (eBPF)."""

    rank: int
    pid: int | None = None
    state: str = "?"
    pause: float = 0.0
    stall: float = 0.0
    signal: str = MAIN_THREAD
    dead: bool = False
    where: str = ""
    stack: str = ""
    seqs: tuple[tuple[str, int], ...] = ()
    step: float | None = None


@dataclass(frozen=True)
class Heartbeat:
    """One agent's heartbeat. ``time`` is by the agent's clock (readers never compare it with theirs
    but to order it with a window of the same agent); ``seq`` counts its heartbeats; ``busy_for``:
    seconds of a window about to start, during which no heartbeat comes; ``forged``: values it
    ignored because they did not verify; ``body``: the per-rank part as sent (and, decoded, the whole
    body less the envelope's nonce: what an evidence bundle keeps)."""

    node: int
    host: str = "?"
    time: float = 0.0
    seq: int = -1
    world_size: int | None = None
    error: str | None = None
    forged: int = 0
    busy_for: float = 0.0
    missing: tuple[int, ...] = ()
    settling: bool = False
    body: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def ranks(self) -> list[int]:
        """The global ranks it reports."""
        if "rows" in self.body:
            return [int(row[0]) for row in self.body["rows"]]
        return [int(d["r"]) for d in self.body.get("ranks", ())]

    def stalls(self) -> list[tuple[int, float, str, bool]]:
        """(rank, stall, signal, dead) per rank: what the suspicion reads, without a RankBeat each."""
        if "rows" in self.body:
            return [(int(row[0]), float(row[3]), _SIGNAL_OF.get(row[4], MAIN_THREAD), bool(row[5]))
                    for row in self.body["rows"]]
        return [(b.rank, b.stall, b.signal, b.dead) for b in self.beats]

    def finishing(self) -> bool:
        """Whether a rank it reports has ended and is not dead: it ended with status 0, as the ranks
        of a job that finishes do, a moment apart (watch/hang.py ``finishing``)."""
        if "rows" in self.body:
            ended = {i for i, st in enumerate(self.body.get("states", ())) if st in _ENDED}
            return bool(ended) and any(row[2] in ended and not row[5] for row in self.body["rows"])
        return any(b.state in _ENDED and not b.dead for b in self.beats)

    @cached_property
    def beats(self) -> tuple[RankBeat, ...]:
        """Its ranks, decoded once (when first asked)."""
        return tuple(_decode_ranks(self.body))


def encode_ranks(beats: Iterable[RankBeat]) -> dict[str, Any]:
    """The heartbeat's per-rank part, version 2: ``{"v": 2, "states": [...], "places": [[hash, where],
    ...], "groups": [...], "rows": [[...], ...]}`` — a positional row per rank (:data:`_ROW`), each
    distinct state, place and process group once. About 50 bytes a rank (version 1 readers see no
    ``ranks``: no rank, rather than a wrong one)."""
    beats = list(beats)
    states: dict[str, int] = {}
    places: dict[tuple[str, str], int] = {}
    groups = sorted({g for b in beats for g, _ in b.seqs})[:MAX_GROUPS]
    col = {g: i for i, g in enumerate(groups)}
    rows = []
    for b in beats:
        seqs: list[int | None] = []
        if b.seqs:
            seqs = [None] * len(groups)
            for g, n in b.seqs:
                if g in col:
                    seqs[col[g]] = n
        rows.append([b.rank, b.pid, states.setdefault(b.state, len(states)), round(b.stall, 1),
                     _SIGNALS.get(b.signal, "m"), int(b.dead),
                     places.setdefault((b.stack, b.where[:MAX_WHERE]), len(places)) if b.where or b.stack else -1,
                     seqs, None if b.step is None else round(b.step, 4), round(b.pause, 1)])
    return {"v": HB_VERSION, "states": list(states), "places": [list(p) for p in places], "groups": groups,
            "rows": rows}


def encode(hb: Heartbeat) -> dict[str, Any]:
    """The body the agent seals: its fields, and the per-rank part of ``hb.body`` (:func:`encode_ranks`)."""
    return {**hb.body, "node": hb.node, "host": hb.host, "time": hb.time, "seq": hb.seq,
            "world_size": hb.world_size, "error": hb.error, "forged": hb.forged, "busy_for": hb.busy_for,
            "missing": list(hb.missing), "settling": hb.settling}


def decode(body: Mapping[str, Any]) -> Heartbeat:
    """A verified heartbeat body (any version) as a Heartbeat; its per-rank part is read when asked."""
    ws = body.get("world_size")
    return Heartbeat(
        node=int(body.get("node", -1)), host=str(body.get("host", "?")), time=float(body.get("time", 0.0)),
        seq=int(body.get("seq", -1)), world_size=None if ws is None else int(ws),
        error=None if body.get("error") is None else str(body["error"]), forged=int(body.get("forged") or 0),
        busy_for=float(body.get("busy_for") or 0.0), missing=tuple(int(m) for m in body.get("missing") or ()),
        settling=bool(body.get("settling")), body={k: v for k, v in body.items() if k != "nonce"})


# A version-2 row, one per rank: [rank, pid, state (index into "states"), stall, signal ("c"|"m"|"s"),
# dead (0|1), place (index into "places", -1 none), seqs (one per "groups" entry, null where the rank
# has none; [] none at all), step (null: unknown), pause]
_ROW = ("rank", "pid", "state", "stall", "signal", "dead", "place", "seqs", "step", "pause")


def _decode_ranks(hb: Mapping[str, Any]) -> list[RankBeat]:
    """The ranks of a heartbeat body (version 1 or 2). A version-1 beat knows only state and the main
    thread's pause: its pause is its stall."""
    if "rows" not in hb:
        return [RankBeat(rank=int(d["r"]), pid=d.get("pid"), state=str(d.get("s", "?")), pause=float(d.get("p", 0.0)),
                         stall=float(d.get("p", 0.0)), dead=str(d.get("s")) in _DEAD_V1) for d in hb.get("ranks", ())]
    states = [str(x) for x in hb.get("states", ())]
    places = [(str(h), str(w)) for h, w in hb.get("places", ())]
    groups = [str(g) for g in hb.get("groups", ())]
    out = []
    for row in hb["rows"]:
        d = dict(zip(_ROW, row))
        place = d.get("place", -1)
        stack, where = places[place] if isinstance(place, int) and 0 <= place < len(places) else ("", "")
        state = d.get("state")
        out.append(RankBeat(
            rank=int(d["rank"]), pid=d.get("pid"),
            state=states[state] if isinstance(state, int) and 0 <= state < len(states) else "?",
            pause=float(d.get("pause") or 0.0), stall=float(d.get("stall") or 0.0),
            signal=_SIGNAL_OF.get(d.get("signal"), MAIN_THREAD), dead=bool(d.get("dead")), where=where, stack=stack,
            seqs=tuple((g, int(n)) for g, n in zip(groups, d.get("seqs") or ()) if n is not None),
            step=float(d["step"]) if d.get("step") is not None else None))
    return out
