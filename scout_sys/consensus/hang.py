"""Hang rules: who stopped the job, from stacks and /proc over a window.

Per rank, the window is summarised into an :class:`~scout_sys.model.Activity` with one of the states
of ``model.STATES`` (waiting, running, busy, idle, stopped, disk-sleep, exited, unknown; what each
means is written in scout_sys/model_activity.py).

Then per peer group, C3 votes on a signature per rank. Ranks waiting in a collective are
*witnesses*, never the origin; the origin is what a strict majority of waiting ranks waits for: a
rank elsewhere (``hang``), stopped or in disk sleep (``process_stall``), gone (``process_exit``) or
waiting in a different collective (``collective_desync``). A rank whose stack moves while the others
wait (a checkpoint write at a barrier) is a pause, not a hang. With no strict majority the finding is
``inconclusive``, unless the evidence is decisive on its own (a stopped, stuck or exited rank while all
others wait).

Pure: no I/O, no clocks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any

from scout_sys.consensus import c3, commonmode, desync, waitresolve
from scout_sys.consensus import groups as peer_groups
from scout_sys.consensus.patterns import collective_of
from scout_sys.model import (
    ATTRIBUTED,
    DESYNC,
    HANG,
    INCONCLUSIVE,
    PROCESS_EXIT,
    PROCESS_STALL,
    Activity,
    Evidence,
    ExitRecord,
    Incident,
    Job,
    Observation,
    ProcSample,
    StackSample,
)
from scout_sys.text import frame_text, ranks_text, signal_name, where_text

DECISIVE = ("stopped", "disk-sleep", "exited")

# A waiting main thread is off CPU; a busy one is mostly on it (fractions of the window).
WAIT_MAX_MAIN_CPU = 0.10
BUSY_MIN_MAIN_CPU = 0.30
# A rank that wrote this much (write syscalls) in the window is progressing (e.g. a checkpoint).
WRITE_PROGRESS_BYTES = 64 * 1024
# A rank seen in one collective at every sample, whose main thread still blocked anew at least this many
# times in the window while its process wrote at least this many bytes a second, left that collective
# and came back to it: a straggler's peer, waiting for it each step (a 190 ms step: 27 blocks and 35 kB
# in 3 s). A hung waiter does neither (0 and 0: its thread never wakes); one that polls for its collective
# (NCCL's blocking wait: every 10 ms) blocks often but writes nothing, as a thread logging now and then
# writes little and never wakes the main one.
LEFT_WAIT_BLOCKS = 2
LEFT_WAIT_BYTES_PER_S = 1024

# Frames a loop creates and leaves on every turn (``all(w.is_completed() for w in works)``): a rank
# polling in such a loop stays at one place although these come and go between two samples.
_TRANSIENT = frozenset({"<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>", "<lambda>"})


def location_of(frames) -> tuple[tuple[str, str], ...]:
    """Where a stack (innermost first) is, by function: ``((file, function), ...)``, without the
    transient frames of comprehensions and lambdas at its top."""
    i = 0
    while i < len(frames) - 1 and frames[i].function.rsplit(".", 1)[-1] in _TRANSIENT:
        i += 1
    return tuple((f.file, f.function) for f in frames[i:])


@lru_cache(maxsize=4096)
def _described(frames: tuple) -> tuple[tuple[str, ...], str, tuple[tuple[str, str], ...]]:
    """(frame texts, where, function-level location) of a stack, cached by stack: thousands of ranks
    show a few distinct stacks."""
    return tuple(frame_text(f) for f in frames), where_text(frames), location_of(frames)


def untorn(samples: list[tuple[StackSample, Any]]) -> list[tuple[StackSample, Any]]:
    """Drop torn reads. ``py-spy --nonblocking`` reads a running rank's frames without stopping it; a
    rank that spins through a poll loop creates and frees frames all the time, and about one read in
    two hundred comes back truncated (only the innermost frames, no callers). Such a read has another
    outermost frame than the rank's other reads: keep the reads that share the most common one."""
    if len(samples) < 3:
        return samples
    roots = Counter((m.frames[-1].file, m.frames[-1].function) for _, m in samples)
    root, n = roots.most_common(1)[0]
    if not c3.strict_majority(n, len(samples)):
        return samples
    return [(s, m) for s, m in samples if (m.frames[-1].file, m.frames[-1].function) == root]


