"""Human-readable rendering of a :class:`~scout_sys.model.Diagnosis` (the same records as ``--json``)."""

from __future__ import annotations

import json
import time

from scout_sys.model import Diagnosis, Incident

_MAX_STACK = 12


def to_json(d: Diagnosis) -> str:
    return json.dumps(d.to_json(), indent=None, sort_keys=False)


def _ago(t: float, now: float) -> str:
    s = max(0.0, now - t)
    clock = time.strftime("%H:%M:%S", time.localtime(t))
    return f"{clock} ({s:.0f} s ago)" if s < 3600 else f"{clock} ({s / 3600:.1f} h ago)"


def render_incident(inc: Incident, now: float, *, verbose: bool = True) -> list[str]:
    head = f"INCIDENT {inc.kind} ({inc.status})"
    if inc.ranks:
        head += f": rank{'s' if len(inc.ranks) > 1 else ''} {', '.join(map(str, inc.ranks))}"
        head += f" on {', '.join(inc.hosts)}"
    lines = [head, f"  {inc.summary}", f"  since {_ago(inc.since, now)}"]
    if not verbose:
        return lines
    lines.append("  evidence:")
    for e in inc.evidence:
        lines.append(f"    [{e.source}] {e.text}")
        stack = e.data.get("stack")
        if stack:
            for fr in stack[:_MAX_STACK]:
                lines.append(f"        {fr}")
            if len(stack) > _MAX_STACK:
                lines.append(f"        ... {len(stack) - _MAX_STACK} more frames")
    return lines


def render(d: Diagnosis, *, verbose: bool = True) -> str:
    job = d.job
    launcher = f"{job.launcher} pid {job.launcher_pid}" if job.launcher_pid else job.launcher
    lines = [f"job: {job.world_size} ranks ({len(job.ranks)} found on {job.host}), launcher {launcher}, "
             f"window {d.window:.1f} s"]
    if d.healthy:
        lines.append("HEALTHY: no incident")
    for inc in d.incidents:
        lines += render_incident(inc, d.time, verbose=verbose)
    lines.append("ranks:")
    # ranks in their own PID namespace: the host's pid, and the container's that the job's logs print
    ctr = any(rk.container_pid is not None for rk in job.ranks)
    lines.append(f"  {'RANK':>5} {'PID':>8}  {'CTR PID  ' if ctr else ''}{'STATE':<10} {'CPU%':>5}  WHERE")
    views = d.views
    for r in sorted({x.rank for x in job.ranks} | set(job.missing)):
        rk = job.by_rank().get(r)
        v = views.get(r)
        cpu = "" if v is None or v.cpu_percent is None else f"{v.cpu_percent:.0f}"
        where = (v.collective or v.where) if v else ""
        cpid = f"{rk.container_pid if rk and rk.container_pid is not None else '-':>7}  " if ctr else ""
        lines.append(f"  {r:>5} {rk.pid if rk else '-':>8}  {cpid}{(v.state if v else '?'):<10} {cpu:>5}  {where}")
    off = {k: v for k, v in d.probes.items() if v}
    if off:
        lines.append("signals off: " + "; ".join(f"{k} ({v})" for k, v in off.items()))
    for n in d.notes:
        lines.append(f"note: {n}")
    return "\n".join(printable(x) for x in lines)


def printable(text: str) -> str:
    """Process names, paths and function names are untrusted: no terminal escape gets through."""
    return "".join(c if c.isprintable() else "?" for c in text)
