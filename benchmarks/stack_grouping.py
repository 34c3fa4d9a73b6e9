"""How long the dashboard's stack panel takes to group 10,000 ranks' stacks (budget: 0.5 s).

``group_stacks`` runs on the UI thread each refresh; at 10,000 ranks it must stay well inside a
frame. Reports the CPU time of the median and worst of N runs (other processes on a shared machine
do not count), and whether the median is within the budget. Was a timed assertion in
tests/test_tui_state.py: a speed is measured here, not asserted in a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from scout_sys.tui.state import group_stacks

BUDGET_S = 0.5


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=15)
    a = ap.parse_args()
    maj = ("c10d.py:1 all_reduce", "train.py:118 step", "train.py:160 main")
    odd = ("train.py:97 slow", "train.py:112 step", "train.py:160 main")
    stacks = {r: maj for r in range(a.ranks)}
    stacks[a.ranks // 2] = odd
    times = []
    for _ in range(a.runs):
        t0 = time.thread_time()
        group_stacks(stacks, suspect=frozenset({a.ranks // 2}))
        times.append(time.thread_time() - t0)
    med = statistics.median(times)
    ok = med < BUDGET_S
    print(f"group_stacks, {a.ranks} ranks: median {med * 1000:.1f} ms, max {max(times) * 1000:.1f} ms CPU "
          f"({'within' if ok else 'OVER'} the {BUDGET_S * 1000:.0f} ms budget)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