def _left_the_wait(live: Sequence[ProcSample], wrote: int, seconds: float) -> bool:
    """The main thread blocked anew in the window (LEFT_WAIT_BLOCKS) while the process wrote
    (LEFT_WAIT_BYTES_PER_S): it came out of its collective and went back into another."""
    first, last = live[0].main_voluntary, live[-1].main_voluntary
    if first is None or last is None:
        return False
    return last - first >= LEFT_WAIT_BLOCKS and wrote >= LEFT_WAIT_BYTES_PER_S * seconds


def summarize(rank: int, procs: Sequence[ProcSample], stacks: Sequence[StackSample]) -> Activity:
    """One rank's window → its Activity."""
    procs = sorted(procs, key=lambda p: p.time)
    stacks = sorted(stacks, key=lambda s: s.time)
    if not procs:
        return Activity(rank=rank, pid=None, state="exited")
    last = procs[-1]
    pid = last.pid
    base = dict(rank=rank, pid=pid, status=last.status, wchan=last.wchan)
    if not last.alive:
        zombie = next((p for p in reversed(procs) if p.status == "zombie"), None)
        return Activity(state="exited", exit_code=zombie.exit_code if zombie else None,
                        exit_signal=zombie.exit_signal if zombie else None, **base)
    live = [p for p in procs if p.alive]
    dt = max(live[-1].time - live[0].time, 1e-6)
    cpu = (live[-1].cpu_time - live[0].cpu_time) / dt if len(live) > 1 else None
    main_cpu = None
    if len(live) > 1 and live[0].main_cpu_ns is not None and live[-1].main_cpu_ns is not None:
        main_cpu = (live[-1].main_cpu_ns - live[0].main_cpu_ns) / 1e9 / dt
    wrote = 0
    if live[0].write_chars is not None and live[-1].write_chars is not None:
        wrote = max(0, live[-1].write_chars - live[0].write_chars)
    base.update(cpu=cpu, main_cpu=main_cpu, wrote=wrote, last_ran=last.main_last_ran)

    # A dump that caught the main thread between Python frames (no frame at all) says nothing; nor does
    # a torn one (below).
    good = untorn([(s, m) for s in stacks if s.error is None and (m := s.main()) is not None and m.frames])
    latest = good[-1][1] if good else None
    if latest is not None:
        base["stack"], base["where"], _ = _described(latest.frames)
    errors = [s.error for s in stacks if s.error]
    if errors and not good:
        base["stack_error"] = errors[-1]

    n = len(live)
    stopped = sum(p.stopped for p in procs)
    if last.stopped and 2 * stopped >= n:
        return Activity(state="stopped", **base)
    if all(p.status == "disk-sleep" for p in live) and n > 1:
        return Activity(state="disk-sleep", **base)
    if not good:
        return Activity(state="unknown", **base)

    waits = [collective_of(t.frames) for _, t in good]
    locs = [_described(t.frames)[2] for _, t in good]
    base["location"] = locs[-1]
    off_cpu = main_cpu is None or main_cpu < WAIT_MAX_MAIN_CPU
    w0 = waits[-1]
    if w0 is not None and all(w == w0 for w in waits) and off_cpu:
        if _left_the_wait(live, wrote, dt):  # the samples all fell in its waits: it progresses between them
            return Activity(state="running", **base)
        return Activity(state="waiting", wait=w0, **base)
    if len(set(locs)) == 1 and all(w is None or w == w0 for w in waits) and wrote < WRITE_PROGRESS_BYTES:
        on_cpu = (main_cpu if main_cpu is not None else (cpu or 0.0)) >= BUSY_MIN_MAIN_CPU
        return Activity(state="busy" if on_cpu else "idle", **base)
    return Activity(state="running", **base)


