"""Which process group a collective sample is of, across ranks: by its members where the probe read them.

The collective probe names each rank's groups by first use (``gloo:0``, ``gloo:1``): on a dp x tp job
both tensor-parallel groups are ``gloo:0`` on their members, so comparing collectives by that name
pairs rank 0's tensor-parallel all-reduce #43 with rank 2's, two groups that never wait for each other.
Where the probe read the group's members (``CollectiveSample.members``, probes/ebpf/glooranks.py), or,
for NCCL, the communicator probe matched the call's communicator to its group at creation
(``ProcessGroupSample.handles``, probes/ebpf/comms.py), a group is named by them, ``gloo[2,3]``; two groups of one rank with the same members keep the probe's
name beside them; a group whose members are unknown keeps the probe's name alone (and may still mix
groups: straggler.py then drops a lag longer than the interval between the group's collectives).

Pure: no I/O, no clocks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from scout_sys.model import CollectiveSample, ProcessGroupSample
from scout_sys.text import ranks_text


def keys(obs: Iterable[object]) -> dict[tuple[int, str], str]:
    """(rank, the probe's group name) -> the group's name across ranks (see the module's docstring)."""
    seen: dict[tuple[int, str], CollectiveSample] = {}
    comms: ProcessGroupSample | None = None
    for o in obs:
        if isinstance(o, CollectiveSample):
            seen[(o.rank, o.group)] = o
        elif isinstance(o, ProcessGroupSample) and o.handles and (comms is None or o.time >= comms.time):
            comms = o
    handles = {(r, h): comms.groups[g] for r, h, g in comms.handles if 0 <= g < len(comms.groups)} if comms else {}
    members = {k: o.members or (handles.get((o.rank, o.group_ptr), ()) if o.backend == "nccl" else ())
               for k, o in seen.items()}
    twice = Counter((r, o.backend, members[(r, g)]) for (r, g), o in seen.items() if members[(r, g)])
    out: dict[tuple[int, str], str] = {}
    for (r, g), o in seen.items():
        m = members[(r, g)]
        if not m:
            out[(r, g)] = g
        else:
            name = member_name(o.backend, m)
            out[(r, g)] = name if twice[(r, o.backend, m)] == 1 else f"{name}{g}"
    return out


def member_name(backend: str, members: Sequence[int]) -> str:
    return f"{backend}[{','.join(map(str, members))}]"


def known(name: str) -> bool:
    """A name given by members (one real group), not the probe's own numbering."""
    return "[" in name


def label(name: str, members: Sequence[int]) -> str:
    """A process group as people know it: by its member ranks; the probe's name beside them only when
    the members are not what names it (``ranks 0, 1 (gloo:1)``); the name alone when no members are known."""
    if not members:
        return name
    return ranks_text(members) if known(name) and "]" == name[-1] else f"{ranks_text(members)} ({name})"


def label_of(name: str, samples: Iterable[CollectiveSample]) -> str:
    """The probe's (aligned) group ``name`` as people know it, over ``samples`` of it: each real group
    behind it by its members, ``ranks 0-1 and ranks 2-3 (gloo:1)``; the name alone when some sample's
    members are not known."""
    sets = [s.members for s in samples]
    if not sets or not all(sets):
        return name
    return f"{' and '.join(ranks_text(m) for m in sorted(set(sets)))} ({name})"


def position(name: str, samples: Iterable[CollectiveSample], pos: int) -> str:
    """A position of the group's sequence: ``#5 of ranks 2-3 (gloo:1)``; ``gloo:1 #5`` when members are
    not known."""
    where = label_of(name, samples)
    return f"#{pos} of {where}" if where != name else f"{name} #{pos}"
