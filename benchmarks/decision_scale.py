"""The whole decision step (``Monitor.decide``: the learned peers, then every window rule) on synthetic
tp=8 x pp=4 x dp windows (benchmarks/_cases.py), per fault shape and size, in CPU seconds
(time.process_time). Target (issue 40): 65,536 ranks decided in < 1 CPU s."""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _cases  # noqa: E402

TARGET = 1.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1024,8192,65536")
    ap.add_argument("--faults", default="hang,exit,desync,common")
    a = ap.parse_args()
    for n in (int(x) for x in a.sizes.split(",")):
        for fault in a.faults.split(","):
            job, obs = _cases.job_of(n), _cases.observations(n, fault)
            t = time.process_time()
            d = _cases.decide(job, obs)
            d.incidents  # noqa: B018 - the merge is part of the step
            dt = time.process_time() - t
            print(f"decision {fault:>9} {n:>6,} ranks: {dt:.2f} CPU s (target < {TARGET:g} s"
                  f"{', met' if dt < TARGET else ', NOT met'})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