def activities(job: Job, obs: Sequence[Observation]) -> dict[int, Activity]:
    procs: dict[int, list[ProcSample]] = {}
    stacks: dict[int, list[StackSample]] = {}
    exits: dict[int, ExitRecord] = {}
    for o in obs:
        if isinstance(o, ProcSample):
            procs.setdefault(o.rank, []).append(o)
        elif isinstance(o, StackSample) and not o.native:
            stacks.setdefault(o.rank, []).append(o)
        elif isinstance(o, ExitRecord):
            exits[o.pid] = o
    out = {r.rank: _with_exit(summarize(r.rank, procs.get(r.rank, ()), stacks.get(r.rank, ())), exits)
           for r in job.ranks}
    for m in job.missing:
        out[m] = Activity(rank=m, pid=None, state="exited")
    return out


def _with_exit(a: Activity, exits: dict[int, ExitRecord]) -> Activity:
    """An exited rank with its status from the exit probe (eBPF) when /proc did not catch it as a
    zombie: a rank its launcher reaped at once is otherwise 'gone, exit code unknown'."""
    e = exits.get(a.pid) if a.state == "exited" and a.pid is not None else None
    if e is None or a.exit_code is not None or a.exit_signal is not None:
        return a
    return replace(a, exit_code=e.exit_code, exit_signal=e.signal)


def ended_cleanly(a: Activity) -> bool:
    """Exited with status 0 and no signal: a rank that finished, not a dead one. Not decisive on its own
    (a job ends its ranks a moment apart); the origin still when a strict majority waits for it."""
    return a.state == "exited" and a.exit_code == 0 and a.exit_signal is None


def _who(job: Job, a: Activity) -> str:
    pid = f"pid {a.pid}" if a.pid else "pid ?"
    r = job.by_rank().get(a.rank)
    if a.pid and r is not None and r.pid == a.pid and r.container_pid is not None:
        pid += f", container pid {r.container_pid}"  # a rank in its own PID namespace, as its logs name it
    return f"rank {a.rank} ({pid} on {job.host_of(a.rank)})"


def _state_text(a: Activity) -> str:
    if a.state == "exited":
        if a.exit_signal is not None:
            return f"was killed by {signal_name(a.exit_signal)}"
        if a.exit_code is not None:
            return f"exited with code {a.exit_code}"
        if a.pid is None:
            return "is gone (no process; exited before we looked, exit code unknown)"
        return "is gone (exit code unknown: reaped by its parent)"
    if a.state == "stopped":
        return f"is stopped (state {a.status}: SIGSTOP or a debugger) at {a.where or '?'}"
    if a.state == "disk-sleep":
        return f"is in uninterruptible sleep (D) in {a.wchan or '?'} at {a.where or '?'}"
    if a.state == "waiting" and a.wait:
        return f"waits in {a.wait.label()}"
    if a.state == "busy":
        return f"spins on a CPU outside any collective at {a.where or '?'}"
    if a.state == "idle":
        return f"is stuck outside any collective at {a.where or '?'}"
    if a.state == "unknown":
        return f"could not be inspected ({a.stack_error or 'no stack'})"
    return f"is running at {a.where or '?'}"


def _rank_evidence(a: Activity) -> list[Evidence]:
    ev = []
    data = {"state": a.state, "pid": a.pid}
    if a.stack:
        ev.append(Evidence("stack", f"rank {a.rank} main thread: {a.where}", rank=a.rank,
                           data={**data, "stack": list(a.stack)}))
    proc = {"status": a.status, "wchan": a.wchan}
    if a.cpu is not None:
        proc["cpu_percent"] = round(100 * a.cpu, 1)
    if a.main_cpu is not None:
        proc["main_thread_cpu_percent"] = round(100 * a.main_cpu, 1)
    if a.state == "exited":
        proc.update(exit_code=a.exit_code, exit_signal=a.exit_signal)
    ev.append(Evidence("procfs", f"rank {a.rank} {_state_text(a)}", rank=a.rank, data={**data, **proc}))
    return ev


