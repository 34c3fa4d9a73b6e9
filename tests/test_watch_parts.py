"""The watch loop's parts on a fake clock and synthetic observations: no job, no process."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scout_sys.errors import NoRanks, TargetGone
from scout_sys.model import (
    ATTRIBUTED,
    HANG,
    INCONCLUSIVE,
    CollectiveSample,
    Evidence,
    Frame,
    Incident,
    Job,
    ProcSample,
    Rank,
    StackSample,
    ThreadStack,
)
from scout_sys.watch.hang import (
    CONFIRM_WINDOW,
    EARLY_MARGIN,
    MIN_STALL_AFTER,
    RECONFIRM_EVERY,
    HangWatch,
    new_phase,
)
from scout_sys.watch.incidents import MAX_EVIDENCE, IncidentBook, changed
from scout_sys.watch.progress import COLLECTIVES, MAIN_THREAD, STACK, Progress, Rotation
from scout_sys.watch.restart import ENDED, FOUND, SAME, WAITING, RankFinder
from scout_sys.watch.schedule import Every

T0 = 5_000.0


def _job(n: int = 4, missing: tuple[int, ...] = (), pid0: int = 100, launcher: int | None = 99) -> Job:
    ranks = tuple(Rank(rank=r, pid=pid0 + r, host="h", local_rank=r, world_size=n) for r in range(n) if r not in missing)
    return Job(ranks=ranks, world_size=n, launcher="torchrun", launcher_pid=launcher, host="h", missing=missing)


def _hang(rank: int = 2, *evidence: Evidence, status: str = ATTRIBUTED) -> Incident:
    return Incident(kind=HANG, status=status, ranks=(rank,) if status == ATTRIBUTED else (), hosts=("h",),
                    since=T0, summary=f"rank {rank} is stuck for {T0:.0f} s", evidence=evidence)


# ---------------------------------------------------------------- schedule

def test_every_is_due_once_per_period():
    e = Every(5.0)
    assert e.due(T0) and not e.due(T0 + 4.9) and e.due(T0 + 5.0) and not e.due(T0 + 6)
    e.reset(T0 + 20)
    assert not e.due(T0 + 24) and e.since(T0 + 24) == pytest.approx(4.0)
    assert Every(1.0, start=T0).due(T0 + 0.5) is False


# ---------------------------------------------------------------- incidents

def test_book_opens_updates_only_on_structured_change_and_closes_with_hysteresis():
    book = IncidentBook(close_after=2)
    stack = Evidence("stack", "rank 2 main thread: a", rank=2, data={"state": "idle", "stack": ["a"]})
    ev = book.reconcile([_hang(2, stack)], T0, frozenset({HANG}))
    assert [e.event for e in ev] == ["incident_opened"] and ev[0].incident.id == "inc-1"
    # only numbers moved: the same incident, no event
    same = Incident(kind=HANG, status=ATTRIBUTED, ranks=(2,), hosts=("h",), since=T0 + 3,
                    summary="rank 2 is stuck for 9999 s", evidence=(stack,))
    assert book.reconcile([same], T0 + 1, frozenset({HANG})) == []
    assert book.open[same.key()].since == T0  # the onset never moves later
    # a new kind of evidence (the rank is now stopped): updated
    stopped = Evidence("procfs", "rank 2 is stopped", rank=2, data={"state": "stopped"})
    ev = book.reconcile([_hang(2, stack, stopped)], T0 + 2, frozenset({HANG}))
    assert [e.event for e in ev] == ["incident_updated"]
    # one poll without it: still open; two: closed
    assert book.reconcile([], T0 + 3, frozenset({HANG})) == []
    ev = book.reconcile([], T0 + 4, frozenset({HANG}))
    assert [e.event for e in ev] == ["incident_closed"] and not book.open and book.ever_opened


def test_book_leaves_other_kinds_alone():
    book = IncidentBook()
    book.reconcile([_hang(1)], T0, frozenset({HANG}))
    for i in range(5):
        assert book.reconcile([], T0 + i, frozenset({"straggler"})) == []
    assert len(book.open) == 1


def test_reconfirming_a_long_hang_keeps_its_evidence_bounded_and_unique():
    book = IncidentBook()

    def on_open(inc):
        b = Evidence("procfs", "evidence bundle saved to /b", data={"bundle": "/b"})
        return Incident(**{**inc.__dict__, "evidence": inc.evidence + (b,)}), "/b"

    trigger = Evidence("procfs", "no progress for 6.0 s", data={"trigger": "stack", "stall": 6.0})
    stack = Evidence("stack", "rank 2 main thread: a", rank=2, data={"state": "idle"})
    opened = book.reconcile([_hang(2, stack, trigger)], T0, frozenset({HANG}), on_open=on_open)
    assert opened[0].bundle == "/b"
    for i in range(1, 200):  # an hour of reconfirms, each window's evidence with new numbers
        ev = Evidence("stack", f"rank 2 main thread: a ({i} samples)", rank=2, data={"state": "idle"})
        out = book.reconcile([_hang(2, ev)], T0 + i, frozenset({HANG}), on_open=on_open)
        assert all(e.event != "incident_opened" for e in out)
    inc = book.open[_hang(2).key()]
    texts = [e.text for e in inc.evidence]
    assert texts.count("evidence bundle saved to /b") == 1
    assert sum("no progress" in t for t in texts) == 1  # what triggered the watch stays, once
    assert len(inc.evidence) <= 3 <= MAX_EVIDENCE


def test_changed_compares_fields_not_text():
    a = _hang(2, Evidence("stack", "x 1", rank=2, data={"state": "idle"}))
    b = _hang(2, Evidence("stack", "x 2", rank=2, data={"state": "idle"}))
    c = _hang(2, Evidence("stack", "x 2", rank=2, data={"state": "busy"}))
    assert not changed(a, b) and changed(a, c)


# ---------------------------------------------------------------- progress

def _proc(rank, t, *, status="sleeping", last_ran=None, blocks=None):
    return ProcSample(time=t, rank=rank, pid=100 + rank, status=status, cpu_time=0.0, main_cpu_ns=0,
                      main_last_ran=last_ran if last_ran is not None else t, main_voluntary=blocks)


def _stack(rank, t, fn="wait", line=1):
    frames = (Frame(function=fn, file="/j/train.py", line=line), Frame(function="main", file="/j/train.py", line=9))
    return StackSample(time=t, rank=rank, pid=100 + rank,
                       threads=(ThreadStack(tid=100 + rank, name="MainThread", active=True, frames=frames),))


def _coll(rank, t, seq):
    return CollectiveSample(time=t, rank=rank, pid=100 + rank, backend="gloo", group="gloo:0", seq=seq,
                            completed=None, inside=False, last_enter=None, last_exit=None, last=None)


def test_progress_main_thread_pause_is_the_gloo_signal():
    p = Progress()
    p.observe([_proc(r, T0 + 10, last_ran=T0) for r in range(3)] + [_proc(3, T0 + 10, status="running")], T0 + 10)
    assert p.stalled(0, T0 + 10) == (10.0, MAIN_THREAD)
    assert p.stalled(3, T0 + 10)[0] == 0.0
    assert p.majority(range(4), 4, T0 + 10) == (10.0, MAIN_THREAD)  # 3 of 4 paused 10 s


def test_progress_a_wake_up_caused_by_our_native_dump_is_not_progress():
    # witnesses asleep in a collective since T0; the bundle's native dump (ptrace) holds them at T0+10
    # and each main thread runs for a moment: their pause goes on; a real wake-up later still counts
    p = Progress()
    p.observe([_proc(r, T0 + 9, last_ran=T0) for r in range(4)], T0 + 9)
    p.held(T0 + 10)
    p.observe([_proc(r, T0 + 10.1, status="running") for r in range(4)], T0 + 10.1)  # seen while held
    assert p.pauses() == {r: pytest.approx(10.1) for r in range(4)}
    p.held(T0 + 10, T0 + 10.2)
    p.observe([_proc(r, T0 + 12, last_ran=T0 + 10.3) for r in range(3)] + [_proc(3, T0 + 12, last_ran=T0 + 11.5)],
              T0 + 12)
    assert p.pauses() == {0: 12.0, 1: 12.0, 2: 12.0, 3: pytest.approx(0.5)}
    assert p.majority(range(4), 4, T0 + 12) == (12.0, MAIN_THREAD)
    # a rank that was running when the dump began has no pause to keep
    p.observe([_proc(0, T0 + 13, status="running")], T0 + 13)
    p.held(T0 + 14, T0 + 14.1)
    p.observe([_proc(0, T0 + 15, last_ran=T0 + 14.1)], T0 + 15)
    assert p.pauses()[0] == pytest.approx(0.9)


def test_progress_stack_still_at_one_place_is_the_spin_signal_without_ebpf():
    p = Progress()
    for i in range(5):  # every main thread runs (spins); the stacks never leave `wait`
        t = T0 + 2 * i
        p.observe([_proc(r, t, status="running") for r in range(4)], t)
        p.observe([_stack(r, t, line=1 + i % 2) for r in range(3)] + [_stack(3, t, fn=f"step{i}")], t)
    assert p.stalled(0, T0 + 8) == (8.0, STACK)
    assert p.stalled(3, T0 + 8)[0] == 0.0  # it moves
    assert p.majority(range(4), 4, T0 + 8) == (8.0, STACK)


def test_progress_a_spinner_that_stopped_blocking_is_seen_every_poll_not_every_few_seconds():
    # the GPU shape without eBPF: healthy ranks sleep a moment every step (their main thread's voluntary
    # switches move); once they spin at their sync point they stop, long before two stack samples agree
    p = Progress()
    for i in range(8):  # 4 s healthy, one poll each 0.5 s
        t = T0 + 0.5 * i
        p.observe([_proc(r, t, status="running", blocks=10 * i) for r in range(4)], t)
    for i in range(1, 5):  # from T0 + 3.5: ranks 0-2 spin (no block); rank 3 naps in its loader
        t = T0 + 3.5 + 0.5 * i
        p.observe([_proc(r, t, status="running", blocks=70) for r in range(3)]
                  + [_proc(3, t, status="running", blocks=70 + i)], t)
    # they last blocked between T0 + 3.0 (60 switches) and T0 + 3.5 (70): the middle, 3.25
    assert p.stalled(0, T0 + 5.5) == (2.25, MAIN_THREAD)
    assert p.stalled(3, T0 + 5.5)[0] == 0.25  # it blocked since the poll before
    assert p.majority(range(4), 4, T0 + 5.5) == (2.25, MAIN_THREAD)
    never = Progress()  # a main thread never seen to block says nothing by it
    for i in range(8):
        never.observe([_proc(0, T0 + 0.5 * i, status="running", blocks=5)], T0 + 0.5 * i)
    assert never.stalled(0, T0 + 3.5)[0] == 0.0


def test_progress_one_place_counts_while_the_main_thread_keeps_waking_not_across_long_sleeps():
    # stacks seconds apart always at the same line: a loader napping 0.5 s at a time (stuck) has not
    # progressed; a healthy rank sleeping 2 s of each step at one line is judged by its pause instead
    p = Progress()
    for i in range(17):  # polls every 0.5 s for 8 s; a stack sample every 2 s
        t = T0 + 0.5 * i
        naps = _proc(0, t, last_ran=t - 0.5 * (i % 2))  # woke just now, or half a second ago
        steps = _proc(1, t, last_ran=T0 + 2.0 * (i // 4))  # runs once per 2 s step, then sleeps
        p.observe([naps, steps], t)
        if i % 4 == 0:
            p.observe([_stack(0, t), _stack(1, t)], t)
    assert p.stalled(0, T0 + 8) == (8.0, STACK)
    stall, signal = p.stalled(1, T0 + 8)
    assert signal == MAIN_THREAD and stall <= 2.0


def test_progress_a_waiter_inside_a_collective_is_judged_by_its_main_thread():
    # a healthy Gloo job whose ranks wait for a slow peer: every sample shows the same all_reduce line,
    # but the main thread wakes up each step (a collective completed): that is progress
    c10d = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    p = Progress()
    for i in range(6):
        t = T0 + 2 * i
        frames = (Frame(function="all_reduce", file=c10d, line=2800), Frame(function="main", file="/j/train.py", line=9))
        p.observe([StackSample(time=t, rank=0, pid=100, threads=(ThreadStack(tid=100, name="MainThread", active=False,
                                                                            frames=frames),))], t)
        p.observe([_proc(0, t, last_ran=t - 0.5)], t)
    assert p.stalled(0, T0 + 10) == (0.5, MAIN_THREAD)


def test_progress_collective_sequence_is_primary_when_seen():
    p = Progress()
    for i in range(6):
        t = T0 + i
        p.observe([_proc(r, t, last_ran=T0) for r in range(4)], t)  # main threads asleep all along...
        p.observe([_coll(r, t, seq=10 + i) for r in range(4)], t)  # ...but collectives keep coming
    assert p.stalled(0, T0 + 5) == (0.0, COLLECTIVES)
    for i in range(6, 12):
        t = T0 + i
        p.observe([_coll(r, t, seq=15) for r in range(4)], t)  # no collective any more
    assert p.majority(range(4), 4, T0 + 11) == (6.0, COLLECTIVES)
    p.forget()
    assert p.majority(range(4), 4, T0 + 11) == (0.0, MAIN_THREAD)


def test_progress_a_collective_sequence_stalls_from_the_last_entry_the_probe_timed_not_from_the_poll():
    # polls every 0.5 s; the ranks' last collective began at T0 + 1.1 (the probe's own clock), read at the
    # poll of T0 + 1.5: their stall counts from 1.1 (a hang is not seen up to a poll late)
    def coll(rank, t, seq, entered):
        return replace(_coll(rank, t, seq), last_enter=entered)
    p = Progress()
    for i in range(3):
        t = T0 + 0.5 * i
        p.observe([coll(r, t, seq=10 + i, entered=t - 0.05) for r in range(4)], t)
    for i in range(3, 8):
        t = T0 + 0.5 * i
        p.observe([coll(r, t, seq=13, entered=T0 + 1.1) for r in range(4)], t)
    assert p.majority(range(4), 4, T0 + 3.5) == (pytest.approx(2.4), COLLECTIVES)
    # an entry time from before the last sample of the old position (another group's older call, a clock
    # step) is clamped to that sample: never a stall longer than the samples allow
    q = Progress()
    q.observe([coll(0, T0, seq=1, entered=T0 - 0.1)], T0)
    q.observe([coll(0, T0 + 0.5, seq=2, entered=T0 - 5.0)], T0 + 0.5)
    assert q.stalled(0, T0 + 1.0) == (1.0, COLLECTIVES)


def test_majority_needs_a_strict_majority_of_the_whole_job():
    p = Progress()
    p.observe([_proc(0, T0 + 10, last_ran=T0), _proc(1, T0 + 10, last_ran=T0)], T0 + 10)
    assert p.majority([0, 1], 4, T0 + 10) == (0.0, "")  # 2 of 4 is not a strict majority


def test_rotation_reads_every_rank_within_its_period():
    rot = Rotation(period=2.0, interval=0.5)
    seen = [rot.take([0, 1, 2, 3]) for _ in range(4)]  # 4 polls = 2 s
    assert sorted(r for s in seen for r in s) == [0, 1, 2, 3]
    rot = Rotation(period=4.0, interval=0.5)
    assert [len(rot.take(list(range(8)))) for _ in range(8)] == [1] * 8  # 8 ranks: one dump a poll
    slow = [rot.take([0, 1, 2, 3], slow=True) for _ in range(10)]  # eBPF sees progress: dashboard only
    assert sum(map(len, slow)) == 2
    rot = Rotation(period=2.0, interval=0.5, max_per_poll=4)
    assert len(rot.take(list(range(64)))) == 4  # bounded per poll
    assert Rotation().take([]) == []


# ---------------------------------------------------------------- hang

def test_hang_watch_suspects_at_stall_after_and_backs_off_after_a_clean_window():
    h = HangWatch(stall_after=5.0)
    assert not h.decide(T0, 4.9, STACK, decisive=False, hang_open=False, learning=True).confirm
    d = h.decide(T0 + 1, 5.0, STACK, decisive=False, hang_open=False, learning=True)
    assert d.confirm and d.suspect and d.signal == STACK
    h.confirmed(T0 + 1, found=False, stall=5.0)  # the window showed no hang
    assert not h.decide(T0 + 2, 6.0, STACK, decisive=False, hang_open=False, learning=True).confirm
    assert h.decide(T0 + 3, 1.0, STACK, decisive=True, hang_open=False, learning=True).confirm  # a rank stopped
    assert h.decide(T0 + 4, 10.0, STACK, decisive=False, hang_open=False, learning=True).confirm  # twice as long
    assert h.decide(T0 + 6.1, 6.0, STACK, decisive=False, hang_open=False, learning=True).confirm  # quiet over


def test_hang_watch_holds_back_a_first_window_that_names_nobody_and_opens_when_the_next_agrees():
    unnamed = _hang(0, status=INCONCLUSIVE)
    h = HangWatch(stall_after=5.0)
    assert h.decide(T0, 6.0, STACK, decisive=False, hang_open=False, learning=True).confirm
    h.confirmed(T0, found=True, stall=6.0)
    assert h.hold([unnamed], hang_open=False)  # nobody named so far
    assert h.decide(T0 + 0.5, 6.5, STACK, decisive=False, hang_open=False, learning=True).confirm  # look again now
    assert not h.hold([unnamed], hang_open=False)  # the next window agrees: open it
    assert not h.hold([_hang(2)], hang_open=False)  # an origin is never held back
    assert h.hold([unnamed], hang_open=False)  # nobody named after an origin: held again
    assert not h.hold([unnamed], hang_open=True)  # an open hang stays as the window says
    assert not h.hold([], hang_open=False)


def test_hang_watch_reconfirms_an_open_hang_periodically_and_sooner_on_progress():
    h = HangWatch(stall_after=5.0)
    h.confirmed(T0, found=True, stall=6.0)
    assert not h.decide(T0 + 1, 7.0, MAIN_THREAD, decisive=False, hang_open=True, learning=False).confirm
    assert h.decide(T0 + RECONFIRM_EVERY, 11.0, MAIN_THREAD, decisive=False, hang_open=True, learning=False).confirm
    h.confirmed(T0 + RECONFIRM_EVERY, found=True, stall=11.0)
    later = T0 + RECONFIRM_EVERY + CONFIRM_WINDOW
    assert h.decide(later, 0.0, MAIN_THREAD, decisive=False, hang_open=True, learning=False).confirm  # progress seen


def _run(h: HangWatch, t: float, stalls, *, step: float = 0.5, learning: bool = True,
         signal: str = MAIN_THREAD) -> float:
    """Feed ``stalls`` one poll each ``step`` seconds from ``t``; returns the next poll's time."""
    for stall in stalls:
        h.decide(t, stall, signal, decisive=False, hang_open=False, learning=learning)
        t += step
    return t


