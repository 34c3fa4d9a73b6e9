"""Process exit: which rank died first, how, and who killed it.

From the ebpf lifecycle records (:class:`~scout_sys.model.ExitRecord`, ``SignalRecord``,
``OomRecord``). The first rank to end is the origin; ranks that ended after it are consequences
(typically SIGTERM from the launcher), listed as evidence with their killer. A signal's sender is
the last generator of that signal for that process at or before its end. Ties for first place
(within ``TIE`` seconds) name every tied rank. Exits with status 0 are not deaths: while every exit
seen is clean there is no incident — the job is finishing (its ranks end a moment apart), and a rank
that left early with 0 while the others wait for it is named by the hang rules when they stall.

Pure: no I/O, no clocks.
"""

from __future__ import annotations

from collections.abc import Sequence

from scout_sys.model import (
    ATTRIBUTED,
    PROCESS_EXIT,
    Evidence,
    ExitRecord,
    Incident,
    Job,
    Observation,
    OomRecord,
    ProcSample,
    SignalRecord,
)
from scout_sys.text import signal_name

TIE = 0.0005  # seconds


def killer(sig_records: Sequence[SignalRecord], e: ExitRecord) -> SignalRecord | None:
    """Who sent the signal that killed ``e`` (the latest sender of that signal before the end)."""
    if not e.signal:
        return None
    cands = [s for s in sig_records if s.pid == e.pid and s.signal == e.signal and s.first_time <= e.time + TIE]
    return max(cands, key=lambda s: s.time, default=None)


def describe(e: ExitRecord, k: SignalRecord | None, oom: OomRecord | None) -> str:
    text = e.describe()
    if oom is not None:
        text += " (chosen by the kernel OOM killer)"
    elif k is not None:
        sender = "itself" if k.sender_pid == e.pid else f"pid {k.sender_pid} ({k.sender_comm})"
        text += f", sent by {sender}"
    return text


def _evidence(e: ExitRecord, k: SignalRecord | None, oom: OomRecord | None, role: str) -> Evidence:
    data: dict = {"pid": e.pid, "time": round(e.time, 6), "exit_code": e.exit_code,
                  "signal": signal_name(e.signal) if e.signal else None, "role": role}
    if k is not None:
        data.update(sender_pid=k.sender_pid, sender_comm=k.sender_comm, si_code=k.code)
    if oom is not None:
        data["oom"] = True
        if oom.anon_rss_kb:
            data["anon_rss_kb"] = oom.anon_rss_kb
    return Evidence("ebpf", f"rank {e.rank} (pid {e.pid}) {describe(e, k, oom)} at {e.time:.6f}",
                    rank=e.rank, data=data)


def clean_ends(obs: Sequence[Observation]) -> frozenset[int]:
    """The pids of the ranks that ended cleanly, status 0 and no signal, by the exit probe's record or
    a zombie's status read from /proc (a rank reaped at once, without eBPF, is not known to be one).
    Pids, not ranks: a restarted job's rank is a new process."""
    clean: set[int] = set()
    unclean: set[int] = set()
    for o in obs:
        if isinstance(o, ExitRecord) or (isinstance(o, ProcSample) and o.status == "zombie"):
            code, sig = (o.exit_code, o.signal) if isinstance(o, ExitRecord) else (o.exit_code, o.exit_signal)
            (clean if code == 0 and not sig else unclean).add(o.pid)
    return frozenset(clean - unclean)


def analyze(job: Job, obs: Sequence[Observation]) -> list[Incident]:
    exits: dict[int, ExitRecord] = {}
    for o in obs:
        if isinstance(o, ExitRecord) and (o.rank not in exits or o.time < exits[o.rank].time):
            exits[o.rank] = o
    if not exits:
        return []
    if all(e.exit_code == 0 and not e.signal for e in exits.values()):
        return []  # finished, or finishing: clean exits so far
    sigs = [o for o in obs if isinstance(o, SignalRecord)]
    ooms = {o.pid: o for o in obs if isinstance(o, OomRecord)}
    order = sorted(exits.values(), key=lambda e: (e.time, e.rank))
    first_t = order[0].time
    first = [e for e in order if e.time - first_t <= TIE]
    later = [e for e in order if e.time - first_t > TIE]

    ev: list[Evidence] = []
    for e in first:
        ev.append(_evidence(e, killer(sigs, e), ooms.get(e.pid), "first"))
    for e in later:
        ev.append(_evidence(e, killer(sigs, e), ooms.get(e.pid), "after"))
    head = first[0]
    what = describe(head, killer(sigs, head), ooms.get(head.pid))
    ranks = tuple(sorted(e.rank for e in first))
    summary = (f"rank {head.rank} died first: {what}" if len(first) == 1
               else f"ranks {', '.join(map(str, ranks))} died together first: {what}")
    if later:
        summary += f"; {len(later)} more rank{'s' if len(later) > 1 else ''} ended after it"
    return [Incident(kind=PROCESS_EXIT, status=ATTRIBUTED, ranks=ranks,
                     hosts=tuple(sorted({job.host_of(r) for r in ranks})), since=first_t,
                     summary=summary, evidence=tuple(ev))]
