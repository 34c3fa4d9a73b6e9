"""Matching NCCL communicator creations into the job's process groups: pure (no I/O, no clocks).

The records come from the ``ebpf-comms`` probe (probes/ebpf/comms.py, which documents what it
attaches to). A communicator made from an id is the set of global ranks that passed that id; one made
by a split is (the parent's group, the n-th split of that parent, the color). A group is reported
when every member's creation was seen; with members on other hosts it is *partial*; otherwise a group
missing a member is left out, and said.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

K_INIT, K_INIT_CONFIG, K_SCALABLE, K_SPLIT = 1, 2, 3, 4
INIT_KINDS = frozenset({K_INIT, K_INIT_CONFIG, K_SCALABLE})


@dataclass(frozen=True)
class Creation:
    """One creation call of one rank process, as the probe saw it."""

    seq: int  # the process's n-th creation call
    kind: int
    nranks: int = 0  # init
    comm_rank: int = 0  # init: its rank in the communicator; split: its key
    id: bytes = b""  # init: the ncclUniqueId
    parent: int = 0  # split: the parent communicator's handle
    color: int = -1  # split
    comm: int = 0  # the handle NCCL stored in *newcomm (0: unknown)
    ret: int | None = None  # ncclResult_t; None: not returned yet
    ns: int = 0  # when it was called (CLOCK_MONOTONIC)


@dataclass(frozen=True)
class CommCalls:
    """The collectives one rank called on one communicator made while the probe was attached."""

    rank: int
    comm: int  # handle
    calls: int  # collectives entered since it was made: its sequence number, the same on every member
    last_ns: int = 0
    last_op: str = ""


@dataclass(frozen=True)
class Communicators:
    """What :func:`learn` found: groups in the same form as probes/pgroups.py's ``Learned``."""

    groups: tuple[tuple[int, ...], ...]  # global members, sorted; one entry per distinct member set
    partial: tuple[int, ...] = ()  # indices of groups with members not seen here (other hosts)
    handles: tuple[tuple[int, int, int], ...] = ()  # (rank, communicator handle, group index)
    notes: tuple[str, ...] = ()
    communicators: int = 0  # communicators seen (before member sets were merged)


@dataclass
class _Acc:
    nranks: int | None  # None: a split (size known only from its parent)
    members: dict[int, int] = field(default_factory=dict)  # global rank -> order (comm rank / key)
    parent: tuple | None = None
    index: int = -1  # split: the n-th split of the parent
    bad: bool = False
    first_ns: int = 0  # the earliest member's call (groups are listed in creation order)


