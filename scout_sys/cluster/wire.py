"""What crosses hosts: store keys, the authenticated envelope, and the JSON of activities and records
(the Job's is :func:`scout_sys.model_job.job_to_json`, profile ``WIRE``).

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
from dataclasses import MISSING, asdict, fields
from typing import Any

from scout_sys.errors import BadToken, ScoutError
from scout_sys.model import (
    Activity,
    CollectiveSample,
    CollectiveWait,
    DeviceSample,
    ExitRecord,
    Fingerprint,
    Observation,
    OomRecord,
    SignalRecord,
)
from scout_sys.model_job import built

PROTO = "scout-sys/cluster/v1"
PREFIX = "scout-sys/v1/"
RUN = PREFIX + "run"  # the leader's run record: nonce, nnodes
REQS = PREFIX + "reqs"  # counter of window requests (store.add)


def hb_key(node: int) -> str:
    return f"{PREFIX}hb/{node}"  # its body: cluster/heartbeat.py


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


_ACTIVITY_DEFAULTS = {name: default for name, default in _ACTIVITY_FIELDS if default is not MISSING}


def _activity(kw: dict[str, Any]) -> Activity:
    return built(Activity, _ACTIVITY_DEFAULTS, kw)


def _wait(w: Mapping[str, Any], cache: dict[tuple, CollectiveWait]) -> CollectiveWait:
    key = tuple(sorted(w.items()))
    found = cache.get(key)
    if found is None:
        found = cache[key] = CollectiveWait(**w)
    return found


def activity_from_json(d: Mapping[str, Any], cache: dict[tuple, CollectiveWait] | None = None) -> Activity:
    kw = dict(d) if d.keys() <= _ACTIVITY_NAMES else {k: v for k, v in d.items() if k in _ACTIVITY_NAMES}
    if kw.get("wait") is not None:
        kw["wait"] = _wait(kw["wait"], {} if cache is None else cache)
    if "location" in kw:
        kw["location"] = tuple(tuple(x) for x in kw["location"])
    if "stack" in kw:
        kw["stack"] = tuple(kw["stack"])
    kw["rank"] = int(kw["rank"])
    kw.setdefault("pid", None)
    kw.setdefault("state", "unknown")
    return _activity(kw)


_TABLED = {"stack": "stacks", "location": "locations", "where": "wheres", "wait": "waits"}


def activities_to_json(acts: Iterable[Activity]) -> dict[str, Any]:
    """Many ranks' activities with each distinct stack, location, place and collective wait sent once
    (ranks of a job share a few): ``{"stacks": [...], "locations": [...], "wheres": [...], "waits":
    [...], "acts": [{..., "stack": i, "location": j, "where": k, "wait": l}]}``. About 110 bytes a rank
    of JSON beyond the tables, which is what a client at 64k ranks parses."""
    tables: dict[str, dict[Any, int]] = {name: {} for name in _TABLED}
    out = []
    for a in acts:
        d = activity_to_json(a)
        for name, table in tables.items():
            if name in d:
                d[name] = table.setdefault(getattr(a, name), len(table))
        out.append(d)
    return {"stacks": [list(t) for t in tables["stack"]], "locations": [[list(x) for x in t] for t in tables["location"]],
            "wheres": list(tables["where"]), "waits": [activity_to_json(Activity(0, None, "", wait=w))["wait"]
                                                       for w in tables["wait"]], "acts": out}


def activities_from_json(d: Mapping[str, Any]) -> dict[int, Activity]:
    """Read :func:`activities_to_json`'s form; also the earlier one, whose ``where`` and ``wait`` are
    given in full for each rank."""
    stacks = [tuple(t) for t in d.get("stacks", ())]
    locations = [tuple(tuple(x) for x in t) for t in d.get("locations", ())]
    wheres = [str(w) for w in d.get("wheres", ())]
    waits: dict[tuple, CollectiveWait] = {}  # ranks waiting in one collective share its decoded wait
    wait_table = [_wait(w, waits) for w in d.get("waits", ())]
    out = {}
    for x in d.get("acts", ()):
        kw = dict(x) if x.keys() <= _ACTIVITY_NAMES else {k: v for k, v in x.items() if k in _ACTIVITY_NAMES}
        if "stack" in kw:
            kw["stack"] = stacks[kw["stack"]]
        if "location" in kw:
            kw["location"] = locations[kw["location"]]
        if isinstance(kw.get("where"), int):
            kw["where"] = wheres[kw["where"]]
        w = kw.get("wait")
        if isinstance(w, int):
            kw["wait"] = wait_table[w]
        elif w is not None:
            kw["wait"] = _wait(w, waits)
        kw["rank"] = int(kw["rank"])
        kw.setdefault("pid", None)
        kw.setdefault("state", "unknown")
        a = _activity(kw)
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
        kw["members"] = tuple(kw.get("members", ()))
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
