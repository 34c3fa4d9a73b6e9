"""Evidence bundles: what a person needs, saved the moment a hang opens, before launchers and
watchdogs kill the job — every rank's stacks (native ones too: pausing a hung rank is harmless),
process states, the last window's diagnosis and observations.

Bundles hold kernel stacks, native stacks and command lines of other users' jobs: they are created
private (folders 0700, files 0600, or group-readable with ``watch --group``: scout_sys/files.py).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict
from typing import Any

from scout_sys.files import private_dirs, private_opener
from scout_sys.model import Diagnosis, Incident, Job, Observation

MAX_OBSERVATIONS = 2000


def default_state_dir() -> str:
    if os.geteuid() == 0:
        return "/var/lib/scout-sys"
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(base, "scout-sys")


def write_json(path: str, obj: object) -> None:
    """Write atomically (a temporary file, then rename), with the private file mode (scout_sys/files.py)."""
    tmp = path + ".tmp"
    with open(tmp, "w", opener=private_opener) as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)


def new_folder(state_dir: str, inc: Incident) -> str:
    """The private folder of ``inc``'s bundle (``bundles/<time>-<id>-<kind>`` under ``state_dir``), created."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(inc.since))
    path = os.path.join(state_dir, "bundles", f"{stamp}-{inc.id}-{inc.kind}")
    private_dirs(path)
    return path


def save(state_dir: str, inc: Incident, job: Job, diagnosis: Diagnosis | None,
         history: list[Observation], native_dump: Any = None) -> str:
    """Save the bundle for a new incident; returns its folder. ``native_dump()`` (taken in the
    background: it pauses the ranks for a moment) returns native StackSamples. Raises OSError."""
    path = new_folder(state_dir, inc)
    diag = diagnosis.to_json() if diagnosis is not None else {}
    diag["incident"] = inc.to_json()
    write_json(os.path.join(path, "diagnosis.json"), diag)
    write_json(os.path.join(path, "procfs.json"), proc_details(job))
    write_json(os.path.join(path, "observations.json"), [_obs_json(o) for o in history[-MAX_OBSERVATIONS:]])
    if native_dump is not None:
        threading.Thread(target=_save_native, args=(native_dump, path), name="bundle", daemon=True).start()
    return path


def _obs_json(o: Observation) -> dict[str, Any]:
    d = asdict(o)
    d["type"] = type(o).__name__
    return d


def proc_details(job: Job) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in job.ranks:
        info: dict[str, Any] = {"pid": r.pid}
        if r.container_pid is not None:
            info["container_pid"] = r.container_pid
        for name in ("status", "wchan", "stack", "sched", "schedstat", "cmdline"):
            try:
                with open(f"/proc/{r.pid}/{name}", "rb") as f:
                    info[name] = f.read().decode(errors="replace").replace("\0", " ")
            except OSError as e:
                info[name] = f"unreadable: {e.strerror}"
        out[str(r.rank)] = info
    return out


def _save_native(native_dump: Any, path: str) -> None:
    try:
        dumps = native_dump()
        write_json(os.path.join(path, "stacks-native.json"),
                   {str(s.rank): {"pid": s.pid, "error": s.error,
                                  "threads": [t.to_json() for t in s.threads]} for s in dumps})
    except Exception as e:  # noqa: BLE001 - the bundle is best effort; say what is missing
        write_json(os.path.join(path, "stacks-native.json"), {"error": str(e)})
