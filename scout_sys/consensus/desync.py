"""Collective desync: ranks of one peer group that left the common collective sequence.

From :class:`~scout_sys.model.CollectiveSample` (probe: ebpf collectives), per peer group and per
process group (``gloo:0``, ``nccl:1``, ...), using each rank's latest sample:

1. **Different collective at the same position.** At each sequence position every rank has a
   fingerprint for (oldest first), C3 votes on the fingerprint key (op, element count, dtype,
   reduction). The first position where a strict majority agrees and a minority differs names that
   minority: it called another collective, or the same one with another size / dtype / op.
2. **Behind or ahead while the majority waits.** When a strict majority sits inside collective
   ``#n`` for at least ``min_wait`` seconds, C3 votes on the sequence positions: ranks at another
   position are behind (they have not reached ``#n``) or ahead. Only when the ranks at ``#n`` agree
   on its fingerprint: a split there is rule 1's to decide once the late ranks' calls are seen (a
   rank that reaches ``#n`` a second late is not behind while the others already disagree), unless
   enough of the peer group agree at ``#n`` that the late ranks cannot change it (then rule 1 names
   the differing ones now).

3. **Across equivalent groups.** Where a peer group cannot tell (one call against another: a tie
   within a pair), the same position of the same process group is compared over the ranks of every
   equivalent peer group (:func:`equivalents`: the other tensor-parallel groups of a dp x tp job):
   two equivalent groups of two give four ranks, and three of four are a strict majority. The rank
   whose call differs from theirs is the origin, with the position and every rank's fingerprint.

No strict majority: one ``inconclusive`` incident with every rank's evidence, once every rank of the
peer group has a sample (until then a missing rank could make the majority: nothing is said yet).
Point-to-point calls (send / recv) are not part of the sequence. Pure: no I/O, no clocks.

Each rank numbers its process groups (``gloo:0``, ``gloo:1``, ...) in the order the probe first saw
them called. A probe attached to a running job sees each rank first somewhere else in its step (one in
its tensor-parallel all-reduce, another in the data-parallel one), so the numbers are first *aligned*
(:func:`align`): a rank's group takes the number of the reference rank's group whose calls it shares
most (the op, size, dtype and reduction of its latest calls), the reference being the rank that sees the most
groups.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

from scout_sys.consensus import c3
from scout_sys.consensus.collgroups import label_of, position
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


SHAPE_CALLS = 6  # a group's latest calls that identify it across ranks


def _shape(s: CollectiveSample) -> frozenset:
    return frozenset([(f.op, f.count, f.dtype, f.redop) for f in s.recent[-SHAPE_CALLS:]])  # Fingerprint.key


def align(samples: dict[tuple[str, int], CollectiveSample]) -> dict[tuple[str, int], CollectiveSample]:
    """The same group under the same name on every rank (see the module's docstring). A rank's group
    that shares no call with the reference's keeps its number, or, when another group of the rank took
    that number, a name of its own (never compared). Ranks whose groups look alike are matched once."""
    by_rank: dict[tuple[str, int], dict[str, CollectiveSample]] = defaultdict(dict)
    for (pg, rank), smp in samples.items():
        by_rank[(pg.split(":", 1)[0], rank)][pg] = smp
    out: dict[tuple[str, int], CollectiveSample] = {}
    for backend in sorted({b for b, _ in by_rank}):
        ranks = sorted(r for b, r in by_rank if b == backend)
        ref_rank = max(ranks, key=lambda r: (len(by_rank[(backend, r)]), -r))
        ref = {pg: _shape(smp) for pg, smp in by_rank[(backend, ref_rank)].items()}
        seen: dict[tuple, dict[str, str]] = {}
        for r in ranks:
            mine = by_rank[(backend, r)]
            shapes = tuple(sorted((pg, _shape(smp)) for pg, smp in mine.items()))
            if shapes not in seen:
                seen[shapes] = {pg: pg for pg in mine} if r == ref_rank else _match(dict(shapes), ref)
            names = seen[shapes]
            for pg, smp in mine.items():
                name = names.get(pg, f"{pg}@{r}")
                out[(name, r)] = smp if name == pg else replace(smp, group=name)
    return out


def _match(mine: dict[str, frozenset], ref: dict[str, frozenset]) -> dict[str, str]:
    """Greedy: the pairs sharing most calls first; ties keep a group's own number."""
    scored = []
    for pg, calls in mine.items():
        for rpg, rcalls in ref.items():
            shared = len(calls & rcalls)
            if shared:
                scored.append((-shared / len(calls | rcalls), rpg != pg, pg, rpg))
    names: dict[str, str] = {}
    for _score, _moved, pg, rpg in sorted(scored):
        if pg not in names and rpg not in names.values():
            names[pg] = rpg
    for pg in mine:  # shares no call with any: its own number, unless another group took it
        if pg not in names and pg not in names.values():
            names[pg] = pg
    return names


def analyze(job: Job, obs: Sequence[Observation], *, min_wait: float = MIN_WAIT) -> list[Incident]:
    samples = align(latest(obs))
    out: list[Incident] = []
    for pg in sorted({g for g, _ in samples}):
        found: list[tuple[tuple[int, ...], list[Incident]]] = []
        for peers in job.groups():
            group = {r: samples[(pg, r)] for r in peers if (pg, r) in samples}
            if len(group) >= 2:
                found.append((tuple(peers), _analyze(job, pg, group, min_wait, len(peers))))
        out.extend(_across_equivalents(job, pg, samples, found))
    return out


def equivalents(job: Job) -> tuple[tuple[int, ...], ...]:
    """Ranks whose process groups of one kind are equivalent (:func:`scout_sys.consensus.peers.work_groups`:
    every coordinate but dp, tp and cp equal): the other tensor-parallel groups of a dp x tp job issue
    the same collectives in the same order as this one, so a position of one group's sequence is
    compared with the same position of every equivalent group's. Pipeline stages are kept apart (their
    shards, hence their collectives' sizes, differ)."""
    from scout_sys.consensus.peers import work_groups  # peers -> waitresolve; imported late, no cycle

    return work_groups(job)


def _across_equivalents(job: Job, pg: str, samples: dict[tuple[str, int], CollectiveSample],
                        found: list[tuple[tuple[int, ...], list[Incident]]]) -> list[Incident]:
    """The peer groups' findings on ``pg``, where a peer group could not tell (one against one, a tie)
    decided by the ranks of every equivalent group: a strict majority of them at a sequence position
    names the rank whose call there differs (rule 1 over the wider set)."""
    out = [i for _, inc in found for i in inc]
    if not any(i.status == INCONCLUSIVE for i in out):
        return out
    for wide in equivalents(job):
        inside = [(peers, inc) for peers, inc in found if set(peers) <= set(wide)]
        if len(inside) < 2 or any(i.status == ATTRIBUTED for _, inc in inside for i in inc):
            continue
        tied = [i for _, inc in inside for i in inc if i.status == INCONCLUSIVE]
        if not tied:
            continue
        group = {r: samples[(pg, r)] for r in wide if (pg, r) in samples}
        named = _differing(job, pg, group, [p for p, _ in inside])
        if named is not None:
            out = [i for i in out if not any(i is t for t in tied)] + [named]
    return out


def _first_disagreement(group: dict[int, CollectiveSample]
                        ) -> tuple[int, c3.Vote, dict[int, dict[int, Fingerprint]]] | None:
    """The first sequence position every rank of ``group`` has seen where their fingerprints do not
    all agree: (position, the vote there, rank -> seq -> fingerprint); None when all agree."""
    by_seq = {r: {f.seq: f for f in s.recent} for r, s in group.items()}
    common: set[int] = set(next(iter(by_seq.values()), ()))
    for m in by_seq.values():
        common.intersection_update(m)
    for pos in sorted(common):
        fps = {r: by_seq[r][pos] for r in group}
        keys = [f.key() for f in fps.values()]
        if all(k == keys[0] for k in keys):
            continue  # every rank called the same (the vote would agree, known fields or not)
        v = _vote_at(pos, fps)
        if v.status != c3.AGREE:
            return pos, v, by_seq
    return None


def _vote_at(pos: int, fps: dict[int, Fingerprint]) -> c3.Vote:
    """The vote on the fingerprints ``fps`` (rank -> its call at ``pos``). A field the probe could not
    read on some rank (None: its memory was not readable at that instant, e.g. paged out during a
    checkpoint write) is compared on no rank at this position: unknown is not different. The op is
    always read."""
    keys = {r: f.key() for r, f in fps.items()}
    width = len(next(iter(keys.values())))
    known = [i for i in range(width) if all(k[i] is not None for k in keys.values())]
    if len(known) < width:
        keys = {r: tuple(k[i] for i in known) for r, k in keys.items()}
    return c3.vote(keys)


def _minority_call(job: Job, pg: str, group: dict[int, CollectiveSample], pos: int, v: c3.Vote,
                   by_seq: dict[int, dict[int, Fingerprint]], others: str, extra: tuple[Evidence, ...] = ()
                   ) -> Incident:
    """Rule 1's verdict: the attributed minority's calls at ``pos`` against the majority's."""
    maj = by_seq[v.majority[0]][pos]
    ev = [_fp_evidence(r, group[r], by_seq[r][pos], DIFFERS) for r in v.minority]
    ev.append(Evidence("ebpf", f"{ranks_text(v.majority)} {label_of(pg, [group[r] for r in v.majority])}: "
                       f"{maj.describe()}",
                       data={"group": pg, "ranks": list(v.majority), "fingerprint": maj.to_json()}))
    diff = "; ".join(f"rank {r}: {by_seq[r][pos].describe()}" for r in v.minority)
    return Incident(
        kind=DESYNC, status=ATTRIBUTED, ranks=v.minority,
        hosts=tuple(sorted({job.host_of(r) for r in v.minority})),
        since=min(by_seq[r][pos].time for r in v.minority),
        summary=(f"{ranks_text(v.minority)} called a different collective at "
                 f"{position(pg, [group[r] for r in v.minority], pos)}: {diff}; "
                 f"the other {len(v.majority)} {others} {maj.describe()}"),
        evidence=(*ev, *extra))


def _differing(job: Job, pg: str, group: dict[int, CollectiveSample],
               peer_groups: list[tuple[int, ...]]) -> Incident | None:
    """Rule 1 over the ranks of equivalent groups: the first common position where a strict majority
    agrees and a minority differs; None when every position agrees or none has a strict majority."""
    found = _first_disagreement(group)
    if found is None or found[1].status != c3.ATTRIBUTED:
        return None
    pos, v, by_seq = found
    maj = by_seq[v.majority[0]][pos]
    groups_text = "; ".join("(" + ", ".join(map(str, g)) + ")" for g in peer_groups)
    across = Evidence(
        "ebpf", f"within its peer group one call stands against another (a tie); across the "
        f"{len(peer_groups)} equivalent peer groups {groups_text}, {len(v.majority)} of {len(group)} ranks "
        f"called {maj.describe()} at {position(pg, group.values(), pos)}",
        data={"group": pg, "position": pos, "equivalent_groups": [list(g) for g in peer_groups],
              "fingerprints": {str(r): by_seq[r][pos].to_json() for r in sorted(group)}})
    return _minority_call(job, pg, group, pos, v, by_seq, "ranks of its equivalent groups called", (across,))


DIFFERS = "differs"  # evidence of a rank whose fingerprint differs from the majority's at one position


def fingerprint_differs(inc: Incident) -> bool:
    """A desync that names a rank calling another collective (op, size, type) where the majority agrees,
    not one only behind in the sequence."""
    return inc.kind == DESYNC and bool(inc.ranks) and any(e.data.get(DIFFERS) for e in inc.evidence)


def _fp_evidence(rank: int, s: CollectiveSample, f: Fingerprint | None, note: str = "") -> Evidence:
    where = label_of(s.group, [s])
    text = f"rank {rank} {'in ' if where != s.group else ''}{where}: " + (f.describe() if f else f"no collective seen (seq {s.seq})")
    if note:
        text += f" ({note})"
    data: dict = {"group": s.group, "seq": s.seq, "inside": s.inside}
    if s.members:
        data["members"] = list(s.members)
    if note == DIFFERS:
        data[DIFFERS] = True  # a value for the rules (rules._not_progressing, the watch's trigger)
    if f is not None:
        data["fingerprint"] = f.to_json()
    if s.waiting_peer is not None:
        data["waiting_peer"] = s.waiting_peer
    return Evidence("ebpf", text, rank=rank, data=data)


def _analyze(job: Job, pg: str, group: dict[int, CollectiveSample], min_wait: float, peers: int) -> list[Incident]:
    hosts = lambda ranks: tuple(sorted({job.host_of(r) for r in ranks}))  # noqa: E731

    # Rule 1: the first common position where a minority's fingerprint differs.
    found = _first_disagreement(group)
    if found is not None:
        pos, v, by_seq = found
        if v.status == c3.ATTRIBUTED:
            return [_minority_call(job, pg, group, pos, v, by_seq, "called")]
        if len(group) < peers:
            return []  # a peer whose calls are not seen yet could make the majority: judge it later
        return [Incident(
            kind=DESYNC, status=INCONCLUSIVE, ranks=(), hosts=hosts(group),
            since=min(by_seq[r][pos].time for r in group),
            summary=f"ranks disagree on the collective at {position(pg, group.values(), pos)} and no strict "
                    "majority agrees",
            evidence=tuple(_fp_evidence(r, group[r], by_seq[r][pos]) for r in sorted(group)))]

    # Rule 2: a strict majority waits in the same collective (inside it, or, asynchronous, issued and
    # nothing since); who is elsewhere in the sequence.
    v = c3.vote({r: s.seq for r, s in group.items()})
    if v.status != c3.ATTRIBUTED:
        return []
    waiting = [r for r in v.majority if group[r].last_enter is not None
               and group[r].time - group[r].last_enter >= (min_wait if group[r].inside else max(min_wait, QUIET_ASYNC))]
    if not c3.strict_majority(len(waiting), len(group)):
        return []
    seq: int = v.signature  # type: ignore[assignment]
    # The ranks at #n must agree on what #n is before anyone is "behind" it: a rank that reaches #n a
    # second late (a loaded machine) is not behind while the ones there already called different things.
    at_n = {r: f for r in group if (f := _call_at(group[r], seq)) is not None}
    if all(r in at_n for r in v.majority):
        there = _vote_at(seq, at_n)
        if there.status != c3.AGREE:
            if there.status == c3.ATTRIBUTED and c3.strict_majority(len(there.majority), max(len(group), peers)):
                # enough of the whole peer group agree on #n that the ranks not there yet cannot
                # change it: the ones at #n that differ are named (rule 1), whoever is late
                by_seq = {r: {f.seq: f for f in group[r].recent} for r in there.majority + there.minority}
                return [_minority_call(job, pg, group, seq, there, by_seq, "called")]
            return []  # split at #n: rule 1 decides once the late ranks' calls are seen
    behind = tuple(r for r in v.minority if group[r].seq < seq)
    ahead = tuple(r for r in v.minority if group[r].seq > seq)
    since = min(group[r].last_enter or group[r].time for r in waiting)
    maj_fp = group[v.majority[0]].last
    ev = [_fp_evidence(r, group[r], group[r].last,
                       "behind" if r in behind else "ahead") for r in v.minority]
    ev.append(Evidence(
        "ebpf", f"{ranks_text(waiting)} waiting in {label_of(pg, [group[r] for r in waiting])} "
        + (maj_fp.describe() if maj_fp else f"#{seq}")
        + f" since {since:.3f}", data={"group": pg, "ranks": list(waiting), "seq": seq}))
    parts = []
    if behind:
        parts.append(f"{ranks_text(behind)} behind (at " + ", ".join(f"#{group[r].seq}" for r in behind) + ")")
    if ahead:
        parts.append(f"{ranks_text(ahead)} ahead (at " + ", ".join(f"#{group[r].seq}" for r in ahead) + ")")
    return [Incident(
        kind=DESYNC, status=ATTRIBUTED, ranks=v.minority, hosts=hosts(v.minority), since=since,
        summary=(f"{' and '.join(parts)} in the {label_of(pg, group.values())} collective sequence while "
                 f"{len(waiting)} ranks wait in #{seq}"),
        evidence=tuple(ev))]


def _call_at(s: CollectiveSample, seq: int) -> Fingerprint | None:
    return next((f for f in reversed(s.recent) if f.seq == seq), None)


def last_progress(obs: Sequence[Observation]) -> dict[int, float]:
    """rank -> the last time it entered or finished a collective (hang onset, from eBPF)."""
    out: dict[int, float] = {}
    for s in latest(obs).values():
        t = max(x for x in (s.last_enter, s.last_exit, 0.0) if x is not None)
        if t:
            out[s.rank] = max(out.get(s.rank, 0.0), t)
    return out
