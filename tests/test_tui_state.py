"""The dashboard's pure helpers, on synthetic records up to 10,000 ranks."""

from __future__ import annotations

import time

from scout_sys.model import ATTRIBUTED, INCONCLUSIVE, Incident, RankView
from scout_sys.text import compress
from scout_sys.tui.state import (
    category,
    group_stacks,
    parse_filter,
    pyspy_frame,
    short_host,
    sparkline,
    suspects,
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
    t0 = time.perf_counter()
    groups = group_stacks(stacks, suspect=frozenset({4321}))
    assert time.perf_counter() - t0 < 0.5
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
