"""How often `scout-sys diagnose` (its default 3 s window) names a compute straggler, by how much slower
it is, side by side with the same job without one, in one run.

The job is tests/jobs/straggler_job.py: 4 DDP ranks over Gloo, each step ~30 ms of real compute, then,
when paced, a sleep to the step time; rank 3 does F times the work (F=1: the healthy twin). Each job is
diagnosed ``--runs`` times with the real command line. Per job: attributed to rank 3 / inconclusive /
healthy / anything else (a wrong rank, another kind). Paced at 100 ms, 4x the work (120 ms) is a
straggler. Unpaced (step time 0), every step waits for rank 3: 1.5x and 2x are stragglers too, the mild
ones (1.5x: its main thread busier than its peers' by ~15% of the window, under the busy measure's 20%
floor: not named, a known limit). Targets: every straggler attributed, every healthy twin healthy,
never a wrong rank. Run alone: the machine's load moves the numbers (on 2 cores, the ranks' compute
contends for the CPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter

from scout_sys.demo.launch import DemoJob

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(os.path.dirname(HERE), "tests", "jobs", "straggler_job.py")
WORK = ["--work", "1400"]
SLOW = 3
JOBS = "0.1:1,0.1:4,0:1,0:1.5,0:2"  # step time (0: unpaced):F


def _verdict(pid: int, window: float) -> str:
    out = subprocess.run([sys.executable, "-m", "scout_sys", "diagnose", "--job", str(pid), "--window",
                          str(window), "--json"], capture_output=True, text=True, check=False)
    try:
        d = json.loads(out.stdout)
    except ValueError:
        return f"error (exit {out.returncode})"
    got = [(i["kind"], i["status"], tuple(i["ranks"])) for i in d["incidents"]]
    if not got:
        return "healthy"
    if got == [("straggler", "attributed", (SLOW,))]:
        return "attributed"
    if got == [("straggler", "inconclusive", ())]:
        return "inconclusive"
    return "other: " + ", ".join(f"{k} {s} {list(r)}" for k, s, r in got)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", default=JOBS, help="comma-separated STEP_TIME:F (F=1: the healthy twin)")
    ap.add_argument("--runs", type=int, default=10, help="diagnoses per job")
    ap.add_argument("--window", type=float, default=3.0)
    a = ap.parse_args()
    print(f"diagnose (window {a.window:g} s) on a 4-rank DDP job (~30 ms of compute a step), rank {SLOW} doing "
          f"F times the work; {a.runs} diagnoses each; machine: {os.cpu_count()} CPUs")
    for spec in a.jobs.split(","):
        step, f = (float(x) for x in spec.split(":"))
        args = [*WORK, "--step-time", str(step)]
        args += [] if f == 1 else ["--slow-rank", str(SLOW), "--slow-factor", str(f)]
        with DemoJob(4, script=JOB, args=args) as job:
            job.wait_for(r"STRAGGLER-JOB step ", count=2)
            got = Counter(_verdict(job.pid, a.window) for _ in range(a.runs))
        want = "healthy" if f == 1 else "attributed"
        text = ", ".join(f"{k} {v}" for k, v in got.most_common())
        pace = f"paced {step * 1000:.0f} ms" if step else "unpaced"
        print(f"  {pace:13s} F={f:<4g}{' (healthy twin)' if f == 1 else ''}: {text}  "
              f"[{want}: {got[want]}/{a.runs}]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