_KIND_OF_STATE = {"exited": PROCESS_EXIT, "stopped": PROCESS_STALL, "disk-sleep": PROCESS_STALL,
                  "waiting": DESYNC, "busy": HANG, "idle": HANG, "unknown": HANG}


def analyze(job: Job, obs: Sequence[Observation], *, window: tuple[float, float]) -> tuple[
        list[Incident], dict[int, Activity], list[str]]:
    """Hang findings for every peer group. Returns (incidents, activity per rank, notes)."""
    return analyze_activities(job, activities(job, obs), window=window, obs=obs)


def analyze_activities(job: Job, acts: dict[int, Activity], *, window: tuple[float, float],
                       obs: Sequence[Observation] = ()) -> tuple[list[Incident], dict[int, Activity], list[str]]:
    """:func:`analyze` from per-rank activities already summarised (e.g. by the agent on each host).
    ``obs`` may carry the learned process groups (probes/pgroups.py) for the wait-for graph."""
    notes: list[str] = []
    acts = _measured_waits(acts, obs, window)
    groups, layout = job.groups(), job.layout or "peer groups given with the job"
    if not job.peer_groups:  # layout unknown: group by the shape of activity (consensus/groups.py)
        groups, why = peer_groups.by_activity(acts, groups[0])
        layout = peer_groups.ACTIVITY_SOURCE
        notes += [why] if why else []
    found = []
    for group in groups:
        g = {r: acts[r] for r in group if r in acts}
        inc, nts = _analyze_group(job, g, window)
        found.append((group, inc))
        notes += nts
    incidents, nts = peer_groups.across(job, groups, found, acts, _analyze_group, window, layout)
    # No origin from the peer-group vote: follow who waits for whom over the learned process groups.
    incidents, wf_notes = waitresolve.resolve(job, obs, acts, incidents, _attribute, window)
    # A common mode: what still moves tells it from a long healthy step (consensus/commonmode.py).
    incidents, cm_notes = commonmode.review(job, incidents, acts, obs, window)
    return incidents, acts, notes + nts + wf_notes + cm_notes


# A main thread that has not run for this long in a framework's wait (/proc: se.exec_start) is blocked
# on a collective, not waiting for its device's backward: no healthy backward keeps the caller asleep for
# half a minute. The measure without eBPF (non-root, a monitor in its own PID namespace).
BLOCKED_LONG = 30.0


def _measured_waits(acts: dict[int, Activity], obs: Sequence[Observation],
                    window: tuple[float, float]) -> dict[int, Activity]:
    """A rank waiting in a framework's frame that only issues collectives (DDP's backward, whose
    gradient all-reduces run from autograd hooks) is inside a collective when the collective probe
    (eBPF) saw it neither begin nor end one during the whole window, or when its main thread has not
    run for :data:`BLOCKED_LONG` seconds: a wait measured, as direct as a collective frame. Without
    that measure, every rank in backward together stays a long step as often as a hang (the GPU's
    backward runs off the main thread) and says nothing. (The eBPF records are read only when some
    rank waits in such a frame: a pass over every observation saved on every other decision.)"""
    if not any(a.state == "waiting" and a.wait is not None and not a.wait.direct for a in acts.values()):
        return acts
    last = desync.last_progress(obs)
    out = {}
    for r, a in acts.items():
        w = a.wait
        if a.state == "waiting" and w is not None and not w.direct and (
                (r in last and last[r] < window[0])
                or (a.last_ran is not None and window[1] - a.last_ran >= BLOCKED_LONG)):
            a = replace(a, wait=replace(w, direct=True))
        out[r] = a
    return out


