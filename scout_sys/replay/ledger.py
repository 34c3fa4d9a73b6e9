"""The replay ledger: one JSON line per replay round, in ``<state dir>/replay/ledger.jsonl``.

``certify`` reads it to know whether a clean round covering every device of the job lies between
two checkpoints. A line::

    {"time": <end, unix s>, "started": <unix s>, "host": "...",
     "job": {"key": "<host>/<run id>/<launcher pid>@<launcher start>", "launcher_pid": ...,
             "launcher_start": <unix s>, "run_id": ..., "host": "...", "world_size": N, "ranks": [...],
             "cwd": "<the ranks' working directory>", "cmdline": "...",
             "checkpoint_dirs": [<dirs the watch saw its ranks write checkpoints in>]},
     "checkpoint": "<the newest checkpoint the job wrote before this round>" | null,
     "devices": [{"device": "cpu/rank0", "uuid": "GPU-..." (GPUs only), "ranks": [0],
                  "result": "agree" | "divergent" | "slow" | "error", "seconds": <kernel time>}],
     "complete": <every rank of the job on this host had a device with a result>,
     "result": "clean" | "sdc" | "inconclusive" | "incomplete"}

``watch`` also writes what it saw of the job, lines with an ``event`` (no replay round; certify reads
them to know which job wrote a checkpoint, and when a job was alive)::

    {"event": "checkpoint", "time": <the checkpoint's mtime>, "seen": <unix s>, "job": {...},
     "checkpoint": "<a checkpoint its ranks wrote>"}
    {"event": "seen", "time": <unix s>, "job": {...}, "alive": <whether the job still ran then>}

(``seen`` when the watch stops watching the job: ``alive`` false means the job had ended by then.)

A round is ``clean`` when it is complete and every device agreed bit for bit with at least one peer;
a slow device does not make a round unclean (slow is not wrong).

The job's identity outlives the job (its pids may be reused, its run id may repeat): ``key`` joins
the host, TORCHELASTIC_RUN_ID, the launcher's pid and its start time. A GPU's UUID outlives the job
too; a CPU device name (``cpu/rank2``) means something only inside its own job. The file rotates at
``MAX_BYTES`` (one previous generation, ``ledger.jsonl.1``, is kept and read).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from scout_sys.consensus.replay import DigestVerdict, SlowVerdict
from scout_sys.model import DeviceRound, Job
from scout_sys.rankenv import host_name

CLEAN, SDC, INCONCLUSIVE, INCOMPLETE = "clean", "sdc", "inconclusive", "incomplete"
CHECKPOINT, SEEN = "checkpoint", "seen"  # the watch's lines (``event``)
MAX_BYTES = 4 << 20  # per generation: a shared state dir keeps at most ~2 x this


def path(state_dir: str) -> str:
    return os.path.join(state_dir, "replay", "ledger.jsonl")


def _boot_time() -> float:
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def start_time(pid: int | None) -> float | None:
    """When process ``pid`` started (unix s, 0.01 s), from /proc; None when it is gone."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return round(_boot_time() + int(rest[19]) / os.sysconf("SC_CLK_TCK"), 2)
    except (OSError, IndexError, ValueError):
        return None


