"""Which known job wrote a checkpoint (for ``certify``), from the replay ledger alone.

A job of the ledger is a candidate for a file written at ``t`` when it had started by ``t``, had not
ended by then (the watch records a job's end: a ``seen`` line with ``alive`` false), and the file is
one the watch saw its ranks write (a ``checkpoint`` line with that modification time), lies in a
folder it was seen writing checkpoints in, or lies under its working directory; the stronger match
wins, then the newest job. A candidate is *sure* when the file was written while the job is known
to have run (up to its last round or watch line, or it runs now): a file written after that, by a job
that is gone, may be a later job's (the same script relaunched in the same folder), whose rounds the
ledger does not have; so its rounds neither certify nor reject it: it is ``unverified`` with that
reason, never judged by another job's rounds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from scout_sys.replay import ledger

SLACK = 2.0  # seconds between a file's modification time and a reading of the same moment (a process's
# start time from /proc is off by up to 1 s: the boot time there is whole seconds)
_EXACT, _DIR, _CWD = 3, 2, 1


def jobs_of(lines: Sequence[dict[str, Any]], *,
            alive: Callable[[dict[str, Any]], bool] = ledger.alive) -> dict[str, dict[str, Any]]:
    """The jobs of the ledger by key: their newest identity, rounds, GPUs, checkpoint folders and
    files, when they were last known to run (``known``: +inf when they run now) and ended (or None)."""
    out: dict[str, dict[str, Any]] = {}
    for e in lines:
        ident = e.get("job") or {}
        key = ident.get("key") or ledger.job_key(ident)
        j = out.setdefault(key, new_job(key, ident, float(e["time"])))
        j["ident"] = ident
        t = float(e["time"])
        j["first"] = min(j["first"], float(e.get("started", t)))
        j["dirs"] |= set(ident.get("checkpoint_dirs") or ())
        event = e.get("event")
        if event == ledger.CHECKPOINT and e.get("checkpoint"):
            j["checkpoints"][e["checkpoint"]] = t
            j["dirs"].add(os.path.dirname(e["checkpoint"]))
            j["known"] = max(j["known"], float(e.get("seen", t)))
        elif event == ledger.SEEN:
            j["known"] = max(j["known"], t)  # it ran until then, or had ended by then
            if not e.get("alive"):
                j["ended"] = t if j["ended"] is None else min(j["ended"], t)
        elif event is None:
            j["rounds"].append(e)
            j["uuids"] |= {d["uuid"] for d in e.get("devices", ()) if d.get("uuid")}
            j["known"] = max(j["known"], t)
            if e.get("checkpoint"):
                j["checkpoints"].setdefault(e["checkpoint"], None)
                j["dirs"].add(os.path.dirname(e["checkpoint"]))
    for j in out.values():
        if j["ended"] is None and alive(j["ident"]):
            j["known"] = float("inf")
    return out


def new_job(key: str, ident: dict[str, Any], first: float = float("inf")) -> dict[str, Any]:
    """A job's record as :func:`jobs_of` gives it, before any of its lines (``first``: its earliest time)."""
    return {"key": key, "ident": ident, "rounds": [], "uuids": set(), "dirs": set(), "checkpoints": {},
            "known": float("-inf"), "ended": None, "first": first}


def _under(path: str, d: str | None) -> bool:
    if not d:
        return False
    d = os.path.abspath(d)
    return path == d or path.startswith(d.rstrip(os.sep) + os.sep)


def writer_of(path: str, t: float, jobs: dict[str, dict[str, Any]]) -> tuple[dict[str, Any] | None, str]:
    """The known job that wrote ``path`` (written at ``t``) and how we know; (None, why not)."""
    me = os.path.abspath(path)
    best: tuple[tuple[bool, int, float], dict[str, Any], str] | None = None
    for j in jobs.values():
        ident = j["ident"]
        start = ident.get("launcher_start") or j["first"]
        if start > t + SLACK or (j["ended"] is not None and t > j["ended"] + SLACK):
            continue  # started after the file was written, or had ended before
        seen = j["checkpoints"].get(me)
        if seen is not None and abs(seen - t) < 0.01:
            rank, how = _EXACT, "the watch saw its ranks write it"
        elif me in j["checkpoints"] or any(_under(me, d) for d in j["dirs"]):
            rank, how = _DIR, "the watch saw its ranks write checkpoints there"
        elif _under(me, ident.get("cwd")):
            rank, how = _CWD, f"it lies under the job's working directory {ident.get('cwd')}"
        else:
            continue
        sure = rank == _EXACT or t <= j["known"] + SLACK
        if best is None or (sure, rank, start) > best[0]:
            best = ((sure, rank, start), j, how)
    if best is None:
        return None, "no job in the replay ledger wrote it (not under a watched job's working or checkpoint " \
                     "directory): name the job with --job while it runs"
    (sure, _, _), j, how = best
    if not sure:
        return None, (f"{describe(j['ident'])} ran there ({how}), but the ledger's last sign of it is at "
                      f"{clock(j['known'])}, before this was written ({clock(t)}), and it runs no more: a later "
                      "job may have written it, so that job's rounds neither certify nor reject it (name the "
                      "job that wrote it with --job while it runs)")
    return j, how


def describe(ident: dict[str, Any]) -> str:
    start = ident.get("launcher_start")
    return (f"job {ident.get('run_id') or '-'} (launcher pid {ident.get('launcher_pid')}"
            + (f", started {clock(start)}" if start else "") + f", host {ident.get('host')})")


def clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(t)))
