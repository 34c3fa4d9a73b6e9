"""C3: the one place that knows what a strict majority is.

Given one signature per rank of a group of equivalent peers, :func:`vote` answers

- ``agree``: every rank has the same signature (a *common mode*: nobody stands out);
- ``attributed``: more than half of the ranks share one signature; the others are the minority;
- ``inconclusive``: no signature is held by more than half of the ranks (ties included).

Signatures are any hashable values; ``None`` is a signature like any other (e.g. "no data").
Pure: no I/O, no clocks. O(n) in the number of ranks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

AGREE = "agree"
ATTRIBUTED = "attributed"
INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class Vote:
    status: str
    majority: tuple[int, ...]  # ranks holding the majority signature (all ranks when agree)
    minority: tuple[int, ...]  # every other rank (empty unless attributed)
    signature: Hashable = None  # the majority's signature (None when inconclusive)
    counts: tuple[tuple[Hashable, int], ...] = ()  # every signature with its count, largest first

    @property
    def attributed(self) -> bool:
        return self.status == ATTRIBUTED


def strict_majority(k: int, n: int) -> bool:
    """``k`` of ``n`` is more than half (ties are not): the one test every rule asks of a count."""
    return 2 * k > n


def majority_size(n: int) -> int:
    """The fewest of ``n`` that are a strict majority."""
    return n // 2 + 1


def vote(signatures: Mapping[int, Hashable]) -> Vote:
    """Strict-majority vote over ``rank -> signature``."""
    n = len(signatures)
    if n == 0:
        return Vote(INCONCLUSIVE, (), ())
    counts = Counter(signatures.values())
    ranked = tuple(sorted(counts.items(), key=lambda kv: (-kv[1], repr(kv[0]))))
    sig, top = ranked[0]
    if top == n:
        return Vote(AGREE, tuple(sorted(signatures)), (), sig, ranked)
    if strict_majority(top, n):
        majority = tuple(sorted(r for r, s in signatures.items() if s == sig))
        minority = tuple(sorted(r for r, s in signatures.items() if s != sig))
        return Vote(ATTRIBUTED, majority, minority, sig, ranked)
    return Vote(INCONCLUSIVE, (), (), None, ranked)