def _cwd(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def _cmdline(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(4096)
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()[:400] or None


def job_key(ident: dict[str, Any]) -> str:
    return f"{ident.get('host')}/{ident.get('run_id')}/{ident.get('launcher_pid')}@{ident.get('launcher_start')}"


def identity(job: Job, checkpoint_dirs: Sequence[str] = ()) -> dict[str, Any]:
    """What names ``job`` after it is gone (read from /proc now, while it runs)."""
    run_id = next((r.run_id for r in job.ranks if r.run_id), None)
    first = min(job.ranks, key=lambda r: r.rank) if job.ranks else None
    lp = job.launcher_pid or (first.pid if first else None)
    out: dict[str, Any] = {
        "launcher_pid": job.launcher_pid, "pid": lp, "launcher_start": start_time(lp), "run_id": run_id, "host": job.host,
        "world_size": job.world_size, "ranks": sorted(r.rank for r in job.ranks),
        "cwd": _cwd(first.pid) if first else None,
        "cmdline": _cmdline(first.pid) if first else None,
        "checkpoint_dirs": sorted({os.path.abspath(d) for d in checkpoint_dirs}),
    }
    out["key"] = job_key(out)
    return out


def alive(ident: dict[str, Any]) -> bool:
    """Whether the job of ``ident`` still runs on this host: its launcher (or first rank) has the
    same pid and start time (a reused pid starts later)."""
    pid, start = ident.get("pid", ident.get("launcher_pid")), ident.get("launcher_start")
    if not pid or start is None or ident.get("host") != host_name():
        return False
    return start_time(int(pid)) == start


def note(state_dir: str, ident: dict[str, Any], event: str, t: float, **fields: Any) -> dict[str, Any]:
    """Append one of the watch's lines (``CHECKPOINT``, ``SEEN``) for the job of ``ident``."""
    e = {"event": event, "time": round(t, 3), "host": ident.get("host"), "job": ident, **fields}
    _write(state_dir, e)
    return e


def result_of(job: Job, res: Sequence[DeviceRound], dv: DigestVerdict) -> tuple[bool, str]:
    """(complete, result) of one round: ``complete`` when every rank of the job on this host had a
    device with a result; ``result`` one of CLEAN, SDC, INCONCLUSIVE, INCOMPLETE."""
    covered = {r for d in res if not d.error for r in d.ranks}
    complete = not job.missing and covered >= {r.rank for r in job.ranks}
    if dv.divergent:
        return complete, SDC
    if dv.inconclusive:
        return complete, INCONCLUSIVE
    if not complete or dv.compared < 2:
        return complete, INCOMPLETE
    return complete, CLEAN


def entry(job: Job, started: float, ended: float, res: Sequence[DeviceRound], dv: DigestVerdict,
          sv: SlowVerdict, *, ident: dict[str, Any] | None = None, checkpoint: str | None = None,
          uuids: dict[str, str] | None = None) -> dict[str, Any]:
    devices = []
    for d in res:
        result = "error" if d.error else "divergent" if d.device in dv.divergent else \
            "slow" if d.device in sv.slow else "agree"
        item: dict[str, Any] = {"device": d.device, "ranks": list(d.ranks), "result": result,
                                "seconds": round(sum(k.seconds for k in d.kernels.values()), 6)}
        uuid = (uuids or {}).get(d.device)
        if uuid:
            item["uuid"] = uuid
        if d.error:
            item["error"] = d.error
        devices.append(item)
    complete, result = result_of(job, res, dv)
    ident = dict(ident) if ident is not None else identity(job)
    ident.setdefault("key", job_key(ident))
    return {"time": round(ended, 3), "started": round(started, 3), "host": job.host, "job": ident,
            "checkpoint": os.path.abspath(checkpoint) if checkpoint else None,
            "devices": devices, "complete": complete, "result": result}


def append(state_dir: str, job: Job, started: float, ended: float, res: Sequence[DeviceRound],
           dv: DigestVerdict, sv: SlowVerdict, *, ident: dict[str, Any] | None = None,
           checkpoint: str | None = None, uuids: dict[str, str] | None = None) -> dict[str, Any]:
    e = entry(job, started, ended, res, dv, sv, ident=ident, checkpoint=checkpoint, uuids=uuids)
    _write(state_dir, e)
    return e


def _write(state_dir: str, e: dict[str, Any]) -> None:
    p = path(state_dir)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    _rotate(p)
    with open(p, "a") as f:  # one write of one line: concurrent appenders do not interleave
        f.write(json.dumps(e) + "\n")


def _rotate(p: str) -> None:
    """Keep a shared state dir bounded: past MAX_BYTES the file becomes ``.1`` (the older ``.1`` goes)."""
    try:
        if os.path.getsize(p) < MAX_BYTES:
            return
        os.replace(p, p + ".1")  # atomic: a concurrent appender writes to one generation or the next
    except OSError:
        pass


def read(state_dir: str) -> list[dict[str, Any]]:
    """Every readable line (rounds and the watch's ``event`` lines), oldest first; a torn or foreign
    line is skipped."""
    out = []
    for p in (path(state_dir) + ".1", path(state_dir)):
        try:
            with open(p) as f:
                for line in f:
                    try:
                        e = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(e, dict) and isinstance(e.get("time"), (int, float)) \
                            and isinstance(e.get("job", {}), dict):
                        out.append(e)
        except OSError:
            continue
    out.sort(key=lambda e: e["time"])
    return out