def _steps(gap: float, n: int, step: float = 0.5) -> list[float]:
    """The majority's stall at each poll of ``n`` healthy stretches of ``gap`` seconds."""
    one = [k * step for k in range(int(gap / step) + 1)]
    return one * n


def test_hang_watch_learns_stall_after_from_the_recent_steady_gap_not_the_start_up():
    h = HangWatch()
    assert h.stall_after == MIN_STALL_AFTER  # the floor until enough gaps are known
    t = _run(h, T0, [k * 0.5 for k in range(21)])  # a 10 s start-up pause, then fast steps
    t = _run(h, t, [0.1] * 40)  # 20 s of progress at every poll
    assert h.stall_after == MIN_STALL_AFTER  # the start-up pause is not what the watch waits for
    t = _run(h, t, _steps(2.0, 30))  # slow steps: 2 s without progress each
    assert h.stall_after == pytest.approx(2.5 * 2.0)
    assert h.steady_gap() == pytest.approx(2.0)
    _run(h, t, _steps(4.0, 3), learning=False)  # not learnt while ranks are missing or probes settle
    assert h.stall_after == pytest.approx(5.0)
    assert HangWatch(stall_after=30).stall_after == 30


def _watch(h: HangWatch, t: float, stalls, *, hang: bool = False) -> tuple[float, list[float]]:
    """As _run, with the windows a suspicion starts (each 1 s of stacks; ``hang``: what they find)."""
    windows = []
    for stall in stalls:
        if h.decide(t, stall, MAIN_THREAD, decisive=False, hang_open=False, learning=True).confirm:
            windows.append(t)
            h.confirmed(t, found=hang, stall=stall)
            t += 1.0
        t += 0.5
    return t, windows


