"""``scout-sys certify``: may a job restart from these checkpoints?

Per checkpoint (a file, a DCP folder, or a folder of per-rank files):

- **content**: every file readable without running code, complete, every floating tensor finite;
  replicas (files of one folder with the same tensor names, shapes and dtypes, as DDP ranks each
  saving the model) equal tensor by tensor: files outside a strict majority are ``divergent``, two
  replicas that differ have no majority and are rejected together;
- **coverage** (the replay ledger): a complete clean replay round *of the job that wrote it* (matched
  by the files and folders the watch saw it write checkpoints in, its working directory, while it ran,
  or ``--job``: replay/writers.py) between the previous checkpoint (the newest older sibling) and this one; an sdc on a GPU (by UUID) it ran
  on, in any job's round before, rejects it. Other jobs' rounds never count.

``certified``: clean content and covered; ``rejected``: bad content, or sdc / inconclusive replay
rounds in that interval; ``unverified``: clean content, no covering round.
Output: one ``scout-sys/certificate/v1`` object (docs/replay.md).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from scout_sys.consensus import c3
from scout_sys.errors import ScoutError
from scout_sys.extras import require
from scout_sys.replay import checkpoint as ck
from scout_sys.replay import ledger
from scout_sys.replay.writers import clock as _clock
from scout_sys.replay.writers import describe, jobs_of, new_job, writer_of
from scout_sys.report import printable

SCHEMA = "scout-sys/certificate/v1"
CERTIFIED, UNVERIFIED, REJECTED = "certified", "unverified", "rejected"
_STEP = re.compile(r"(?:global_step|step|iter|iteration|ckpt|checkpoint|epoch)[-_]?(\d+)", re.I)


def step_of(path: str) -> int | None:
    parts = os.path.normpath(os.path.abspath(path)).split(os.sep)
    for part in reversed(parts):
        m = _STEP.search(part)
        if m:
            return int(m.group(1))
    m = re.search(r"(\d+)(?:\.\w+)?$", parts[-1])
    return int(m.group(1)) if m else None


def written_at(path: str) -> float:
    """When the checkpoint was complete: its newest file's modification time."""
    if not os.path.isdir(path):
        return os.stat(path).st_mtime
    times = [os.stat(os.path.join(path, n)).st_mtime for n in os.listdir(path)
             if os.path.isfile(os.path.join(path, n))]
    return max(times, default=os.stat(path).st_mtime)


def previous_checkpoint(path: str, t: float) -> tuple[str, float] | None:
    """The newest sibling checkpoint written before ``t``."""
    parent = os.path.dirname(os.path.abspath(path)) or "."
    me = os.path.abspath(path)
    best: tuple[str, float] | None = None
    try:
        names = os.listdir(parent)
    except OSError:
        return None
    for n in names:
        p = os.path.join(parent, n)
        if p == me or ck.kind_of(p) is None:
            continue
        w = written_at(p)
        if w < t and (best is None or w > best[1]):
            best = (p, w)
    return best


# --------------------------------------------------------------------------- content


def _content(path: str) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """(reasons to reject, divergent files, non-finite tensors) for one checkpoint."""
    kind = ck.kind_of(path)
    if kind == "folder":
        files = ck.folder_files(path)
        # Several files may be replicas: hash while reading (one pass), compare where layouts match.
        reports = _read_all(files, digests=len(files) >= 2)
        by_sig: dict[tuple, list[ck.FileReport]] = {}
        for r in reports:
            if r.error is None:
                by_sig.setdefault(r.signature(), []).append(r)
        replicas = [rs for rs in by_sig.values() if len(rs) >= 2]
    else:
        reports, replicas = [ck.read(path)], []
    reasons: list[str] = []
    divergent: list[str] = []
    nonfinite: list[dict[str, Any]] = []
    for r in reports:
        shown = _shown(path, r.path)
        if r.error:
            reasons.append(f"{shown}: {r.error}")
        for name, n in sorted(r.nonfinite.items()):
            nonfinite.append({"file": shown, "tensor": name, "count": n})
    if nonfinite:
        total = sum(x["count"] for x in nonfinite)
        reasons.append(f"{total} non-finite value(s) (NaN/Inf) in {len(nonfinite)} tensor(s), first "
                       f"{nonfinite[0]['file']}:{nonfinite[0]['tensor']}")
    for rs in replicas:
        names = sorted(rs[0].layout)
        v = c3.vote({i: tuple(r.digests.get(n) for n in names) for i, r in enumerate(rs)})
        files = [_shown(path, r.path) for r in rs]
        if v.status == c3.AGREE:
            continue
        if v.attributed:
            for i in v.minority:
                bad = [n for n in names if rs[i].digests.get(n) != rs[v.majority[0]].digests.get(n)]
                divergent.append(files[i])
                reasons.append(f"{files[i]} diverges from {len(v.majority)} of {len(rs)} replicas on {len(bad)} "
                               f"tensor(s), first {bad[0]}")
        else:
            reasons.append(f"replicas {', '.join(files)} differ with no strict majority: cannot tell which is right")
    if not reports:
        reasons.append("no checkpoint file in the folder")
    return reasons, divergent, nonfinite


