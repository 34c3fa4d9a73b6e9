"""Who are a rank's equivalent peers: one answer for stragglers, the dashboard and the JSON.

In order: the layout the job came with (``--topology``, or a framework's command line / config:
:func:`scout_sys.job.with_layout`); else the layout **learned from the job's process groups**
(:mod:`scout_sys.probes.pgroups`, a :class:`~scout_sys.model.ProcessGroupSample`); else the whole
job.

Reading a layout from learned groups: every process group that is an arithmetic progression of
ranks (stride s, n members) belongs to a *family* (s, n); a family whose groups partition the job
is an axis of the grid. Axes are chained from the fastest (stride 1) on, each one's stride the
product of the sizes before it, until the chain covers the job; with several families at one
stride the smallest size wins (Megatron's model-parallel groups, tp × pp, are not progressions and
are skipped). Named by the rank order every framework uses (Megatron-Core, DeepSpeed, TorchTitan,
torch's DeviceMesh declared as (pp, dp, tp)): tensor-parallel fastest, pipeline slowest —

- two axes: ``tp`` × ``dp``;  three axes: ``tp`` × ``dp`` × ``pp``;
- one family covering the job, or more than three axes: nothing is read (the whole job).

A dp × pp job with no tensor parallelism has the same shape and is read as tp × dp by this rule:
its stragglers are compared over the whole job (as without a layout), and when dp is its fastest
axis (DeepSpeed's pipeline engine) its peer groups are wrong — pass ``--topology`` there. Groups with members on other hosts are not read (the whole job).

*Equivalent peers* (:meth:`Job.groups`, replicas: every coordinate but dp equal) are what the
hang votes, the dashboard and the JSON use. Stragglers compare ranks that do the same *work*
(:func:`work_groups`): every coordinate but dp, tp and cp equal — tensor- and context-parallel
partners hold equal shards — so a dp=2 × tp=2 job's four ranks are compared together while
pipeline stages are compared apart.

Pure: no I/O, no clocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache

from scout_sys.consensus.waitresolve import latest_groups, learned_from
from scout_sys.model import Job, LayoutSource, Observation
from scout_sys.model_job import LEARNED_FROM
from scout_sys.topology import Layout, note

LEARNED = LEARNED_FROM  # + what learned them (consensus/waitresolve.learned_from): the layout's ``layout_from``
_NAMES = {2: ("tp", "dp"), 3: ("tp", "dp", "pp")}
SAME_WORK = frozenset({"dp", "tp", "cp"})  # coordinates whose ranks do equal work


def is_learned(job: Job) -> bool:
    return job.layout_source is LayoutSource.LEARNED


def _progression(g: Sequence[int]) -> tuple[int, int] | None:
    """(stride, size) of a sorted group whose members are evenly spaced; None otherwise."""
    if len(g) < 2:
        return None
    s = g[1] - g[0]
    if s <= 0 or any(b - a != s for a, b in zip(g, g[1:])):
        return None
    return s, len(g)


def layout_of(groups: Sequence[Sequence[int]], world_size: int) -> Layout | None:
    """The grid the learned ``groups`` describe (see the module docstring), or None."""
    families: dict[tuple[int, int], set[tuple[int, ...]]] = {}
    for g in groups:
        gt = tuple(sorted(g))
        if len(gt) >= world_size or any(not 0 <= r < world_size for r in gt):
            continue
        key = _progression(gt)
        if key is not None:
            families.setdefault(key, set()).add(gt)
    axes = {k for k, gs in families.items()
            if len(gs) * k[1] == world_size and len({r for g in gs for r in g}) == world_size}
    sizes: list[int] = []
    stride = 1
    while stride < world_size:
        here = sorted(n for s, n in axes if s == stride and stride * n <= world_size)
        if not here:
            return None
        sizes.append(here[0])
        stride *= here[0]
    names = _NAMES.get(len(sizes))
    if stride != world_size or names is None:
        return None
    dims = tuple(zip(names, sizes))
    # Layout.sizes is written slowest first (as --topology is), its order fastest first
    return Layout(tuple(reversed(dims)), names, "learned")


@lru_cache(maxsize=2)
def _read(groups: tuple[tuple[int, ...], ...], world_size: int) -> tuple[Layout | None, tuple[tuple[int, ...], ...]]:
    """The layout and its peer groups, once per set of learned groups (a watch reads them every 2 s)."""
    lay = layout_of(groups, world_size)
    return lay, (lay.groups() if lay is not None else ())


def with_learned(job: Job, obs: Sequence[Observation]) -> Job:
    """``job`` with its peer groups and coordinates from the newest learned process groups in
    ``obs``, unless the job came with a layout (``--topology`` or a framework's, which win). A job
    whose groups say nothing readable stays as it was (a layout learned before is kept)."""
    if job.layout_source in (LayoutSource.TOPOLOGY, LayoutSource.FRAMEWORK):  # job.with_layout's
        return job
    sample = latest_groups(obs)
    if sample is None or sample.partial:
        return job
    lay, groups = _read(tuple(map(tuple, sample.groups)), job.world_size)
    if lay is None:
        return job
    if groups == job.peer_groups and is_learned(job):
        return job
    ranks = tuple(replace(r, coords=tuple(lay.coords(r.rank).items())) for r in job.ranks)
    where = f"{LEARNED} {learned_from(sample.source)}"
    text = f"{where}: {lay.dims()} (read with tp fastest, as Megatron-Core, DeepSpeed and TorchTitan order ranks)"
    # the note of the layout learned before (if any) gives way to this one's
    before = note(job.layout, job.peer_groups) if is_learned(job) else None
    notes = tuple(n for n in job.notes if n != before) + (note(text, groups),)
    return replace(job, ranks=ranks, peer_groups=groups, layout=text, layout_source=LayoutSource.LEARNED,
                   layout_from=where, notes=notes)


def work_groups(job: Job) -> tuple[tuple[int, ...], ...]:
    """Ranks that do the same work (straggler comparisons): equal coordinates but dp, tp and cp.
    Without coordinates, the peer groups (:meth:`Job.groups`)."""
    if not job.peer_groups or not any(r.coords for r in job.ranks):
        return job.groups()
    by: dict[tuple[tuple[str, int], ...], list[int]] = {}
    for r in job.ranks:
        key = tuple((d, c) for d, c in r.coords if d not in SAME_WORK)
        by.setdefault(key, []).append(r.rank)
    return tuple(sorted(tuple(sorted(g)) for g in by.values()))
