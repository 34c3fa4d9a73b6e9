"""A common-mode hang, told from a long healthy step by what still moves.

Every rank a host sees stopped at one place (inside one collective, or, in the GPU shape, spinning or
asleep at one sync point with no collective frame) while ranks of the job run on other hosts: the
origin is not among these ranks (``hang._common_mode``). A long healthy step (a big all-reduce, a
slow batch) looks the same on the main threads' stacks for a while; what tells them apart:

- **collective sequence numbers** (eBPF, ``--ebpf`` in diagnose): a rank that entered or finished a
  collective during the window progresses;
- **other threads' stacks** (a data loader, a communication thread): reported, not decisive (helper
  threads poll on a hung job too);
- **CPU time outside the spin**: the process's CPU time besides its main thread's (reported);
- in ``watch``, **the job's own step history** (added by the watch, which knows it).

A strict majority of the ranks whose collective sequence moved in the window is progress: the finding
is dropped (with a note). Otherwise the verdict says which signals were available and that none moved
(``hang._common_mode`` names the global ranks not observed here).

Pure: no I/O, no clocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from scout_sys.consensus import c3
from scout_sys.model import (
    HANG,
    INCONCLUSIVE,
    CollectiveSample,
    Evidence,
    Incident,
    Job,
    Observation,
    StackSample,
)
from scout_sys.text import ranks_text

MARK = "common_mode"  # data key of a common-mode finding's first evidence
OTHER_CPU = 0.10  # CPU outside the main thread (fraction of a core) worth saying "moves"


def is_common_mode(i: Incident) -> bool:
    return i.kind == HANG and i.status == INCONCLUSIVE and not i.ranks and bool(i.evidence) \
        and bool(i.evidence[0].data.get(MARK))


def _collectives(obs: Sequence[Observation], ranks: Sequence[int], window: tuple[float, float]) -> dict[int, float]:
    """rank -> last collective entry / exit, for the ranks the collectives probe reported."""
    out: dict[int, float] = {}
    ranks = set(ranks)  # looked up per sample
    for o in obs:
        if isinstance(o, CollectiveSample) and o.rank in ranks:
            t = max((x for x in (o.last_enter, o.last_exit) if x is not None), default=0.0)
            out[o.rank] = max(out.get(o.rank, 0.0), t)
    return out


def _threads_moved(obs: Sequence[Observation], ranks: Sequence[int]) -> tuple[dict[int, list[str]], int]:
    """rank -> names of its non-main threads whose stack changed over the window; how many ranks had two
    stack samples or more."""
    per: dict[int, list[StackSample]] = {}
    ranks = set(ranks)  # looked up per sample
    for o in obs:
        if isinstance(o, StackSample) and not o.native and o.error is None and o.rank in ranks:
            per.setdefault(o.rank, []).append(o)
    moved: dict[int, list[str]] = {}
    sampled = 0
    for r, ss in per.items():
        if len(ss) < 2:
            continue
        sampled += 1
        seen: dict[int, set] = {}
        names: dict[int, str] = {}
        for s in ss:
            main = s.main()
            for t in s.threads:
                if main is not None and t.tid == main.tid:
                    continue
                seen.setdefault(t.tid, set()).add(tuple((f.file, f.function, f.line) for f in t.frames))
                names[t.tid] = t.name or str(t.tid)
        moving = sorted(names[tid] for tid, stacks in seen.items() if len(stacks) > 1)
        if moving:
            moved[r] = moving
    return moved, sampled


def signals(job: Job, acts: Mapping[int, Any], obs: Sequence[Observation], ranks: Sequence[int],
            window: tuple[float, float]) -> tuple[bool, Evidence]:
    """(whether a strict majority of ``ranks`` progressed by its collective sequence, the evidence of
    every progress signal: available or not, moved or not)."""
    ranks = sorted(ranks)
    parts: list[str] = []
    data: dict[str, Any] = {"ranks": ranks, "window": [round(window[0], 3), round(window[1], 3)]}
    coll = _collectives(obs, ranks, window)
    progressed = False
    if coll:
        moved = sorted(r for r, t in coll.items() if t >= window[0])
        progressed = c3.strict_majority(len(moved), len(ranks))
        last = max(coll.values())
        parts.append(f"collective sequence numbers (eBPF) of {ranks_text(sorted(coll))}: "
                     + (f"moved on {ranks_text(moved)}" if moved
                        else f"unchanged (the last call {max(0.0, window[1] - last):.1f} s before the window's end)"))
        data["collectives"] = {"available": True, "moved": moved}
    else:
        parts.append("collective sequence numbers: not available (no eBPF collective probe: diagnose --ebpf)")
        data["collectives"] = {"available": False}
    threads, sampled = _threads_moved(obs, ranks)
    if sampled:
        parts.append("other threads' stacks: " + ("; ".join(f"rank {r}: {', '.join(n)} moved" for r, n in
                                                          sorted(threads.items())) or "still"))
        data["threads"] = {"available": True, "moved": {str(r): n for r, n in sorted(threads.items())}}
    else:
        parts.append("other threads' stacks: not available (fewer than two stack samples)")
        data["threads"] = {"available": False}
    other = {r: a.cpu - a.main_cpu for r in ranks if (a := acts.get(r)) is not None
             and a.cpu is not None and a.main_cpu is not None}
    if other:
        busy = sorted(r for r, x in other.items() if x >= OTHER_CPU)
        parts.append("CPU time outside the main thread: " + ", ".join(
            f"rank {r} {100 * max(0.0, x):.0f}%" for r, x in sorted(other.items())) + " of a core")
        data["cpu_outside_main_percent"] = {str(r): round(100 * max(0.0, x), 1) for r, x in sorted(other.items())}
        data["cpu_outside_main_moves"] = busy
    else:
        parts.append("CPU time outside the main thread: not available")
    text = "progress signals: " + "; ".join(parts)
    return progressed, Evidence("ebpf" if coll else "procfs", text, data={"progress_signals": data})


def available_text(ev: Evidence) -> str:
    """``collective sequence numbers, stacks, CPU time`` (the signals that were there)."""
    d = ev.data.get("progress_signals", {})
    names = []
    if d.get("collectives", {}).get("available"):
        names.append("collective sequence numbers")
    names.append("main-thread stacks")
    if d.get("threads", {}).get("available"):
        names.append("other threads' stacks")
    if "cpu_outside_main_percent" in d:
        names.append("CPU time")
    return ", ".join(names)


def review(job: Job, incidents: list[Incident], acts: Mapping[int, Any], obs: Sequence[Observation],
           window: tuple[float, float]) -> tuple[list[Incident], list[str]]:
    """Every common-mode finding with its progress signals; dropped (a note) when the collective
    sequence of a strict majority moved (a long step, not a hang)."""
    out, notes = [], []
    for i in incidents:
        if not is_common_mode(i):
            out.append(i)
            continue
        ranks = i.evidence[0].data.get("ranks", [])
        progressed, ev = signals(job, acts, obs, ranks, window)
        if progressed:
            notes.append(f"{ranks_text(ranks)} stood at one place, but their collective sequence moved in the "
                         "window: a long step, not a hang")
            continue
        out.append(replace(i, summary=f"{i.summary}; progress signals available: {available_text(ev)}, "
                           "none moved", evidence=i.evidence + (ev,)))
    return out, notes