def test_a_hang_three_seconds_into_training_is_suspected_at_the_floor_whatever_the_start_up_taught():
    # The start-up of a watch started with torchrun (benchmarks/watch_defaults.py's fast job, logged):
    # stretches of 1.5, 3, 1 and 6 s without progress (imports, the rendezvous, the model's build), each
    # costing a fruitless window; then 2.5 s of 20 ms steps (progress at every poll); then a rank hangs.
    h = HangWatch()
    t = T0
    for stretch in (1.5, 3.0, 1.0, 6.0):
        t, _ = _watch(h, t, [0.0, *(k * 0.5 for k in range(1, int(stretch / 0.5) + 1))])
    assert h._fruitless >= 3
    t, _ = _watch(h, t, [0.05] * 5)
    assert h.stall_after == MIN_STALL_AFTER and not h._fruitless  # the start-up taught nothing
    onset = t
    _, windows = _watch(h, t, [k * 0.5 for k in range(1, 9)], hang=True)
    assert windows and windows[0] - onset <= MIN_STALL_AFTER
    assert new_phase([1.5, 3.0, 1.0, 6.0, 0.05, 0.05]) == 0  # not before MIN_RECENT steady gaps
    assert new_phase([2.0] * 8 + [4.9] + [2.0] * 5) == 0  # a slow step in slow steps: no phase
    assert new_phase([6.0, 0.05, 0.05]) == 0 and new_phase([]) == 0


