"""The replay ledger: one JSON line per replay round, in ``<state dir>/replay/ledger.jsonl``.

``certify`` reads it to know whether a clean round covering every device of the job lies between
two checkpoints. A line::

    {"time": <end, unix s>, "started": <unix s>, "host": "...",
     "job": {"launcher_pid": ..., "run_id": ..., "world_size": N, "ranks": [...]},
     "devices": [{"device": "cpu/rank0", "ranks": [0], "result": "agree" | "divergent" | "slow"
                  | "error", "seconds": <total kernel time>, "error": "..."}],
     "complete": <every rank of the job on this host had a device with a result>,
     "result": "clean" | "sdc" | "inconclusive" | "incomplete"}

A round is ``clean`` when it is complete and every device agreed bit for bit with at least one peer;
a slow device does not make a round unclean (slow is not wrong).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from scout_sys.consensus.replay import DigestVerdict, SlowVerdict
from scout_sys.model import DeviceRound, Job

CLEAN, SDC, INCONCLUSIVE, INCOMPLETE = "clean", "sdc", "inconclusive", "incomplete"


def path(state_dir: str) -> str:
    return os.path.join(state_dir, "replay", "ledger.jsonl")


def entry(job: Job, started: float, ended: float, res: Sequence[DeviceRound], dv: DigestVerdict,
          sv: SlowVerdict) -> dict[str, Any]:
    devices = []
    for d in res:
        result = "error" if d.error else "divergent" if d.device in dv.divergent else \
            "slow" if d.device in sv.slow else "agree"
        item: dict[str, Any] = {"device": d.device, "ranks": list(d.ranks), "result": result,
                                "seconds": round(sum(k.seconds for k in d.kernels.values()), 6)}
        if d.error:
            item["error"] = d.error
        devices.append(item)
    covered = {r for d in res if not d.error for r in d.ranks}
    complete = not job.missing and covered >= {r.rank for r in job.ranks}
    if dv.divergent:
        result = SDC
    elif dv.inconclusive:
        result = INCONCLUSIVE
    elif not complete or dv.compared < 2:
        result = INCOMPLETE
    else:
        result = CLEAN
    run_id = next((r.run_id for r in job.ranks if r.run_id), None)
    return {"time": round(ended, 3), "started": round(started, 3), "host": job.host,
            "job": {"launcher_pid": job.launcher_pid, "run_id": run_id, "world_size": job.world_size,
                    "ranks": sorted(r.rank for r in job.ranks)},
            "devices": devices, "complete": complete, "result": result}


def append(state_dir: str, job: Job, started: float, ended: float, res: Sequence[DeviceRound],
           dv: DigestVerdict, sv: SlowVerdict) -> dict[str, Any]:
    e = entry(job, started, ended, res, dv, sv)
    p = path(state_dir)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "a") as f:  # one write of one line: concurrent appenders do not interleave
        f.write(json.dumps(e) + "\n")
    return e


def read(state_dir: str) -> list[dict[str, Any]]:
    """Every readable round, oldest first; a torn or foreign line is skipped."""
    out = []
    try:
        with open(path(state_dir)) as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if isinstance(e, dict) and isinstance(e.get("time"), (int, float)):
                    out.append(e)
    except OSError:
        return []
    out.sort(key=lambda e: e["time"])
    return out
