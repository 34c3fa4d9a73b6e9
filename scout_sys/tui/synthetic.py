"""Synthetic snapshots and a scripted Source, for tests, the render benchmark and demos of the
dashboard without a job. Nothing here probes anything."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from scout_sys.model import ATTRIBUTED, HANG, Diagnosis, Evidence, Incident, Job, Rank, RankView
from scout_sys.tui.source import Event, Snapshot, SourceDefaults, diagnosis_of

T0 = 1_760_000_000.0  # a fixed clock, so that renders are reproducible

MAJORITY_STACK = (
    "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py:2501 all_reduce",
    "/work/demo/train.py:118 step",
    "/work/demo/train.py:160 main",
    "/work/demo/train.py:171 <module>",
)
CULPRIT_STACK = (
    "/work/demo/train.py:97 slow_data_loader",
    "/work/demo/train.py:112 step",
    "/work/demo/train.py:160 main",
    "/work/demo/train.py:171 <module>",
)
COMPUTE_STACK = (
    "/usr/lib/python3/dist-packages/torch/nn/modules/linear.py:125 forward",
    "/work/demo/train.py:109 step",
    "/work/demo/train.py:160 main",
    "/work/demo/train.py:171 <module>",
)


def synthetic_snapshot(n: int = 8, *, per_host: int = 4, hung: int | None = 2, elapsed: float = 83.0,
                       closed: bool = True, devices: bool = False, seed: int = 1,
                       evil: bool = False) -> Any:
    """A job of ``n`` ranks on ``n / per_host`` hosts; ``hung`` (if any) sits outside the collective
    the others wait in, and an open hang incident names it."""
    rnd = random.Random(seed)
    now = T0 + elapsed
    hosts = [f"node{h:03d}.cluster.example" for h in range((n + per_host - 1) // per_host)]
    ranks = tuple(Rank(rank=r, pid=40000 + r, host=hosts[r // per_host], local_rank=r % per_host, world_size=n,
                       device=f"cuda:{r % per_host}", name="python3") for r in range(n))
    job = Job(ranks=ranks, world_size=n, launcher="torchrun", launcher_pid=39999, host=hosts[0])
    views: dict[int, RankView] = {}
    stacks: dict[int, tuple[str, ...]] = {}
    step_times: dict[int, tuple[float, ...]] = {}
    waits: dict[int, tuple[float, ...]] = {}
    devs: dict[int, dict[str, object]] = {}
    culprit_stack = CULPRIT_STACK
    if evil:
        culprit_stack = ("/tmp/[bold red]x[/].py:1 [link=http://e]click[/link]\x1b[31m",) + CULPRIT_STACK
    for r in range(n):
        if hung is not None and r == hung:
            views[r] = RankView(r, "busy", where=culprit_stack[0], cpu_percent=99.0, stack=culprit_stack)
            stacks[r] = culprit_stack
        elif hung is not None:
            views[r] = RankView(r, "waiting", where=MAJORITY_STACK[0], collective="all_reduce @ train.py:118",
                                cpu_percent=0.5, stack=MAJORITY_STACK)
            stacks[r] = MAJORITY_STACK
        else:
            views[r] = RankView(r, "running", where=COMPUTE_STACK[0], cpu_percent=97.0, stack=COMPUTE_STACK)
            stacks[r] = COMPUTE_STACK
        base = 1.0 + 0.02 * rnd.random()
        st = [base + 0.05 * rnd.random() for _ in range(20)]
        wf = [0.1 + 0.05 * rnd.random() for _ in range(20)]
        if hung is not None and r == hung:
            st[-3:] = [1.1, 1.2, 9.5]
            wf[-3:] = [0.02, 0.01, 0.0]
        elif hung is not None:
            wf[-1] = 0.98
        step_times[r] = tuple(round(v, 3) for v in st)
        waits[r] = tuple(round(v, 3) for v in wf)
        if devices:
            devs[r] = {"index": r % per_host, "util_percent": 0 if r == hung else 97, "mem_used": 30 * 2**30,
                       "mem_total": 80 * 2**30, "temperature_c": 64, "power_w": 80.0 if r == hung else 610.5,
                       "ecc_uncorrected": 0}
            if r == hung:
                devs[r]["slowdown"] = "hw-thermal"
    incidents: tuple[Incident, ...] = ()
    if hung is not None:
        host = ranks[hung].host
        incidents = (Incident(
            kind=HANG, status=ATTRIBUTED, ranks=(hung,), hosts=(host,), since=now - 12.0,
            summary=f"rank {hung} is in {'[red]' if evil else ''}slow_data_loader while {n - 1} ranks wait in all_reduce",
            evidence=(
                Evidence("stack", f"{n - 1} of {n} ranks wait in all_reduce (train.py:118)",
                         data={"stack": list(MAJORITY_STACK)}),
                Evidence("stack", f"rank {hung} is elsewhere: slow_data_loader", rank=hung,
                         data={"stack": list(culprit_stack)}),
                Evidence("procfs", f"rank {hung} main thread on CPU 99% of the window", rank=hung),
            ), id="i1"),)
    old: tuple[Incident, ...] = ()
    if closed:
        old = (Incident(kind="straggler", status=ATTRIBUTED, ranks=(1,), hosts=(ranks[min(1, n - 1)].host,),
                        since=now - 70.0, summary="rank 1 slowed every step by 40% (recovered)",
                        evidence=(Evidence("ebpf", "rank 1 waited 2% in collectives, the others 41%", rank=1),),
                        id="i0"),)
    return Snapshot(time=now, started=T0, job=job, views=views, incidents=incidents, closed=old,
                    probes={"procfs": None, "pystack": None, "ebpf": "needs root (CAP_BPF)",
                            "nvml": None if devices else "no NVIDIA driver"},
                    stall_after=10.0, step_times=step_times, wait_fractions=waits, stacks=stacks,
                    devices=devs, ended=False, bundle=None)


class ScriptedSource(SourceDefaults):
    """A Source that plays a list of snapshots (and their events), one per poll, then repeats the last."""

    def __init__(self, frames: Sequence[tuple[Any, Sequence[Any]]], *, interval: float = 0.25,
                 poll_delay: float = 0.0) -> None:
        self.frames = list(frames)
        self.interval = interval
        self.poll_delay = poll_delay
        self.snapshot: Any = None
        self.polls = 0
        self.diagnoses = 0
        self.closed = False
        self.in_poll = 0
        self.max_in_poll = 0

    def poll(self) -> list[Any]:
        import time

        self.in_poll += 1
        self.max_in_poll = max(self.max_in_poll, self.in_poll)
        try:
            if self.poll_delay:
                time.sleep(self.poll_delay)
            i = min(self.polls, len(self.frames) - 1)
            self.polls += 1
            snap, events = self.frames[i]
            self.snapshot = snap
            return list(events) if self.polls - 1 < len(self.frames) else []
        finally:
            self.in_poll -= 1

    def diagnose_now(self, window: float = 3.0) -> Diagnosis:
        self.diagnoses += 1
        return diagnosis_of(self.snapshot)

    def close(self) -> None:
        self.closed = True


def opened(snap: Any) -> list[Any]:
    return [Event("incident_opened", snap.time, i) for i in snap.incidents]


def churn(snap: Any, i: int, *, seed: int = 7) -> Any:
    """``snap`` a poll later: a few ranks change state, every rank gets a new step time."""
    from dataclasses import replace

    rnd = random.Random(seed + i)
    n = len(snap.views)
    views = dict(snap.views)
    for r in rnd.sample(range(n), min(n, 16)):
        v = views[r]
        if r not in {x for inc in snap.incidents for x in inc.ranks}:
            views[r] = replace(v, state=rnd.choice(("running", "waiting", "busy", "idle")))
    steps = {r: (*v[1:], round(1.0 + rnd.random() * 0.1, 3)) for r, v in snap.step_times.items()}
    waits = {r: (*v[1:], round(rnd.random() * 0.5, 3)) for r, v in snap.wait_fractions.items()}
    return replace(snap, time=snap.time + 0.5, views=views, step_times=steps, wait_fractions=waits)


async def measure_refresh(n: int = 1024, frames: int = 20, *, size: tuple[int, int] = (200, 60),
                          per_host: int = 8) -> dict[str, list[float]]:
    """Seconds per dashboard refresh for an ``n``-rank job, each frame a new snapshot in which ranks
    changed state. CPU time of the UI thread (so that other processes on a busy machine do not count):
    ``apply`` (widgets updated from the snapshot), ``paint`` (the screen's layout and
    compositor work that follows: every widget that changed re-rendered and written out), ``render``
    (the two together: the refresh budget), ``wall`` (snapshot handed over until Pilot saw the app
    idle: an upper bound that includes Pilot's own waiting)."""
    import time

    from textual.screen import Screen

    from scout_sys.tui.app import make_app

    spent = [0.0]
    depth = [0]

    def timed(fn: Any) -> Any:
        def wrapper(self: Any, *a: Any, **kw: Any) -> Any:
            depth[0] += 1
            t = time.thread_time()
            try:
                return fn(self, *a, **kw)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    spent[0] += time.thread_time() - t
        return wrapper

    saved = Screen._on_timer_update, Screen._refresh_layout  # noqa: SLF001 - measured, then restored
    Screen._on_timer_update = timed(saved[0])  # type: ignore[method-assign]
    Screen._refresh_layout = timed(saved[1])  # type: ignore[method-assign]
    snap = synthetic_snapshot(n, per_host=per_host, hung=n // 2 + 3, devices=True)
    app = make_app(ScriptedSource([(snap, [])], interval=3600))
    out: dict[str, list[float]] = {"apply": [], "paint": [], "render": [], "wall": []}
    try:
        async with app.run_test(size=size) as pilot:
            await pilot.pause(0.2)
            for i in range(frames):
                snap = churn(snap, i)
                spent[0] = 0.0
                w0 = time.perf_counter()
                c0 = time.thread_time()
                app.snapshot = snap  # what the merged-burst path does once per refresh
                apply = time.thread_time() - c0
                await pilot.pause()
                out["wall"].append(time.perf_counter() - w0)
                out["apply"].append(apply)
                out["paint"].append(spent[0])
                out["render"].append(apply + spent[0])
    finally:
        Screen._on_timer_update, Screen._refresh_layout = saved  # type: ignore[method-assign]
    return out
