"""The job's process groups as learned from outside, one model whatever learned them: the newest
sample of each source (probes/pgroups.py: Gloo's sockets; probes/ebpf/comms.py: NCCL communicator
creation) merged; and, from the NCCL groups' sequence numbers, where a GPU-shaped rank waits.

Pure: no I/O, no clocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def merged(obs: Sequence[Any]) -> Any | None:
    """The job's process groups: the newest :class:`~scout_sys.model.ProcessGroupSample` with at least
    one group of each source (Gloo's sockets, NCCL communicator creation), merged into one."""
    from dataclasses import replace

    from scout_sys.model import ProcessGroupSample

    best: dict[str, Any] = {}
    for o in obs:
        if isinstance(o, ProcessGroupSample) and o.groups and (o.source not in best or o.time >= best[o.source].time):
            best[o.source] = o
    if len(best) < 2:
        return next(iter(best.values()), None)
    groups: list[tuple[int, ...]] = []
    where: dict[tuple[tuple[int, ...], bool], int] = {}
    partial: list[int] = []
    waits: dict[int, int] = {}
    seqs: dict[tuple[int, int], int] = {}
    handles, latest, notes = [], [], []
    for source in sorted(best, key=lambda src: src != "procfs"):  # Gloo's sends first: a waiting frame's own
        smp = best[source]
        index = []
        for i, g in enumerate(smp.groups):
            tag = (tuple(g), i in smp.partial)
            if tag not in where:
                where[tag] = len(groups)
                if tag[1]:
                    partial.append(len(groups))
                groups.append(tuple(g))
            index.append(where[tag])
        for r, g in smp.waits_in:
            waits.setdefault(r, index[g])
        for r, g, n in smp.seqs:
            seqs[(r, index[g])] = seqs.get((r, index[g]), 0) + n
        handles += [(r, h, index[g]) for r, h, g in smp.handles]
        latest += [(r, index[g], *rest) for r, g, *rest in smp.latest]
        notes += list(smp.notes)
    newest = max(best.values(), key=lambda o: o.time)
    return replace(newest, groups=tuple(groups), partial=tuple(partial), waits_in=tuple(sorted(waits.items())),
                   seqs=tuple((r, g, n) for (r, g), n in sorted(seqs.items())), handles=tuple(handles),
                   latest=tuple(latest), notes=tuple(notes), source="+".join(sorted(best)))


def gpu_waits(sample: Any, acts: Mapping[int, Any]) -> dict[int, tuple[int, str]]:
    """Ranks waiting in the GPU shape (spinning or asleep at a sync point, no collective frame) and
    where: rank -> (group, collective). Such a rank waits in the group of its latest NCCL collective
    (learned at communicator creation, probes/ebpf/comms.py) when a member of that group is behind it
    in the group's sequence, i.e. has not entered that collective yet; else that collective is done."""
    if not sample.seqs:
        return {}
    seq = {(r, g): n for r, g, n in sample.seqs}
    out: dict[int, tuple[int, str]] = {}
    for r, g, op, _when in sample.latest:
        a = acts.get(r)
        if a is None or a.state not in ("busy", "idle") or (r, g) not in seq or not 0 <= g < len(sample.groups):
            continue
        n = seq[(r, g)]
        if any(seq.get((m, g), n) < n for m in sample.groups[g]):
            out[r] = (g, f"nccl {op or 'collective'} #{n}")
    return out


def gpu_stall(sample: Any, acts: Mapping[int, Any], window: tuple[float, float]) -> bool:
    """No rank entered an NCCL collective during the window, none moved, and some wait for a member
    behind them: a GPU-shaped stall the stack rules cannot see when every rank sits still and off CPU
    (a healthy step longer than the window looks the same to them, not to the sequence numbers)."""
    return bool(sample.latest) and all(when < window[0] for *_x, when in sample.latest) and \
        not any(a.state == "running" for a in acts.values()) and bool(gpu_waits(sample, acts))
