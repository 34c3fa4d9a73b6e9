"""consensus/commonmode.py: a common-mode hang (every rank this host sees stopped at one place, the
job's other ranks elsewhere) told from a long healthy step by what still moves; dropped when a strict
majority's collective sequence moved in the window, else kept with every progress signal said."""

from __future__ import annotations

from types import SimpleNamespace

from scout_sys.consensus import commonmode
from scout_sys.model import (
    ATTRIBUTED,
    HANG,
    INCONCLUSIVE,
    CollectiveSample,
    Evidence,
    Frame,
    Incident,
    Job,
    Rank,
    StackSample,
    ThreadStack,
)

WINDOW = (100.0, 103.0)
RANKS = [0, 1, 2, 3]
JOB = Job(ranks=tuple(Rank(rank=r, pid=10 + r, host="a") for r in RANKS), world_size=8, launcher="explicit",
          launcher_pid=None, host="a")


def _common(ranks=RANKS) -> Incident:
    return Incident(HANG, INCONCLUSIVE, (), ("a",), 90.0, "every rank here waits in all_reduce",
                    (Evidence("stack", "all wait", data={commonmode.MARK: True, "ranks": list(ranks)}),))


def _coll(rank: int, enter: float | None, exit_: float | None = None) -> CollectiveSample:
    return CollectiveSample(time=103.0, rank=rank, pid=10 + rank, backend="gloo", group="gloo:0", seq=7,
                            completed=None, inside=True, last_enter=enter, last_exit=exit_, last=None)


def _stack(rank: int, t: float, loader_line: int) -> StackSample:
    main = ThreadStack(10 + rank, "MainThread", True, (Frame("all_reduce", "/t/distributed_c10d.py", 5),))
    loader = ThreadStack(900 + rank, "loader", True, (Frame("fetch", "/t/loader.py", loader_line),))
    return StackSample(time=t, rank=rank, pid=10 + rank, threads=(main, loader))


def test_which_findings_are_common_mode():
    assert commonmode.is_common_mode(_common())
    assert not commonmode.is_common_mode(Incident(HANG, INCONCLUSIVE, (), ("a",), 90.0, "x"))  # no evidence
    assert not commonmode.is_common_mode(Incident(HANG, ATTRIBUTED, (2,), ("a",), 90.0, "x", _common().evidence))
    assert not commonmode.is_common_mode(Incident(HANG, INCONCLUSIVE, (), ("a",), 90.0, "x",
                                                  (Evidence("stack", "x", data={"ranks": RANKS}),)))


def test_a_majority_whose_collectives_moved_is_a_long_step_and_the_finding_is_dropped():
    # ranks 0, 1, 2 entered or finished a collective inside the window, rank 3 before it
    obs = [_coll(0, 101.0), _coll(1, 99.0, 102.5), _coll(2, 100.0), _coll(3, 95.0, 96.0), _coll(7, 102.0)]
    progressed, ev = commonmode.signals(JOB, {}, obs, RANKS, WINDOW)
    assert progressed and ev.source == "ebpf"
    assert ev.data["progress_signals"]["collectives"] == {"available": True, "moved": [0, 1, 2]}
    other = Incident(HANG, ATTRIBUTED, (5,), ("b",), 90.0, "rank 5")
    out, notes = commonmode.review(JOB, [_common(), other], {}, obs, WINDOW)
    assert out == [other]
    assert notes == ["ranks 0-3 stood at one place, but their collective sequence moved in the window: a long "
                     "step, not a hang"]


def test_half_is_no_majority_and_every_signal_is_said():
    obs = [_coll(0, 101.0), _coll(1, 102.0), _coll(2, 97.0), _coll(3, None, 98.0),
           # rank 1's loader thread moved between its two samples; rank 0's stayed; rank 2 has one sample
           _stack(0, 100.5, 7), _stack(0, 102.5, 7), _stack(1, 100.5, 7), _stack(1, 102.5, 8), _stack(2, 101.0, 7)]
    acts = {0: SimpleNamespace(cpu=0.30, main_cpu=0.05), 1: SimpleNamespace(cpu=0.04, main_cpu=0.02),
            2: SimpleNamespace(cpu=None, main_cpu=None)}
    progressed, ev = commonmode.signals(JOB, acts, obs, RANKS, WINDOW)
    assert not progressed  # two of four moved: not a strict majority
    d = ev.data["progress_signals"]
    assert d["ranks"] == RANKS and d["window"] == [100.0, 103.0]
    assert d["collectives"] == {"available": True, "moved": [0, 1]}
    assert d["threads"] == {"available": True, "moved": {"1": ["loader"]}}
    assert d["cpu_outside_main_percent"] == {"0": 25.0, "1": 2.0} and d["cpu_outside_main_moves"] == [0]
    assert ev.text == ("progress signals: collective sequence numbers (eBPF) of ranks 0-3: moved on ranks 0-1; "
                       "other threads' stacks: rank 1: loader moved; "
                       "CPU time outside the main thread: rank 0 25%, rank 1 2% of a core")
    assert commonmode.available_text(ev) == ("collective sequence numbers, main-thread stacks, other threads' stacks, "
                                             "CPU time")
    [kept], notes = commonmode.review(JOB, [_common()], acts, obs, WINDOW)
    assert notes == [] and kept.evidence[-1] == ev and kept.evidence[:-1] == _common().evidence
    assert kept.summary == ("every rank here waits in all_reduce; progress signals available: collective sequence "
                            "numbers, main-thread stacks, other threads' stacks, CPU time, none moved")


def test_without_ebpf_or_samples_the_signals_are_said_unavailable():
    before = [_coll(0, 90.0), _coll(1, 91.0)]  # the probe saw ranks 0 and 1, both before the window
    progressed, ev = commonmode.signals(JOB, {}, before, RANKS, WINDOW)
    assert not progressed and ev.data["progress_signals"]["collectives"] == {"available": True, "moved": []}
    assert "of ranks 0-1: unchanged (the last call 12.0 s before the window's end)" in ev.text
    progressed, ev = commonmode.signals(JOB, {}, [_stack(0, 101.0, 7)], RANKS, WINDOW)
    assert not progressed and ev.source == "procfs"
    assert ev.text == ("progress signals: collective sequence numbers: not available (no eBPF collective probe: "
                       "diagnose --ebpf); other threads' stacks: not available (fewer than two stack samples); "
                       "CPU time outside the main thread: not available")
    assert commonmode.available_text(ev) == "main-thread stacks"
    # two samples each, nothing moved: "still"
    _, ev = commonmode.signals(JOB, {}, [_stack(0, 101.0, 7), _stack(0, 102.0, 7)], RANKS, WINDOW)
    assert "other threads' stacks: still" in ev.text
