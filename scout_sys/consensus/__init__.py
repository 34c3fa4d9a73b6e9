"""Consensus: pure functions over observations (no I/O, no clocks, no processes).

``c3`` is the one place that knows what a strict majority is; the rules (``hang``, ...) build
per-rank signatures and call it.
"""