def test_hang_watch_suspects_a_fast_job_at_the_floor_and_a_slow_one_later():
    h = HangWatch()
    t = _run(h, T0, [0.05] * 40, signal=COLLECTIVES)
    assert not h.decide(t, 1.4, COLLECTIVES, decisive=False, hang_open=False, learning=True).suspect
    d = h.decide(t + 0.5, 1.6, COLLECTIVES, decisive=False, hang_open=False, learning=True)
    assert d.suspect and d.confirm and d.threshold == MIN_STALL_AFTER
    slow = HangWatch()
    t = _run(slow, T0, _steps(2.0, 15), signal=COLLECTIVES)
    assert not slow.decide(t, 2.5, COLLECTIVES, decisive=False, hang_open=False, learning=True).suspect
    assert slow.decide(t + 2.5, 5.0, COLLECTIVES, decisive=False, hang_open=False, learning=True).confirm


def test_the_next_poll_comes_when_the_stretch_under_way_reaches_its_threshold_not_an_interval_later():
    h = HangWatch()
    t = _run(h, T0, [0.05] * 40, signal=COLLECTIVES)
    assert h.poll_wait(t, t, 0.5) == 0.5  # a healthy step's stretch is far from the threshold
    h.decide(t + 0.5, 1.2, COLLECTIVES, decisive=False, hang_open=False, learning=True)
    wait = h.poll_wait(t + 0.55, t + 0.5, 0.5)
    assert wait == pytest.approx(MIN_STALL_AFTER - 1.2 - 0.05 + EARLY_MARGIN)  # 0.27 s, not 0.45
    d = h.decide(t + 0.55 + wait, 1.2 + 0.05 + wait, COLLECTIVES, decisive=False, hang_open=False, learning=True)
    assert d.suspect and d.confirm  # that poll takes the window
    h.confirmed(t + 2.0, found=False, stall=2.0)  # fruitless: the quiet time, not the threshold, decides now
    h.decide(t + 2.5, 1.4, COLLECTIVES, decisive=False, hang_open=False, learning=True)
    assert h.poll_wait(t + 2.5, t + 2.5, 0.5) == 0.5
    assert h.poll_wait(t + 3.2, t + 2.5, 0.5) == 0.0  # an overrun poll: at once


