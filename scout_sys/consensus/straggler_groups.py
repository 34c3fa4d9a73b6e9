"""The straggler across process sub-groups: the rank that arrives last in every group it belongs to.

In a dp x tp job most collectives run in sub-groups (tp {0,1} and {2,3}, dp {0,2} and {1,3}): no
collective is entered by every rank, so the arrival lag over the whole job (straggler.py ``_lags``)
names nobody, and a group of two cannot outvote itself. Each group still has a late arriver, and a
slow rank is the late arriver of every group it is in, while a healthy rank that waits for it is on
time in at least one of its groups. So, as SCOUT intersects slow process groups: a group is *slow*
when one member's median lag exceeds its peers' by more than the floor; the origin is the one rank
late in every group it belongs to, in at least two slow groups. Anything else (late in one group
only, different late ranks in different groups) names nobody. Pure: no I/O, no clocks.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Intersection:
    """The origin (None: nobody), the slow groups it was intersected from, per-rank median lag."""

    origin: int | None
    slow: tuple[str, ...]  # every slow group's name, sorted
    values: dict[int, float]  # rank -> median over its groups of its lag behind the group's first arrival
    late: dict[str, int]  # slow group -> its late member


def late_member(lags: Mapping[int, float], floor: float) -> int | None:
    """The member whose median lag is the largest and exceeds the others' median by more than ``floor``
    (a group of two: the other member, the first to arrive, lags about nothing)."""
    if len(lags) < 2:
        return None
    r = max(lags, key=lambda k: (lags[k], -k))
    others = statistics.median(v for k, v in lags.items() if k != r)
    return r if lags[r] - others > floor else None


def intersect(by_group: Mapping[str, Mapping[int, float]], floors: Mapping[str, float]) -> Intersection:
    """``by_group``: per process group, its members' median lags behind the group's first arrival (over
    the collectives all of them entered); ``floors``: per group, the lag that counts as late."""
    late = {g: r for g, lags in by_group.items() if (r := late_member(lags, floors[g])) is not None}
    groups_of: dict[int, list[str]] = {}
    for g, lags in by_group.items():
        for r in lags:
            groups_of.setdefault(r, []).append(g)
    # late in at least two groups and on time in none of its own
    cands = [r for r, gs in groups_of.items() if len(gs) >= 2 and all(late.get(g) == r for g in gs)]
    values = {r: statistics.median(by_group[g][r] for g in gs) for r, gs in groups_of.items()}
    return Intersection(cands[0] if len(cands) == 1 else None, tuple(sorted(late)), values, late)