def _since(acts: Sequence[Activity], default: float) -> float:
    times = [a.last_ran for a in acts if a.last_ran is not None and a.state != "busy"]  # spinners always ran
    return min(times) if times else default


def wait_phrase(a: Activity) -> str:
    """How a witness waits: ``in all_reduce at train.py:118``, or, in the GPU shape (an asynchronous
    collective's wait, no collective frame), ``at train.py:151 wait_for_buckets, spinning``."""
    if a.state == "waiting" and a.wait is not None:
        return f"in {a.wait.label()}"
    how = {"busy": "spinning on a CPU", "idle": "asleep"}.get(a.state, a.state)
    return f"at {a.where or '?'}, {how}, outside any collective frame"


def _majority_evidence(job: Job, waiting: list[Activity], label: str) -> Evidence:
    rep = waiting[0]
    key = "collective" if rep.state == "waiting" else "place"
    return Evidence("stack", f"{ranks_text([a.rank for a in waiting])} wait {label}",
                    data={"ranks": sorted(a.rank for a in waiting), key: label, "state": rep.state,
                          "stack": list(rep.stack),
                          "main_thread_cpu_percent": [round(100 * (a.main_cpu or 0.0), 1) for a in waiting]})


def _analyze_group(job: Job, g: dict[int, Activity], window: tuple[float, float]) -> tuple[
        list[Incident], list[str]]:
    if not g:
        return [], []
    v = c3.vote({r: a.signature() for r, a in g.items()})
    n = len(g)
    waiting_sig = v.signature is not None and v.signature[0] == "waiting"

    if v.status == c3.AGREE and waiting_sig and not all(a.wait and a.wait.direct for a in g.values()):
        # Every rank in backward together is a long step as often as a hang: say nothing.
        return [], [f"all {n} ranks are in {v.signature[1]} with their main thread off CPU"]
    no_progress_sig = v.signature is not None and v.signature[0] == "still"
    if v.status == c3.AGREE and (waiting_sig or (no_progress_sig and job.remote)):
        # Every rank waits at one place and none is elsewhere: inside one collective (the Gloo shape),
        # or, seen from one host of a multi-node job, at one sync point outside any collective frame,
        # spinning or asleep (the GPU shape). The rank they wait for is not among them.
        return [_common_mode(job, list(g.values()), window)], []

    # Witnesses: a strict majority that made no progress over the window at one place, inside a
    # collective (the Gloo shape) or outside any (the GPU shape: the collective was only enqueued and
    # the rank waits for it at a sync point, spinning or asleep).
    if v.attributed and (waiting_sig or no_progress_sig):
        majority = [g[r] for r in v.majority]
        minority = [g[r] for r in v.minority]
        label = wait_phrase(majority[0])
        moving = [a for a in minority if a.state == "running"]
        origins = [a for a in minority if a.state != "running" and not (no_progress_sig and a.state == "waiting")]
        notes = []
        if no_progress_sig and len(origins) < len(minority) - len(moving):
            # A rank inside a collective is a witness too, never an origin: the majority is elsewhere.
            majority += [a for a in minority if a.state == "waiting"]
        if moving:
            notes.append(
                f"{len(majority)} of {n} ranks wait {label} for {ranks_text([a.rank for a in moving])}, "
                f"which {'is' if len(moving) == 1 else 'are'} still progressing "
                f"({'; '.join(a.where or '?' for a in moving)}): a pause (e.g. a checkpoint), not a hang")
        return _attribute(job, origins, majority, label, n, window, decisive_only=False), notes

    # No strict majority of waiting witnesses.
    if all(a.state == "exited" for a in g.values()):
        # Every rank is gone: the job ended or was torn down. Who died first is a question of
        # order, which only the lifecycle records (eBPF) can answer; /proc cannot.
        return [], [f"all {n} ranks have exited"]
    waiting = [a for a in g.values() if a.state == "waiting"]
    decisive = [a for a in g.values() if a.state in DECISIVE and not ended_cleanly(a)]
    if decisive:
        # A stopped or dead rank is an incident on its own, whatever the others do yet.
        label = wait_phrase(waiting[0]) if waiting else "?"
        return _attribute(job, decisive, waiting, label, n, window, decisive_only=True), []
    # Nobody progresses and somebody waits (in a collective, or spinning at a sync point).
    stalled = (waiting or any(a.state == "busy" for a in g.values())) and len(v.counts) > 1 and all(
        a.state in ("waiting", "idle", "busy", "unknown") for a in g.values())
    if stalled:
        groups: dict[tuple, list[int]] = {}
        for r, a in g.items():
            groups.setdefault(a.signature(), []).append(r)
        ev = []
        for _sig, rs in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1])):
            a = g[rs[0]]
            ev.append(Evidence("stack", f"{ranks_text(rs)} {_state_text(a).removeprefix('is ')}",
                               data={"ranks": sorted(rs), "state": a.state, "stack": list(a.stack)}))
        return [Incident(
            kind=HANG, status=INCONCLUSIVE, ranks=(), hosts=tuple(sorted({job.host_of(r) for r in g})),
            since=_since(waiting, window[0]),
            summary=(f"no progress on any of {n} ranks, but no strict majority waits at one place "
                     f"({len(waiting)} of {n} wait): cannot tell the origin"),
            evidence=tuple(ev),
        )], []
    return [], []