def test_hang_watch_forgets_what_the_coarse_signals_taught_once_the_collective_probe_sees_the_ranks():
    h = HangWatch()
    t = _run(h, T0, _steps(3.0, 12), signal=STACK)  # a spinner read by sparse stack samples, probes compiling
    assert h.stall_after > 5.0
    t = _run(h, t, [0.05] * 4, signal=COLLECTIVES)  # the collective probe attached: its gaps, from the floor
    assert h.stall_after == MIN_STALL_AFTER and not h.pauses
    assert h.decide(t, 1.6, COLLECTIVES, decisive=False, hang_open=False, learning=True).confirm


def test_a_pause_cadence_never_covers_every_moment():
    h = HangWatch()
    h.pauses.extend([(T0, 3.0), (T0 + 3.0, 3.0)])  # a period of 3 s: a 2 s slack would cover it all
    assert h.known_pause(T0 + 6.1) == 3.0
    assert h.known_pause(T0 + 7.5) is None


def test_hang_watch_learns_a_repeating_pause_and_stops_paying_a_window_for_it():
    h = HangWatch()
    t = _run(h, T0, [0.05] * 20)  # fast steps: the floor
    windows = []
    for _k in range(5):  # a 2 s checkpoint every 10 s: the window sees the writer progress
        for stall in [0.0, 0.5, 1.0, 1.5, 2.0]:
            d = h.decide(t, stall, MAIN_THREAD, decisive=False, hang_open=False, learning=True)
            if d.confirm:
                windows.append(t)
                h.confirmed(t, found=False, stall=stall)
            t += 0.5
        t = _run(h, t, [0.05] * 15)  # 7.5 s of steps: 10 s from one pause's start to the next
    assert len(windows) == 2  # the first two pauses cost a window each; then their cadence is known
    assert len(h.pauses) == 5 and h.known_pause(t) == pytest.approx(2.0)
    assert h.threshold(t + 0.5, 0.5) == pytest.approx(1.5 * 2.0 + 0.5)  # a stretch at the cadence waits longer
    assert h.threshold(t + 5.0, 0.5) == MIN_STALL_AFTER  # one between two checkpoints does not
    assert h.stall_after == MIN_STALL_AFTER  # the pauses are not steady gaps


