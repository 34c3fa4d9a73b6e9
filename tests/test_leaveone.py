"""consensus/leaveone.py: each member's "others" equal the copy they replace, values included."""

from __future__ import annotations

import random
import statistics

import pytest

from scout_sys.consensus.leaveone import Others, Sorted


def test_others_is_the_group_less_the_rank() -> None:
    ranks = [4, 7, 9, 12]
    for i, r in enumerate(ranks):
        o = Others(ranks, r, i)
        want = tuple(p for p in ranks if p != r)
        assert o == want and tuple(o) == want and len(o) == 3 and list(o[:]) == list(want)
        assert [o[j] for j in range(-3, 3)] == list(want[-3:] + want)
        with pytest.raises(IndexError):
            o[3]
    assert Others(ranks, 9) == (4, 7, 12)  # found without its index


def test_median_and_min_without_one_value_match_the_copy() -> None:
    rnd = random.Random(7)
    for n in range(2, 40):
        values = [rnd.randint(0, 5) for _ in range(n)]  # ties on purpose
        s = Sorted(values)
        for i, v in enumerate(values):
            rest = values[:i] + values[i + 1:]
            got = s.median_without(v)
            assert got == statistics.median(rest) and type(got) is type(statistics.median(rest))
            assert s.min_without(v) == min(rest)
    with pytest.raises(statistics.StatisticsError):
        Sorted([3]).median_without(3)
    with pytest.raises(ValueError):
        Sorted([1, 2]).median_without(5)
