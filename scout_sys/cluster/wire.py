"""What crosses hosts: store keys, the authenticated envelope, and the JSON of activities and records.

Every value in the store is an envelope ``{"n": nonce, "b": body, "m": mac}``: ``body`` is compact
JSON text, ``mac`` is HMAC-SHA256 with the shared token over the protocol version, the store key, the
run's nonce and the body. Binding the key stops a valid message from being moved to another slot
(node 1's answer passed off as node 2's); binding the nonce stops messages of an earlier run (an
earlier leader) from being replayed into this one. The run record (:data:`RUN`) carries the nonce,
chosen at random by the leader when it starts its store.

The token itself is read from a file (:func:`read_token`) and never leaves this process: not in argv,
the store, logs or JSON. Pure: no I/O but reading the token file.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from scout_sys.consensus.hang import Activity
from scout_sys.consensus.patterns import CollectiveWait
from scout_sys.errors import BadToken, ScoutError
from scout_sys.model import (
    CollectiveSample,
    DeviceSample,
    ExitRecord,
    Fingerprint,
    Job,
    Observation,
    OomRecord,
    Rank,
    SignalRecord,
)
from scout_sys.watch.progress import COLLECTIVES, MAIN_THREAD, STACK

PROTO = "scout-sys/cluster/v1"
PREFIX = "scout-sys/v1/"
RUN = PREFIX + "run"  # the leader's run record: nonce, nnodes
REQS = PREFIX + "reqs"  # counter of window requests (store.add)


HB_VERSION = 2  # heartbeat body: 1 = state and pause per rank; 2 adds progress, place, collectives, step time
MAX_WHERE = 80  # characters of a place's text
MAX_GROUPS = 8  # process groups whose sequence numbers a rank's beat carries


def hb_key(node: int) -> str:
    return f"{PREFIX}hb/{node}"


def req_key(rid: int) -> str:
    return f"{PREFIX}req/{rid}"


def answer_key(rid: int, node: int) -> str:
    return f"{PREFIX}win/{rid}/{node}"


class Forged(ScoutError):
    """A store value that does not verify with our token (forged, corrupted, or another token's)."""


class Stale(ScoutError):
    """A valid message of another run (another nonce): left over from an earlier leader."""


def read_token(path: str) -> bytes:
    """The shared secret from ``path`` (surrounding whitespace stripped). Never echoed."""
    try:
        with open(path, "rb") as f:
            token = f.read().strip()
    except OSError as e:
        raise BadToken(f"cannot read --token-file {path}: {e.strerror or e}") from None
    if len(token) < 16:
        raise BadToken(f"--token-file {path} holds {'no' if not token else 'a too short'} token "
                       "(at least 16 bytes; e.g. `openssl rand -hex 32 > FILE; chmod 600 FILE`)")
    return token


def _mac(token: bytes, key: str, nonce: str, body: str) -> str:
    return hmac.new(token, f"{PROTO}\n{key}\n{nonce}\n{body}".encode(), hashlib.sha256).hexdigest()


def seal(token: bytes, key: str, nonce: str, body: Mapping[str, Any]) -> bytes:
    text = json.dumps(body, separators=(",", ":"), sort_keys=True, default=str)
    return json.dumps({"n": nonce, "b": text, "m": _mac(token, key, nonce, text)}, separators=(",", ":")).encode()


def unseal(token: bytes, key: str, raw: bytes, nonce: str | None = None) -> dict[str, Any]:
    """The body of a sealed value. Raises :class:`Forged` when it does not verify, :class:`Stale`
    when it verifies but belongs to another run than ``nonce``."""
    try:
        env = json.loads(raw)
        n, text, mac = str(env["n"]), str(env["b"]), str(env["m"])
    except (ValueError, KeyError, TypeError):
        raise Forged(f"{key}: not a sealed scout-sys message") from None
    if not hmac.compare_digest(mac, _mac(token, key, n, text)):
        raise Forged(f"{key}: does not verify with this token")
    if nonce is not None and n != nonce:
        raise Stale(f"{key}: from another run")
    body = json.loads(text)
    if not isinstance(body, dict):
        raise Forged(f"{key}: body is not an object")
    body["nonce"] = n
    return body


# --------------------------------------------------------------------------- activities and records

_ACTIVITY_FIELDS = tuple((f.name, f.default) for f in fields(Activity))
_ACTIVITY_NAMES = frozenset(name for name, _ in _ACTIVITY_FIELDS)


def activity_to_json(a: Activity) -> dict[str, Any]:
    """Compact: fields at their default are left out."""
    out: dict[str, Any] = {}
    for name, default in _ACTIVITY_FIELDS:
        v = getattr(a, name)
        if v == default:
            continue
        if name == "wait":
            v = {"op": v.op, "site": v.site, "depth": v.depth, "direct": v.direct, "p2p": v.p2p}
        elif name == "location":
            v = [list(x) for x in v]
        elif name == "stack":
            v = list(v)
        elif isinstance(v, float):
            v = round(v, 6)
        out[name] = v
    return out


def activity_from_json(d: Mapping[str, Any]) -> Activity:
    kw = {k: v for k, v in d.items() if k in _ACTIVITY_NAMES}
    if kw.get("wait") is not None:
        kw["wait"] = CollectiveWait(**kw["wait"])
    kw["location"] = tuple(tuple(x) for x in kw.get("location", ()))
    kw["stack"] = tuple(kw.get("stack", ()))
    kw["rank"] = int(kw["rank"])
    return Activity(**kw)


def activities_to_json(acts: Iterable[Activity]) -> dict[str, Any]:
    """Many ranks' activities with each distinct stack and location sent once (ranks of a job share
    a few): ``{"stacks": [...], "locations": [...], "acts": [{..., "stack": i, "location": j}]}``."""
    tables: dict[str, dict[tuple, int]] = {"stack": {}, "location": {}}
    out = []
    for a in acts:
        d = activity_to_json(a)
        for name, table in tables.items():
            if name in d:
                d[name] = table.setdefault(getattr(a, name), len(table))
        out.append(d)
    return {"stacks": [list(t) for t in tables["stack"]], "locations": [[list(x) for x in t] for t in tables["location"]],
            "acts": out}


def activities_from_json(d: Mapping[str, Any]) -> dict[int, Activity]:
    stacks = [tuple(t) for t in d.get("stacks", ())]
    locations = [tuple(tuple(x) for x in t) for t in d.get("locations", ())]
    out = {}
    for x in d.get("acts", ()):
        a = activity_from_json({k: v for k, v in x.items() if k not in ("stack", "location")})
        if "stack" in x or "location" in x:
            a = replace(a, stack=stacks[x["stack"]] if "stack" in x else (),
                        location=locations[x["location"]] if "location" in x else ())
        out[a.rank] = a
    return out


_RECORDS: dict[str, type] = {t.__name__: t for t in (CollectiveSample, ExitRecord, SignalRecord, OomRecord,
                                                      DeviceSample)}


def record_to_json(o: Observation) -> dict[str, Any]:
    return {"type": type(o).__name__, **asdict(o)}


def record_from_json(d: Mapping[str, Any]) -> Observation | None:
    t = _RECORDS.get(str(d.get("type")))
    if t is None:
        return None
    kw = {k: v for k, v in d.items() if k != "type"}
    if t is CollectiveSample:
        kw["last"] = Fingerprint(**kw["last"]) if kw.get("last") else None
        kw["recent"] = tuple(Fingerprint(**f) for f in kw.get("recent", ()))
    return t(**kw)


def shareable(obs: Iterable[Observation]) -> list[Observation]:
    """The records other hosts need beyond activities: each rank's latest collective position (per
    process group) and GPU sample, and every exit, signal and OOM record. Bytes per rank, not stacks."""
    latest: dict[tuple, Observation] = {}
    events: list[Observation] = []
    for o in obs:
        if isinstance(o, CollectiveSample):
            key: tuple = ("c", o.group, o.rank)
        elif isinstance(o, DeviceSample):
            key = ("d", o.rank)
        elif isinstance(o, (ExitRecord, SignalRecord, OomRecord)):
            events.append(o)
            continue
        else:
            continue
        if key not in latest or o.time >= latest[key].time:
            latest[key] = o
    return [*latest.values(), *events]


def job_to_json(job: Job) -> dict[str, Any]:
    names = [f.name for f in fields(Rank)]
    return {"ranks": [{**{n: getattr(r, n) for n in names}, "coords": [list(c) for c in r.coords]} for r in job.ranks],
            "world_size": job.world_size, "launcher": job.launcher, "launcher_pid": job.launcher_pid,
            "host": job.host, "missing": list(job.missing), "peer_groups": [list(g) for g in job.peer_groups],
            "layout": job.layout, "notes": list(job.notes)}


def job_from_json(d: Mapping[str, Any]) -> Job:
    ranks = tuple(Rank(**{**r, "coords": tuple((str(k), int(v)) for k, v in r.get("coords", ()))})
                  for r in d.get("ranks", ()))
    return Job(ranks=ranks, world_size=int(d.get("world_size", len(ranks))), launcher=str(d.get("launcher", "?")),
               launcher_pid=d.get("launcher_pid"), host=str(d.get("host", "")),
               missing=tuple(int(m) for m in d.get("missing", ())),
               peer_groups=tuple(tuple(int(x) for x in g) for g in d.get("peer_groups", ())),
               layout=str(d.get("layout", "")), notes=tuple(d.get("notes", ())))


# --------------------------------------------------------------------------- heartbeats

_SIGNALS = {COLLECTIVES: "c", MAIN_THREAD: "m", STACK: "s"}
_SIGNAL_OF = {v: k for k, v in _SIGNALS.items()}
_DEAD_V1 = frozenset({"stopped", "tracing-stop", "zombie", "gone"})


@dataclass(frozen=True, slots=True)
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


def beats_to_json(beats: Iterable[RankBeat]) -> dict[str, Any]:
    """The heartbeat's per-rank part: ``{"v": 2, "places": [[hash, where], ...], "ranks": [...]}``,
    each distinct place once. Keys ``r``, ``pid``, ``s``, ``p`` are those of version 1 (``p`` left
    out when the main thread is running)."""
    places: dict[tuple[str, str], int] = {}
    ranks = []
    for b in beats:
        d: dict[str, Any] = {"r": b.rank, "pid": b.pid, "s": b.state, "g": round(b.stall, 1),
                             "k": _SIGNALS.get(b.signal, "m")}
        if b.pause >= 0.05:
            d["p"] = round(b.pause, 1)
        if b.dead:
            d["d"] = 1
        if b.where or b.stack:
            d["w"] = places.setdefault((b.stack, b.where[:MAX_WHERE]), len(places))
        if b.seqs:
            d["q"] = dict(sorted(b.seqs)[:MAX_GROUPS])
        if b.step is not None:
            d["t"] = round(b.step, 4)
        ranks.append(d)
    return {"v": HB_VERSION, "places": [list(p) for p in places], "ranks": ranks}


def beats_from_json(hb: Mapping[str, Any]) -> list[RankBeat]:
    """The ranks of a heartbeat body (version 1 or 2). A version-1 beat knows only the main thread:
    its pause is its stall."""
    places = [(str(h), str(w)) for h, w in hb.get("places", ())]
    out = []
    for d in hb.get("ranks", ()):
        pause = float(d.get("p", 0.0))
        state = str(d.get("s", "?"))
        w = d.get("w")
        stack, where = places[w] if isinstance(w, int) and 0 <= w < len(places) else ("", "")
        q = d.get("q")
        out.append(RankBeat(
            rank=int(d["r"]), pid=d.get("pid"), state=state, pause=pause,
            stall=float(d["g"]) if "g" in d else pause, signal=_SIGNAL_OF.get(d.get("k", "m"), MAIN_THREAD),
            dead=bool(d.get("d")) if "g" in d else state in _DEAD_V1, where=where, stack=stack,
            seqs=tuple((str(g), int(n)) for g, n in q.items()) if isinstance(q, dict) else (),
            step=float(d["t"]) if d.get("t") is not None else None))
    return out