def learn(records: Mapping[int, Sequence[Creation]], destroyed: Mapping[tuple[int, int], int] | None = None,
          *, others_elsewhere: bool = False) -> Communicators:
    """The communicators of ``records`` (global rank -> its creation calls), matched across ranks.

    ``destroyed``: (rank, handle) -> when it was destroyed (ns), so a reused handle maps to the newer
    communicator only. ``others_elsewhere``: the job has ranks on other hosts (their creations are
    not seen: a group short of members is partial, not incomplete)."""
    destroyed = destroyed or {}
    accs: dict[tuple, _Acc] = {}
    handle_of: dict[tuple[int, int], tuple[tuple, int]] = {}  # (rank, handle) -> (key, created ns)
    splits_done: dict[tuple, set[tuple[int, int]]] = {}  # parent key -> {(rank, n)}: n-th split made
    unresolved = 0
    for rank, recs in records.items():
        nth: dict[tuple, int] = {}
        for c in sorted(recs, key=lambda c: c.seq):
            key: tuple | None = None
            if c.kind in INIT_KINDS:
                if c.nranks <= 0 or not 0 <= c.comm_rank < c.nranks or not any(c.id):
                    continue  # NCCL rejects these arguments: no communicator
                key = ("id", c.id)
                acc = accs.setdefault(key, _Acc(c.nranks, first_ns=c.ns))
                acc.bad |= acc.nranks != c.nranks or rank in acc.members
                acc.members[rank] = c.comm_rank
            elif c.kind == K_SPLIT:
                parent = _live_handle(handle_of, destroyed, rank, c.parent, c.ns)
                if parent is None:
                    unresolved += 1
                    continue
                n = nth.get(parent, 0)
                nth[parent] = n + 1
                splits_done.setdefault(parent, set()).add((rank, n))
                if c.color < 0:
                    continue  # NCCL_SPLIT_NOCOLOR: this rank is in no new communicator
                key = ("split", parent, n, c.color)
                acc = accs.setdefault(key, _Acc(None, parent=parent, index=n, first_ns=c.ns))
                acc.bad |= rank in acc.members
                acc.members[rank] = c.comm_rank
            if key is not None:
                acc.first_ns = min(acc.first_ns, c.ns)
            if key is not None and c.comm:
                handle_of[(rank, c.comm)] = (key, c.ns)

    status: dict[tuple, str] = {}  # key -> complete | partial | incomplete | bad

    def judge(key: tuple) -> str:
        if key in status:
            return status[key]
        acc = accs[key]
        if acc.bad:
            s = "bad"
        elif acc.nranks is not None:
            full = len(acc.members) == acc.nranks and sorted(acc.members.values()) == list(range(acc.nranks))
            s = "complete" if full else ("partial" if others_elsewhere and len(acc.members) < acc.nranks
                                         else "incomplete")
        else:
            ps = judge(acc.parent) if acc.parent in accs else "incomplete"
            made = {r for r, n in splits_done.get(acc.parent, ()) if n == acc.index}
            pmembers = set(accs[acc.parent].members) if acc.parent in accs else set()
            if ps in ("incomplete", "bad") or not pmembers <= made:
                s = "incomplete"  # some member of the parent has not made (or we missed) this split
            else:
                s = ps
        status[key] = s
        return s

    groups: list[tuple[int, ...]] = []
    partial: list[int] = []
    index_of: dict[tuple[tuple[int, ...], bool], int] = {}
    key_index: dict[tuple, int] = {}
    counts = {"incomplete": 0, "bad": 0}
    for key in sorted(accs, key=lambda k: accs[k].first_ns):
        s = judge(key)
        if s in counts:
            counts[s] += 1
            continue
        members = tuple(sorted(accs[key].members))
        if len(members) < 2 and s == "complete":
            continue  # a communicator of one rank waits for nobody
        tag = (members, s == "partial")
        if tag not in index_of:
            index_of[tag] = len(groups)
            if s == "partial":
                partial.append(len(groups))
            groups.append(members)
        key_index[key] = index_of[tag]
    handles = sorted((rank, h, key_index[key]) for (rank, h), (key, _ns) in handle_of.items()
                     if key in key_index and destroyed.get((rank, h), -1) <= _ns)
    notes = []
    if counts["incomplete"]:
        notes.append(f"{counts['incomplete']} NCCL communicator(s) left out: a member's creation was not seen "
                     "(made before the probe attached, or still being made)")
    if counts["bad"]:
        notes.append(f"{counts['bad']} NCCL communicator(s) left out: their members disagree on size or rank")
    if unresolved:
        notes.append(f"{unresolved} ncclCommSplit call(s) of a parent communicator whose creation was not seen: "
                     "their groups are unknown from this probe")
    return Communicators(tuple(groups), tuple(partial), tuple(handles), tuple(notes), len(accs))


def progress(comms: Communicators, calls: Sequence[CommCalls], unix: Any = None) -> tuple[
        tuple[tuple[int, int, int], ...], tuple[tuple[int, int, str, float], ...]]:
    """From each rank's collectives per communicator: ((rank, group, collectives entered in it), ...)
    and ((rank, group, op, when) of its latest collective, ...); ``unix`` converts the probe's
    monotonic ns to unix time. Two communicators of one member set count as one group (every
    member has both)."""
    group = {(r, h): g for r, h, g in comms.handles}
    seqs: dict[tuple[int, int], int] = {}
    latest: dict[int, tuple[int, int, str]] = {}  # rank -> (ns, group, op)
    for c in calls:
        g = group.get((c.rank, c.comm))
        if g is None:
            continue
        seqs[(c.rank, g)] = seqs.get((c.rank, g), 0) + c.calls
        if c.calls and (c.rank not in latest or c.last_ns > latest[c.rank][0]):
            latest[c.rank] = (c.last_ns, g, c.last_op)
    return (tuple(sorted((r, g, n) for (r, g), n in seqs.items())),
            tuple(sorted((r, g, o, unix(t) if unix else t / 1e9) for r, (t, g, o) in latest.items())))


def _live_handle(handle_of: Mapping[tuple[int, int], tuple[tuple, int]], destroyed: Mapping[tuple[int, int], int],
                 rank: int, handle: int, at: int) -> tuple | None:
    got = handle_of.get((rank, handle))
    if got is None:
        return None
    key, made = got
    gone = destroyed.get((rank, handle))
    return None if gone is not None and made < gone < at else key
