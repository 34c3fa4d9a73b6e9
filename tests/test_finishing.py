"""A job finishing is no dead rank (consensus/lifecycle.py clean_ends, watch/hang.py finishing): its
ranks end a moment apart, seconds apart when teardown is slow on a busy host; the first to end with
status 0 must not open a process_exit while the others are still tearing down."""

from __future__ import annotations

from scout_sys.consensus.lifecycle import clean_ends
from scout_sys.model import ExitRecord, ProcSample
from scout_sys.watch.hang import FINISHING_GRACE, HangWatch
from scout_sys.watch.progress import STACK

T0 = 1_000.0


def test_clean_ends_are_the_pids_that_ended_with_0_and_no_signal() -> None:
    obs = [
        ExitRecord(time=T0, rank=0, pid=100, exit_code=0, signal=None),
        ExitRecord(time=T0, rank=1, pid=101, exit_code=None, signal=15),
        ExitRecord(time=T0, rank=2, pid=102, exit_code=3, signal=None),
        ProcSample(time=T0, rank=3, pid=103, status="zombie", exit_code=0),
        ProcSample(time=T0, rank=4, pid=104, status="zombie", exit_code=None, exit_signal=9),
        ProcSample(time=T0, rank=5, pid=105, status="gone"),  # reaped at once, no eBPF: not known clean
        # a zombie read as 0 once, then the probe's record says it was killed: not clean
        ProcSample(time=T0, rank=6, pid=106, status="zombie", exit_code=0),
        ExitRecord(time=T0, rank=6, pid=106, exit_code=None, signal=6),
    ]
    assert clean_ends(obs) == {100, 103}


def _decide(h: HangWatch, t: float, stall: float, **kw: bool):
    return h.decide(t, stall, STACK, hang_open=False, learning=False, **{"decisive": False, **kw})


def test_a_clean_end_spares_the_others_stall_for_the_grace_then_looks() -> None:
    h = HangWatch()
    limit = h.threshold(T0, 0.0)
    assert _decide(HangWatch(), T0, limit + 1).confirm  # the same stall without a clean end is looked at
    assert not _decide(h, T0, limit + 1, finishing=True).suspect
    assert not _decide(h, T0 + 5, FINISHING_GRACE - 0.5, finishing=True).suspect
    d = _decide(h, T0 + 10, FINISHING_GRACE + 0.5, finishing=True)  # still there: a rank left early
    assert d.suspect and d.confirm


def test_a_dead_rank_beside_a_clean_end_is_still_decisive_at_once() -> None:
    d = _decide(HangWatch(), T0, 0.2, finishing=True, decisive=True)
    assert d.suspect and d.confirm
