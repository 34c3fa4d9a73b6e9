"""The dashboard's pure helpers, on synthetic records up to 10,000 ranks."""

from __future__ import annotations

from dataclasses import replace

from scout_sys.model import ATTRIBUTED, INCONCLUSIVE, Incident, RankView
from scout_sys.text import compress
from scout_sys.tui.state import (
    TIMING_ROWS,
    category,
    group_stacks,
    median_series,
    overall,
    parse_filter,
    pyspy_frame,
    short_host,
    sparkline,
    suspects,
    timing_rows,
)


def test_compress() -> None:
    assert compress([0, 1, 2, 3, 5, 7, 8]) == "0-3,5,7-8"
    assert compress([]) == "" and compress([4]) == "4" and compress([3, 1, 2, 2]) == "1-3"


def test_category_and_suspects() -> None:
    assert category(RankView(0, "running")) == "progressing"
    assert category(RankView(0, "busy")) == "progressing"
    assert category(RankView(0, "waiting")) == "waiting"
    assert category(RankView(0, "idle")) == "stalled"
    assert category(RankView(0, "disk-sleep")) == "stalled"
    assert category(RankView(0, "stopped")) == "stopped"
    assert category(RankView(0, "exited")) == "exited"
    assert category(RankView(0, "weird")) == "unknown" and category(None) == "unknown"
    assert category(RankView(0, "waiting"), suspect=True) == "suspect"
    incs = [Incident("hang", ATTRIBUTED, (2,), ("h",), 0.0, "x"), Incident("hang", INCONCLUSIVE, (), (), 0.0, "y")]
    assert suspects(incs) == {2}


def test_filter_terms() -> None:
    f = parse_filter("3, 10-12 waiting host:node7")
    assert f is not None
    assert f(3, "a", "progressing") and f(11, "a", "progressing") and not f(13, "a", "progressing")
    assert f(99, "a", "waiting") and f(99, "node7.x", "exited") and not f(99, "node8", "exited")
    s = parse_filter("busy")  # a state means its category
    assert s is not None and s(1, "h", "progressing")
    assert parse_filter("  ") is None


def test_stack_groups_majority_and_outliers() -> None:
    maj = ("c10d.py:1 all_reduce", "train.py:118 step", "train.py:160 main")
    odd = ("train.py:97 slow", "train.py:112 step", "train.py:160 main")
    stacks = {r: maj for r in range(10_000)}
    stacks[4321] = odd
    groups = group_stacks(stacks, suspect=frozenset({4321}))  # its speed: benchmarks/stack_grouping.py
    assert [len(g.ranks) for g in groups] == [9999, 1]
    assert groups[0].majority and not groups[0].suspect and groups[0].differs == 0
    assert groups[1].ranks == (4321,) and groups[1].suspect and groups[1].differs == 2
    # no strict majority: no group is called the majority
    tie = group_stacks({0: maj, 1: maj, 2: odd, 3: odd})
    assert not any(g.majority for g in tie)
    assert group_stacks({0: maj, 1: odd}, ranks=[1])[0].ranks == (1,)


def test_frames_and_hosts_are_printable() -> None:
    assert pyspy_frame("/a b/train.py:42 step") == "step (/a b/train.py:42)"
    assert pyspy_frame("weird\x1b[31m") == "weird?[31m"
    assert short_host("node7.cluster.example") == "node7" and short_host("10.0.0.7") == "10.0.0.7"
    assert len(short_host("x" * 40, 12)) == 12


def test_sparkline() -> None:
    assert sparkline([], 4) == "    "
    assert sparkline([0, 1, 2, 4], 4) == "▁▃▅█"
    assert sparkline([1, 1], 4, top=2.0) == "  ▅▅"
    assert len(sparkline(list(range(100)), 16)) == 16


def test_header_status_word_and_style() -> None:
    from scout_sys.tui.synthetic import synthetic_snapshot

    s = synthetic_snapshot(8, hung=2)
    assert overall(None) == ("STARTING", "bold")
    assert overall(s, "RuntimeError: boom") == ("ERROR RuntimeError: boom", "bold white on dark_orange3")
    assert overall(s) == ("INCIDENT hang rank 2", "bold white on red")
    two = Incident("hang", INCONCLUSIVE, (), (), 0.0, "no majority")
    assert overall(replace(s, incidents=(two, *s.incidents)))[0] == "INCIDENT hang (inconclusive) +1 more"
    wide = Incident("straggler", ATTRIBUTED, (4, 5, 6), (), 0.0, "slow")
    assert overall(replace(s, incidents=(wide,)))[0] == "INCIDENT straggler ranks 4-6"
    assert overall(replace(s, incidents=(), ended=True)) == ("JOB ENDED", "bold white on grey35")
    assert overall(replace(s, incidents=())) == ("HEALTHY", "bold black on green")


def test_timing_rows_suspects_selected_then_the_slowest_visible() -> None:
    steps = {r: (1.0, 1.0 + r / 100) for r in range(20)}
    steps[3] = (1.0, 9.0)
    assert timing_rows(steps, frozenset({7}), range(20), 12) == [7, 12, 3, 19, 18, 17, 16]
    assert len(timing_rows(steps, frozenset(), range(20), None)) == TIMING_ROWS - 1  # the median row is last
    assert timing_rows(steps, frozenset(), [0, 1], None) == [1, 0]  # only visible ranks are picked
    assert timing_rows({0: ()}, frozenset({2}), [0], 2) == [2]  # no steps yet: no slowest


def test_median_series_aligned_at_the_newest_step() -> None:
    assert median_series([]) == () and median_series([(), ()]) == ()
    assert median_series([(1.0, 2.0, 3.0), (3.0, 4.0, 5.0), (2.0, 3.0, 10.0)]) == (2.0, 3.0, 5.0)
    assert median_series([(1.0, 2.0), (4.0,)]) == (1.0, 3.0)  # a shorter series counts for its newest steps
    assert len(median_series([tuple(range(40))], width=16)) == 16