def _common_mode(job: Job, acts: list[Activity], window: tuple[float, float]) -> Incident:
    label = wait_phrase(acts[0])
    elsewhere = f"{ranks_text(job.remote)} on other hosts, not observed here" if job.remote else "a rank on another host"
    return Incident(
        kind=HANG, status=INCONCLUSIVE, ranks=(), hosts=tuple(sorted({job.host_of(a.rank) for a in acts})),
        since=_since(acts, window[0]),
        summary=(f"all {len(acts)} ranks wait {label} and none is elsewhere: common-mode hang; the origin is "
                 f"outside these ranks ({elsewhere}, the network, the store)"),
        evidence=(_common_evidence(job, acts, label),),
    )


def _common_evidence(job: Job, acts: list[Activity], label: str) -> Evidence:
    ev = _majority_evidence(job, acts, label)
    return replace(ev, data={**ev.data, commonmode.MARK: True, "not_observed": list(job.remote)})


def _attribute(job: Job, origins: list[Activity], witnesses: list[Activity], label: str, n: int,
               window: tuple[float, float], *, decisive_only: bool) -> list[Incident]:
    by_kind: dict[str, list[Activity]] = {}
    for a in origins:
        by_kind.setdefault(_KIND_OF_STATE.get(a.state, HANG), []).append(a)
    out = []
    witness_text = (f"{len(witnesses)} other rank{'s' if len(witnesses) != 1 else ''} wait {label}"
                    if witnesses else "no other rank waits in a collective yet")
    for kind, acts in sorted(by_kind.items()):
        ev: list[Evidence] = []
        for a in acts:
            ev += _rank_evidence(a)
        if witnesses:
            ev.append(_majority_evidence(job, witnesses, label))
        if decisive_only and not c3.strict_majority(len(witnesses), n):
            ev.append(Evidence("procfs", f"no strict majority of waiting ranks ({len(witnesses)} of {n}); "
                               "the process state is decisive on its own"))
        first = acts[0]
        if len(acts) == 1:
            head = f"{_who(job, first)} {_state_text(first)}"
        else:
            head = f"{ranks_text([a.rank for a in acts])} " + "; ".join(
                f"rank {a.rank} {_state_text(a)}" for a in acts)
        since = _since(witnesses or acts, window[0])
        out.append(Incident(
            kind=kind,
            status=ATTRIBUTED,
            ranks=tuple(sorted(a.rank for a in acts)),
            hosts=tuple(sorted({job.host_of(a.rank) for a in acts})),
            since=since,
            summary=f"{head}; {witness_text}",
            evidence=tuple(ev),
        ))
    return out