def test_hang_watch_suspects_a_desync_at_once():
    h = HangWatch()
    d = h.decide(T0, 0.2, COLLECTIVES, decisive=False, hang_open=False, learning=True, desync=True)
    assert d.confirm and d.signal == "collective fingerprints"


# ---------------------------------------------------------------- restart / waiting for ranks

class FakeProcesses:
    """What find_job would say at each moment, and whether the selected process lives."""

    def __init__(self) -> None:
        self.job: Job | None = None
        self.exists = True
        self.lives = True

    def find(self, sel: str) -> Job:
        if not self.exists:
            raise TargetGone(f"no process {sel}")
        if self.job is None:
            raise NoRanks("no rank processes found")
        return self.job


def test_finder_waits_for_a_launcher_that_has_not_forked_yet():
    fp = FakeProcesses()
    f = RankFinder("99", fp.find, lives=lambda s: fp.lives, look_every=0.5)
    assert f.first(T0).status == WAITING
    assert f.first(T0 + 0.1).status == WAITING  # not even looked: cheap
    fp.job = _job(4, missing=(2, 3))  # two of four ranks started
    assert f.first(T0 + 60).status == WAITING  # waits for the others...
    fp.job = _job(4)
    found = f.first(T0 + 61)
    assert found.status == FOUND and found.job is fp.job and f.launcher_pid == 99


