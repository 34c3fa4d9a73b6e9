"""Collective desync: ranks of one peer group that left the common collective sequence.

From :class:`~scout_sys.model.CollectiveSample` (probe: ebpf collectives), per peer group and per
process group (``gloo:0``, ``nccl:1``, ...), using each rank's latest sample:

1. **Different collective at the same position.** At each sequence position every rank has a
   fingerprint for (oldest first), C3 votes on the fingerprint key (op, element count, dtype,
   reduction). The first position where a strict majority agrees and a minority differs names that
   minority: it called another collective, or the same one with another size / dtype / op.
2. **Behind or ahead while the majority waits.** When a strict majority sits inside collective
   ``#n`` for at least ``min_wait`` seconds, C3 votes on the sequence positions: ranks at another
   position are behind (they have not reached ``#n``) or ahead.

No strict majority: one ``inconclusive`` incident with every rank's evidence. Point-to-point calls
(send / recv) are not part of the sequence. Pure: no I/O, no clocks.
"""

from __future__ import annotations

from collections.abc import Sequence

from scout_sys.consensus import c3
from scout_sys.model import (
    ATTRIBUTED,
    DESYNC,
    INCONCLUSIVE,
    CollectiveSample,
    Evidence,
    Fingerprint,
    Incident,
    Job,
    Observation,
)
from scout_sys.text import ranks_text

MIN_WAIT = 1.0  # seconds the majority must have been inside the collective for rule 2
# The GPU shape: an asynchronous collective returns at once, so nobody is "inside" it; a majority that
# has issued nothing for this long, all at the same position, waits for it just the same.
QUIET_ASYNC = 3.0


def latest(obs: Sequence[Observation]) -> dict[tuple[str, int], CollectiveSample]:
    """(group, rank) -> the newest CollectiveSample."""
    out: dict[tuple[str, int], CollectiveSample] = {}
    for o in obs:
        if isinstance(o, CollectiveSample):
            key = (o.group, o.rank)
            if key not in out or o.time >= out[key].time:
                out[key] = o
    return out


def analyze(job: Job, obs: Sequence[Observation], *, min_wait: float = MIN_WAIT) -> list[Incident]:
    samples = latest(obs)
    out: list[Incident] = []
    for pg in sorted({g for g, _ in samples}):
        for peers in job.groups():
            group = {r: samples[(pg, r)] for r in peers if (pg, r) in samples}
            if len(group) >= 2:
                out.extend(_analyze(job, pg, group, min_wait))
    return out


def _fp_evidence(rank: int, s: CollectiveSample, f: Fingerprint | None, note: str = "") -> Evidence:
    text = f"rank {rank} {s.group}: " + (f.describe() if f else f"no collective seen (seq {s.seq})")
    if note:
        text += f" ({note})"
    data: dict = {"group": s.group, "seq": s.seq, "inside": s.inside}
    if f is not None:
        data["fingerprint"] = f.to_json()
    if s.waiting_peer is not None:
        data["waiting_peer"] = s.waiting_peer
    return Evidence("ebpf", text, rank=rank, data=data)


def _analyze(job: Job, pg: str, group: dict[int, CollectiveSample], min_wait: float) -> list[Incident]:
    hosts = lambda ranks: tuple(sorted({job.host_of(r) for r in ranks}))  # noqa: E731
    by_seq = {r: {f.seq: f for f in s.recent} for r, s in group.items()}

    # Rule 1: the first common position where a minority's fingerprint differs.
    common = set.intersection(*(set(m) for m in by_seq.values())) if by_seq else set()
    for pos in sorted(common):
        v = c3.vote({r: by_seq[r][pos].key() for r in group})
        if v.status == c3.AGREE:
            continue
        if v.status == c3.ATTRIBUTED:
            maj = by_seq[v.majority[0]][pos]
            ev = [_fp_evidence(r, group[r], by_seq[r][pos], "differs") for r in v.minority]
            ev.append(Evidence("ebpf", f"{ranks_text(v.majority)} {pg}: {maj.describe()}",
                               data={"group": pg, "ranks": list(v.majority), "fingerprint": maj.to_json()}))
            diff = "; ".join(f"rank {r}: {by_seq[r][pos].describe()}" for r in v.minority)
            return [Incident(
                kind=DESYNC, status=ATTRIBUTED, ranks=v.minority, hosts=hosts(v.minority),
                since=min(by_seq[r][pos].time for r in v.minority),
                summary=(f"{ranks_text(v.minority)} called a different collective at {pg} #{pos}: "
                         f"{diff}; the other {len(v.majority)} called {maj.describe()}"),
                evidence=tuple(ev))]
        return [Incident(
            kind=DESYNC, status=INCONCLUSIVE, ranks=(), hosts=hosts(group),
            since=min(by_seq[r][pos].time for r in group),
            summary=f"ranks disagree on the collective at {pg} #{pos} and no strict majority agrees",
            evidence=tuple(_fp_evidence(r, group[r], by_seq[r][pos]) for r in sorted(group)))]

    # Rule 2: a strict majority waits in the same collective (inside it, or, asynchronous, issued and
    # nothing since); who is elsewhere in the sequence.
    v = c3.vote({r: s.seq for r, s in group.items()})
    if v.status != c3.ATTRIBUTED:
        return []
    waiting = [r for r in v.majority if group[r].last_enter is not None
               and group[r].time - group[r].last_enter >= (min_wait if group[r].inside else max(min_wait, QUIET_ASYNC))]
    if 2 * len(waiting) <= len(group):
        return []
    seq = v.signature
    behind = tuple(r for r in v.minority if group[r].seq < seq)  # type: ignore[operator]
    ahead = tuple(r for r in v.minority if group[r].seq > seq)  # type: ignore[operator]
    since = min(group[r].last_enter or group[r].time for r in waiting)
    maj_fp = group[v.majority[0]].last
    ev = [_fp_evidence(r, group[r], group[r].last,
                       "behind" if r in behind else "ahead") for r in v.minority]
    ev.append(Evidence(
        "ebpf", f"{ranks_text(waiting)} waiting in {pg} " + (maj_fp.describe() if maj_fp else f"#{seq}")
        + f" since {since:.3f}", data={"group": pg, "ranks": list(waiting), "seq": seq}))
    parts = []
    if behind:
        parts.append(f"{ranks_text(behind)} behind (at " + ", ".join(f"#{group[r].seq}" for r in behind) + ")")
    if ahead:
        parts.append(f"{ranks_text(ahead)} ahead (at " + ", ".join(f"#{group[r].seq}" for r in ahead) + ")")
    return [Incident(
        kind=DESYNC, status=ATTRIBUTED, ranks=v.minority, hosts=hosts(v.minority), since=since,
        summary=(f"{' and '.join(parts)} in the {pg} collective sequence while "
                 f"{len(waiting)} ranks wait in #{seq}"),
        evidence=tuple(ev))]


def last_progress(obs: Sequence[Observation]) -> dict[int, float]:
    """rank -> the last time it entered or finished a collective (hang onset, from eBPF)."""
    out: dict[int, float] = {}
    for s in latest(obs).values():
        t = max(x for x in (s.last_enter, s.last_exit, 0.0) if x is not None)
        if t:
            out[s.rank] = max(out.get(s.rank, 0.0), t)
    return out
