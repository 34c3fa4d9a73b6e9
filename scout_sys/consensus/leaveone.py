"""A group's statistics with one member left out, in O(1) or O(log n) instead of a copy per member.

The straggler rules compare each rank with "its peers": every other rank of its group. Built as a new
tuple per rank, with a median over it, that is quadratic in the group's size (16,384 ranks a pipeline
stage at 65,536 ranks). Here the group is sorted once and each member's "others" answered from it, with
exactly the values ``statistics.median`` / ``min`` give over the copy.

Pure: no I/O, no clocks.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Any, overload


class Others(Sequence[int]):
    """The members of ``ranks`` but ``rank``, in order, without copying them: what
    ``tuple(p for p in ranks if p != rank)`` holds (equal to that tuple, compared as a sequence)."""

    __slots__ = ("ranks", "rank", "_at")

    def __init__(self, ranks: Sequence[int], rank: int, at: int | None = None) -> None:
        self.ranks = ranks
        self.rank = rank
        self._at = ranks.index(rank) if at is None else at  # where ``rank`` is in ``ranks``

    def __len__(self) -> int:
        return len(self.ranks) - 1

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[int, ...]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return tuple(self)[i]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        return self.ranks[i if i < self._at else i + 1]

    def __iter__(self) -> Iterator[int]:
        for i, r in enumerate(self.ranks):
            if i != self._at:
                yield r

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"Others({len(self)} ranks, not {self.rank})"


class Sorted:
    """A multiset of numbers, sorted once: its median and minimum with one of its values left out."""

    __slots__ = ("values",)

    def __init__(self, values: Sequence[Any]) -> None:
        self.values = sorted(values)

    def __len__(self) -> int:
        return len(self.values)

    def _rest(self, j: int, gone: int) -> Any:
        return self.values[j if j < gone else j + 1]

    def median_without(self, value: Any) -> Any:
        """``statistics.median`` of the values with one occurrence of ``value`` removed (``value`` must be
        one of them). ``StatisticsError`` when nothing is left, as the median of nothing."""
        import statistics

        gone = bisect_left(self.values, value)
        if gone >= len(self.values) or self.values[gone] != value:
            raise ValueError(f"{value!r} is not one of the values")
        n = len(self.values) - 1
        if n == 0:
            raise statistics.StatisticsError("no median for empty data")
        if n % 2 == 1:
            return self._rest(n // 2, gone)
        i = n // 2
        return (self._rest(i - 1, gone) + self._rest(i, gone)) / 2

    def min_without(self, value: Any) -> Any:
        """``min`` of the values with one occurrence of ``value`` removed (``ValueError`` when none is left)."""
        if len(self.values) < 2:
            raise ValueError("min() of nothing")
        return self.values[1] if self.values[0] == value else self.values[0]
