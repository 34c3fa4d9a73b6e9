"""The rule registry: every rule that turns observations into findings, in one list.

Each :class:`Rule` declares the kinds it finds, the cadences it runs at and the observation types it
reads, and wraps its own module (hang.py, desync.py, ...), which stays as it is. :func:`decide` runs
the rules of one cadence in :data:`RULES` order and merges their findings (consensus/merge.py); it is
the one entry point of ``diagnose`` (monitor.py), the watch (its polls, windows and straggler rounds)
and the cluster merge (cluster/merge.py), so a rule added here runs everywhere its cadence does.

The order is part of the result: the first list's summary wins a merge, and the straggler rule only
looks when the hang rules found nothing. Pure: no I/O, no clocks, no processes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from scout_sys.consensus import desync, hang, hardware, lifecycle, straggler, straggler_window
from scout_sys.consensus.kinds import HANG_KINDS
from scout_sys.consensus.merge import merge_findings
from scout_sys.model import (
    DESYNC,
    HARDWARE,
    PROCESS_EXIT,
    STRAGGLER,
    Activity,
    CollectiveSample,
    DeviceSample,
    ExitRecord,
    Incident,
    Job,
    Observation,
    OomRecord,
    ProcessGroupSample,
    ProcSample,
    SchedSample,
    SignalRecord,
    StackSample,
)

POLL = "poll"          # every poll of the watch, on its cheap sample (or its recent history)
WINDOW = "window"      # a stack window: diagnose, the watch's confirmation, the cluster's merge
PERIODIC = "periodic"  # the watch's straggler round, every few seconds, over the verdicts of its windows
CADENCES = (POLL, WINDOW, PERIODIC)


@dataclass(frozen=True)
class Context:
    """What a rule may read. ``job`` is the job as it came (the hang and desync votes keep its layout);
    ``peers`` the job with the peer groups learned from the process groups (stragglers compare those)."""

    job: Job
    peers: Job
    obs: Sequence[Observation]
    window: tuple[float, float]
    acts: Mapping[int, Activity]  # per-rank activity: the hang rule's, or the cluster agents'
    summarised: bool  # ``acts`` were summarised elsewhere (cluster agents): the raw samples are not in ``obs``
    found: Mapping[str, list[Incident]]  # the findings of the rules before this one, by rule name
    verdicts: Sequence[straggler.WindowVerdict] = ()  # PERIODIC: the straggler round's recent window verdicts


@dataclass(frozen=True)
class Found:
    incidents: list[Incident]
    notes: list[str] = field(default_factory=list)
    acts: dict[int, Activity] | None = None  # the hang rule's per-rank activity, for the rules after it


@dataclass(frozen=True)
class Rule:
    name: str
    kinds: frozenset[str]
    cadences: frozenset[str]
    reads: tuple[type, ...]  # the observation types it reads (what a source must send for it)
    run: Callable[[Context], Found]


@dataclass(frozen=True)
class Decision:
    found: tuple[tuple[str, list[Incident]], ...]  # per rule that ran, in registry order
    acts: dict[int, Activity]
    notes: list[str]

    @property
    def incidents(self) -> list[Incident]:
        """The findings merged: one incident per finding (consensus/merge.py)."""
        return merge_findings(*(f for _, f in self.found))

    @property
    def listed(self) -> list[Incident]:
        """The findings as the rules returned them, unmerged (for one rule: its own list)."""
        return [i for _, f in self.found for i in f]


def _hang(ctx: Context) -> Found:
    if ctx.summarised:
        incidents, acts, notes = hang.analyze_activities(ctx.job, dict(ctx.acts), window=ctx.window)
    else:
        incidents, acts, notes = hang.analyze(ctx.job, ctx.obs, window=ctx.window)
    return Found(incidents, notes, acts)


def _lifecycle(ctx: Context) -> Found:
    # The exit probe's deaths before desync: a dead rank is "behind" in every sequence, which
    # corroborates its process_exit even when every rank has died by now and the stack rules are silent.
    return Found(lifecycle.analyze(ctx.job, ctx.obs))


def _desync(ctx: Context) -> Found:
    found = desync.analyze(ctx.job, ctx.obs)
    # the stacks of this window tell a rank behind while it progresses (a pause) from a desync; the
    # cluster's summarised activities are not judged so (as before the registry)
    return Found(found if ctx.summarised else _not_progressing(found, ctx.acts))


def _hardware(ctx: Context) -> Found:
    return Found(hardware.analyze(ctx.job, ctx.obs))


def _straggler_window(ctx: Context) -> Found:
    # a stalled job has no pace to compare; one window's straggler needs this host's raw samples
    if ctx.summarised or ctx.found.get("hang"):
        return Found([])
    slow, notes = straggler_window.in_window(ctx.peers, ctx.obs, ctx.acts, ctx.window)
    return Found(slow, notes)


def _straggler_round(ctx: Context) -> Found:
    inc = straggler.confirm(ctx.peers, list(ctx.verdicts))
    return Found([inc] if inc else [])


def _not_progressing(found: Sequence[Incident], acts: Mapping[int, Activity]) -> list[Incident]:
    """Desync findings without those that blame ranks *behind* in the sequence while their stacks
    move over the window (state ``running``): the rank everyone waits for at a barrier while it
    writes a checkpoint is behind, and progressing: a pause, as the hang rules say, never a desync.
    A different fingerprint at the same position ("differs") always stays."""
    def pause(inc: Incident) -> bool:
        return (inc.kind == DESYNC and bool(inc.ranks) and not desync.fingerprint_differs(inc)
                and all(r in acts and acts[r].state == "running" for r in inc.ranks))
    return [i for i in found if not pause(i)]


RULES: tuple[Rule, ...] = (
    Rule("hang", HANG_KINDS, frozenset({WINDOW}),
         (ProcSample, StackSample, CollectiveSample, ProcessGroupSample), _hang),
    Rule("lifecycle", frozenset({PROCESS_EXIT}), frozenset({WINDOW, POLL}), (ExitRecord, SignalRecord, OomRecord),
         _lifecycle),
    Rule("desync", frozenset({DESYNC}), frozenset({WINDOW}), (CollectiveSample,), _desync),
    Rule("hardware", frozenset({HARDWARE}), frozenset({WINDOW, POLL}), (DeviceSample,), _hardware),
    Rule("straggler_window", frozenset({STRAGGLER}), frozenset({WINDOW}),
         (StackSample, ProcSample, CollectiveSample, SchedSample), _straggler_window),
    Rule("straggler", frozenset({STRAGGLER}), frozenset({PERIODIC}), (CollectiveSample, ProcSample, StackSample),
         _straggler_round),
)


def decide(job: Job, obs: Sequence[Observation], *, cadence: str, window: tuple[float, float] = (0.0, 0.0),
           peers: Job | None = None, acts: Mapping[int, Activity] | None = None,
           kinds: Collection[str] | None = None, verdicts: Sequence[straggler.WindowVerdict] = (),
           rules: Sequence[Rule] = RULES) -> Decision:
    """Run the rules of ``cadence`` (only those finding one of ``kinds``, when given) in order.

    ``peers``: the job with learned peer groups (default ``job``); ``acts``: per-rank activities
    summarised elsewhere (the cluster's agents) instead of from ``obs``'s samples."""
    if cadence not in CADENCES:
        raise ValueError(f"cadence {cadence!r}: expected one of {', '.join(CADENCES)}")
    summarised = acts is not None
    cur: dict[int, Activity] = dict(acts) if acts is not None else {}
    found: dict[str, list[Incident]] = {}
    notes: list[str] = []
    for rule in rules:
        if cadence not in rule.cadences or (kinds is not None and not rule.kinds & set(kinds)):
            continue
        ctx = Context(job=job, peers=peers or job, obs=obs, window=window, acts=cur, summarised=summarised,
                      found=found, verdicts=verdicts)
        f = rule.run(ctx)
        if f.acts is not None:
            cur = f.acts
        found[rule.name] = list(f.incidents)
        notes += f.notes
    return Decision(found=tuple(found.items()), acts=cur, notes=notes)