def test_finder_takes_a_partial_job_after_the_grace_period():
    fp = FakeProcesses()
    fp.job = _job(4, missing=(3,))
    f = RankFinder("99", fp.find, lives=lambda s: True, grace=10.0)
    assert f.first(T0).status == WAITING
    assert f.first(T0 + 10).status == FOUND  # rank 3 never came: the rules will call it missing


def test_finder_errors_are_one_line_and_only_when_the_job_cannot_come():
    fp = FakeProcesses()
    fp.exists = False
    with pytest.raises(TargetGone):  # no such process at all
        RankFinder("99", fp.find, lives=lambda s: False).first(T0)
    fp = FakeProcesses()
    f = RankFinder("99", fp.find, lives=lambda s: fp.lives)
    assert f.first(T0).status == WAITING
    fp.lives = False  # the launcher ended without starting a rank
    with pytest.raises(NoRanks, match="ended without ever starting a rank"):
        f.first(T0 + 5)
    fp = FakeProcesses()
    f = RankFinder("99", fp.find, lives=lambda s: True, wait_ranks=30)
    assert f.first(T0).status == WAITING
    with pytest.raises(NoRanks, match="--wait-ranks"):
        f.first(T0 + 30)


def test_finder_follows_a_restart_and_says_when_the_job_ended():
    fp = FakeProcesses()
    old = _job(4)
    fp.job = old
    f = RankFinder("99", fp.find, lives=lambda s: True, grace=10.0)
    assert f.first(T0).status == FOUND
    assert f.follow(old, T0 + 1).status == SAME  # the same processes: judge them
    fp.job = _job(4, missing=(1, 2, 3), pid0=200)  # the launcher starts new ranks one by one
    assert f.follow(old, T0 + 3).status == WAITING
    fp.job = _job(4, pid0=200)
    found = f.follow(old, T0 + 5)
    assert found.status == FOUND and "restarted" in found.note and found.job.ranks[0].pid == 200
    fp.exists = False
    f.launcher_pid = None
    assert f.follow(found.job, T0 + 7).status == ENDED


