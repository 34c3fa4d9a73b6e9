"""How long `scout-sys diagnose` takes beyond its window, and what it costs the job.

Starts a 4-rank demo job with a hung rank, runs the real command line N times, and reports the time
to answer minus the window (target: under 2 s). Then, on a healthy job, steps/s measured side by side
with and without a diagnose running (alternating), as a ratio.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time

from scout_sys.demo.launch import DemoJob


def _diagnose(pid: int, window: float) -> float:
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "scout_sys", "diagnose", "--job", str(pid), "--window", str(window),
                    "--json"], capture_output=True, check=False)
    return time.time() - t0


def _steps(job: DemoJob) -> int:
    found = re.findall(r"SCOUT-DEMO step step=(\d+)", job.log())
    return int(found[-1]) if found else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--window", type=float, default=3.0)
    a = ap.parse_args()
    with DemoJob(4, fault="hang", fault_rank=2) as job:
        job.wait_fault(timeout=120)
        time.sleep(1.5)
        extra = [_diagnose(job.pid, a.window) - a.window for _ in range(a.runs)]
    print(f"diagnose answer time beyond the {a.window:g} s window (hung 4-rank job, {a.runs} runs, incl. "
          f"interpreter start): median {statistics.median(extra):.2f} s, max {max(extra):.2f} s "
          f"(target < 2 s): {'OK' if max(extra) < 2.0 else 'MISSED'}")

    with DemoJob(4, args=["--log-every", "1", "--step-time", "0.02"]) as job:
        job.wait_steps(5, timeout=120)
        rates = {"without": [], "with": []}
        for i in range(2 * a.runs):
            mode = "with" if i % 2 else "without"
            s0, t0 = _steps(job), time.time()
            if mode == "with":
                _diagnose(job.pid, a.window)
            else:
                time.sleep(a.window + 0.5)
            rates[mode].append((_steps(job) - s0) / (time.time() - t0))
    w, wo = statistics.median(rates["with"]), statistics.median(rates["without"])
    print(f"job throughput while diagnosing vs not (alternating, {a.runs} each): {w:.1f} vs {wo:.1f} steps/s, "
          f"ratio {w / wo:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
