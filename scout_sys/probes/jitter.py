"""The random part of every stack-sampling schedule (``diagnose``'s window, ``watch``'s polls)."""

from __future__ import annotations

import random

SPREAD = 0.5  # a jittered interval is drawn uniformly in [1 - SPREAD, 1 + SPREAD] x its mean


class Jitter:
    """Where on its schedule each stack sample falls. Training steps are periodic: on a fixed grid whose
    interval is near a multiple of the step (0.25 s against a 250 ms or 500 ms step), every sample lands
    at the same phase of the step, and a rank's "found waiting" count comes out all or nothing — the
    straggler rules' backing then misses a slow rank one window in two. Drawn around the schedule, the
    samples fall at every phase; the mean rate (hence py-spy's cost) is the fixed grid's.

    ``seed``: the draws of a unit test (None: unseeded)."""

    def __init__(self, seed: int | None = None) -> None:
        self.rng = random.Random(seed)

    def interval(self, mean: float) -> float:
        """An open-ended loop's next wait: uniform in [1 - SPREAD, 1 + SPREAD] x ``mean``."""
        return mean * self.rng.uniform(1.0 - SPREAD, 1.0 + SPREAD)

    def offset(self, period: float) -> float:
        """Where in its slot of a window's grid a sample falls: uniform in [0, ``period``) (a window of
        n slots keeps its n samples, each at a random phase)."""
        return period * self.rng.random()