def _read_all(files: Sequence[str], *, digests: bool = False) -> list[ck.FileReport]:
    """Read files side by side: hashing and torch's reductions release the GIL."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1, len(files)))) as pool:
        return list(pool.map(lambda f: ck.read(f, digests=digests), files))


def _shown(root: str, path: str) -> str:
    """A file as the user named it: the given path, or given folder + file name."""
    return root if os.path.abspath(root) == os.path.abspath(path) else os.path.join(root, os.path.basename(path))


# --------------------------------------------------------------------------- coverage


def _coverage(path: str, job: dict[str, Any] | None, how: str, jobs: dict[str, dict[str, Any]],
              rounds: Sequence[dict[str, Any]]) -> tuple[bool, list[str], dict[str, Any]]:
    t = written_at(path)
    prev = previous_checkpoint(path, t)
    lo = prev[1] if prev else float("-inf")
    since = f"since {prev[0]}" if prev else "before it"
    if job is None:
        return False, [f"unverified: {how}"], {"covered": False, "rounds": [], "bad": False}
    inside = [e for e in job["rounds"] if lo < float(e["time"]) <= t]
    bad = [e for e in inside if e.get("result") in (ledger.SDC, ledger.INCONCLUSIVE)]
    clean = [e for e in inside if e.get("result") == ledger.CLEAN]
    reasons: list[str] = []
    for e in bad:
        devs = [d["device"] for d in e.get("devices", ()) if d.get("result") == "divergent"]
        reasons.append(f"replay round of its {describe(job['ident'])} at {_clock(e['time'])} {since}: {e['result']}"
                       + (f" on {', '.join(devs)}" if devs else ""))
    # A GPU outlives a job: an sdc on one of its GPUs, in any job, before the file was written.
    seen = {id(e) for e in bad}
    gpu_bad = False
    for e in rounds:
        if id(e) in seen or float(e["time"]) > t:
            continue
        for d in e.get("devices", ()):
            if d.get("result") == "divergent" and d.get("uuid") in job["uuids"]:
                gpu_bad = True
                reasons.append(f"GPU {d['uuid']} computed other bits (sdc) in a replay round of "
                               f"{describe(e.get('job') or {})} at {_clock(e['time'])}; this checkpoint was computed "
                               "on it")
    if not bad and not clean and not gpu_bad:
        pid = job["ident"].get("launcher_pid") or "PID"
        reasons.append(f"no complete clean replay round of its {describe(job['ident'])} {since} (run one now: "
                       f"sudo scout-sys replay --job {pid}, while it trains)")
    summary = [{"time": e["time"], "result": e.get("result"), "complete": e.get("complete"),
                "devices": len(e.get("devices", ())), "job": (e.get("job") or {}).get("launcher_pid")}
               for e in inside]
    ok = bool(clean) and not bad and not gpu_bad
    return ok, reasons, {"covered": ok, "rounds": summary, "bad": bool(bad) or gpu_bad}


# --------------------------------------------------------------------------- the certificate


def certify(paths: Sequence[str], *, state_dir: str, job: dict[str, Any] | None = None,
            clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """The ``scout-sys/certificate/v1`` object for ``paths``. ``job``: the identity of the job that
    wrote them (``certify --job``, ``ledger.identity``), else each is matched to a job of the ledger.
    Raises ScoutError when it cannot run."""
    for p in paths:
        if not os.path.exists(p):
            raise ScoutError(f"no such path: {p}")
        if ck.kind_of(p) is None:
            raise ScoutError(f"{p} does not look like a checkpoint (a torch.save file, .safetensors, a DCP folder "
                             "with .metadata, or a folder of such files)")
    require("scout-sys certify", "replay", ("torch",))  # it reads tensors with torch
    lines = ledger.read(state_dir)
    rounds = [e for e in lines if "event" not in e]  # the replay rounds; the watch's lines say who wrote what
    jobs = jobs_of(lines)
    if job is not None:
        key = job.get("key") or ledger.job_key(job)
        named = jobs.get(key) or new_job(key, job)
    out = []
    for p in paths:
        reasons, divergent, nonfinite = _content(p)
        t = written_at(p)
        writer, how = (named, "named with --job") if job is not None else writer_of(p, t, jobs)
        covered, cov_reasons, replay = _coverage(p, writer, how, jobs, rounds)
        bad_replay = replay.pop("bad")
        if reasons or bad_replay:
            status = REJECTED
        elif covered:
            status = CERTIFIED
        else:
            status = UNVERIFIED
        # Replay reasons count when they reject (sdc, inconclusive) or are why it is unverified.
        all_reasons = reasons + (cov_reasons if bad_replay or status == UNVERIFIED else [])
        who = None if writer is None else {"key": writer["key"], "run_id": writer["ident"].get("run_id"),
                                           "launcher_pid": writer["ident"].get("launcher_pid"),
                                           "cwd": writer["ident"].get("cwd"), "matched": how}
        item = {"path": p, "step": step_of(p), "status": status, "reasons": all_reasons, "divergent": divergent,
                "nonfinite": nonfinite, "replay": replay, "job": who}
        out.append((t, item))
    items = [i for _, i in out]
    certified = [(t, i) for t, i in out if i["status"] == CERTIFIED]
    recommended = max(certified, key=lambda ti: ti[0])[1]["path"] if certified else None
    why, nxt = _advice(out, recommended)
    return {"schema": SCHEMA, "time": round(clock(), 3), "checkpoints": items, "recommended": recommended,
            "why": why, "next": nxt}


def _advice(dated: Sequence[tuple[float, dict[str, Any]]], recommended: str | None) -> tuple[str, str]:
    """(why ``recommended`` is what it is, what a person does next). With nothing certified, the
    newest *clean* checkpoint (unverified: only no replay round covered it) is never skipped for an
    older one: cover it while the job runs, else restart from it unless an older one certifies."""
    items = [i for _, i in dated]
    if recommended is not None:
        newer = [i for i in items if i["status"] != CERTIFIED]
        why = "the newest certified checkpoint given" + (
            f" ({len(newer)} other(s) not certified: see their reasons)" if newer else "")
        return why, f"restart from {recommended}"
    rejected = [i for i in items if i["status"] == REJECTED]
    unverified = [i for t, i in sorted(dated, key=lambda ti: ti[0]) if i["status"] == UNVERIFIED]
    if unverified:
        i = unverified[-1]
        gone = (f"; if the job is gone: certify older checkpoints too and restart from the newest certified, "
                f"else from {i['path']} (clean, not replay-checked)")
        if i["job"] is None:
            return ("no job of the replay ledger is known to have written it: see its reason",
                    "while the job runs: sudo scout-sys certify --job PID " + " ".join(x["path"] for x in items)
                    + " (or run a round: sudo scout-sys replay --job PID)" + gone)
        pid = i["job"].get("launcher_pid")
        return ("no clean replay round of its job covered it",
                f"run a round now: sudo scout-sys replay --job {pid or 'PID'}, then certify the next checkpoint"
                + gone)
    why = "; ".join(f"{i['path']}: {i['reasons'][0]}" for i in rejected[:3] if i["reasons"]) or "none is certified"
    return why, "go back to the previous certified checkpoint (certify the older ones to find it)"


def render_certificate(cert: dict[str, Any]) -> str:
    lines = []
    for c in cert["checkpoints"]:
        step = f" (step {c['step']})" if c["step"] is not None else ""
        lines.append(f"{c['status'].upper():<10} {c['path']}{step}")
        for r in c["reasons"]:
            lines.append(f"  - {r}")
        n = len(c["replay"]["rounds"])
        who = f" of {describe_item(c['job'])}" if c.get("job") else ""
        lines.append(f"  replay: {n} round{'s' if n != 1 else ''}{who} in its interval, "
                     f"{'covered' if c['replay']['covered'] else 'not covered'}")
    rec = cert["recommended"]
    lines.append(f"recommended: {rec}" if rec else f"recommended: none ({cert.get('why', 'no checkpoint is certified')})")
    if cert.get("next"):
        lines.append(f"next: {cert['next']}")
    return "\n".join(printable(x) for x in lines)


def describe_item(job: dict[str, Any]) -> str:
    return f"job {job.get('run_id') or '-'} (launcher pid {job.get('launcher_pid')}; {job.get('matched')})"
