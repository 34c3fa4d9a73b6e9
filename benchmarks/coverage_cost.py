"""What checkpoint coverage costs while watching (docs/replay.md, "Coverage while watching").

One CPU-bound job (``--step-time 0``) that writes a torch.save checkpoint every ``--every`` steps
into its working directory; windows alternate ``watch --no-replay`` and ``watch`` (coverage on, its
default), so drift on a shared machine hits both alike. Prints the ratio of the median throughputs
(target >= 0.97) and the replay rounds the covered windows ran.

``python benchmarks/coverage_cost.py [--nproc 4] [--windows 2] [--seconds 25]`` (part of ``make bench``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from scout_sys.demo.launch import DemoJob  # noqa: E402


def _steps(job: DemoJob) -> int:
    found = re.findall(r"SCOUT-DEMO step step=(\d+)", job.log())
    return int(found[-1]) if found else 0


def _window(job: DemoJob, state: str, seconds: float, cover: bool) -> float:
    cmd = [sys.executable, "-m", "scout_sys", "watch", "--job", str(job.pid), "--headless", "--json", "--no-ebpf",
           "--state-dir", state] + ([] if cover else ["--no-replay"])
    w = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        time.sleep(3.0)  # the watch's own start (not what is measured)
        s0, t0 = _steps(job), time.time()
        time.sleep(seconds)
        return (_steps(job) - s0) / (time.time() - t0)
    finally:
        w.terminate()
        w.wait(timeout=60)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--windows", type=int, default=2)
    p.add_argument("--seconds", type=float, default=25.0)
    p.add_argument("--every", type=int, default=200, help="steps between two checkpoints")
    a = p.parse_args()
    rates: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        os.mkdir(os.path.join(tmp, "checkpoints"))
        state = os.path.join(tmp, "state")
        with DemoJob(a.nproc, args=["--log-every", "1", "--step-time", "0", "--checkpoint-every", str(a.every),
                                    "--checkpoint-seconds", "0", "--checkpoint-dir", "checkpoints"],
                     env={"PYTHONPATH": ROOT}, cwd=tmp) as job:
            job.wait_steps(3, timeout=180)
            for _ in range(a.windows):
                rates["off"].append(_window(job, state, a.seconds, False))
                rates["on"].append(_window(job, state, a.seconds, True))
        ledger = os.path.join(state, "replay", "ledger.jsonl")
        rounds = [json.loads(x) for x in open(ledger)] if os.path.exists(ledger) else []
        ckpts = len(os.listdir(os.path.join(tmp, "checkpoints")))
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    took = [e["time"] - e["started"] for e in rounds]
    print(f"coverage: {a.nproc}-rank CPU-bound job, {ckpts} checkpoints; steps/s without coverage "
          f"{[round(x, 1) for x in rates['off']]}, with {[round(x, 1) for x in rates['on']]}: "
          f"ratio {on / off:.3f} (target >= 0.97); {len(rounds)} replay round(s) "
          f"({', '.join(e['result'] for e in rounds)})"
          + (f", {statistics.median(took):.1f} s each" if took else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