def test_inconclusive_and_attributed_hangs_are_distinct_incidents():
    book = IncidentBook()
    ev = book.reconcile([_hang(2), _hang(0, status=INCONCLUSIVE)], T0, frozenset({HANG}))
    assert len(ev) == 2 and {e.incident.status for e in ev} == {ATTRIBUTED, INCONCLUSIVE}


# ---------------------------------------------------------------- views (for people)

def test_views_keep_the_last_place_and_take_the_state_from_proc():
    from scout_sys.watch.views import Views

    v = Views()
    v.from_stacks([_stack(1, T0, fn="load_batch")])
    assert v.views[1].where.endswith("load_batch") and v.stacks[1][0].endswith("load_batch")
    v.from_procs([_proc(1, T0 + 5, status="stopped")], T0 + 5)
    assert v.views[1].state == "stopped" and v.views[1].where.endswith("load_batch")
    v.from_procs([ProcSample(time=T0 + 6, rank=1, pid=101, status="gone")], T0 + 6)
    assert v.views[1].state == "exited"


def test_finder_waits_for_an_env_selector_until_its_ranks_appear():
    # a Slurm prolog starts the watch before any process of the job exists: nothing to outlive, so it
    # waits (no TargetGone, no "ended without ranks"), and says what for
    fp = FakeProcesses()
    f = RankFinder("env:SLURM_JOB_ID=7", fp.find, look_every=0.5)  # the real rule of how long it waits
    found = f.first(T0)
    assert found.status == WAITING and "SLURM_JOB_ID=7" in found.note
    assert f.first(T0 + 3600).status == WAITING  # an hour later, still
    fp.job = _job(4)
    assert f.first(T0 + 3601).status == FOUND
    f = RankFinder("env:SLURM_JOB_ID=7", FakeProcesses().find, wait_ranks=30)
    assert f.first(T0).status == WAITING
    with pytest.raises(NoRanks, match="--wait-ranks"):
        f.first(T0 + 30)
