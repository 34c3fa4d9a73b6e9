"""Latency on the GPU shape next to the Gloo shape, side by side in one run:

- ``diagnose``: time to answer beyond its window on a hung 4-rank job whose waiters sleep inside
  ``all_reduce`` (``--sync blocking``) vs spin at a sync point with no collective frame (``spin``);
- ``watch --stall-after 5``, started in the same second as the job: seconds from the fault to the
  ``incident_opened`` event, per shape, with and without eBPF (target: within 10 s of the onset);
- the watch's cost on the spin-shaped 8-rank job runs in ``watch_overhead.py --sync spin``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from scout_sys.demo.launch import DemoJob


def diagnose_extra(sync: str, window: float, runs: int) -> list[float]:
    with DemoJob(4, fault="hang", fault_rank=2, args=["--sync", sync]) as job:
        job.wait_fault(timeout=180)
        time.sleep(2.0)
        out = []
        for _ in range(runs):
            t0 = time.time()
            p = subprocess.run([sys.executable, "-m", "scout_sys", "diagnose", "--job", str(job.pid), "--window",
                                str(window), "--json"], capture_output=True, text=True, check=False)
            out.append(time.time() - t0 - window)
            d = json.loads(p.stdout)
            named = [(i["kind"], i["ranks"]) for i in d["incidents"]]
            if named != [("hang", [2])]:
                print(f"  ! {sync}: diagnose named {named}")
        return out


def watch_latency(sync: str, ebpf: bool, timeout: float = 90.0) -> float | None:
    """Seconds from the fault marker to the watch's incident_opened (watch started with the job)."""
    with DemoJob(4, fault="hang", fault_rank=2, fault_step=60, args=["--sync", sync]) as job, \
            tempfile.TemporaryDirectory() as state:
        w = subprocess.Popen([sys.executable, "-m", "scout_sys", "watch", "--job", str(job.pid), "--headless",
                              "--json", "--stall-after", "5", "--state-dir", state] + ([] if ebpf else ["--no-ebpf"]),
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        opened: list[float] = []

        def read() -> None:
            assert w.stdout is not None
            for line in w.stdout:
                e = json.loads(line)
                if e["event"] == "incident_opened" and e["incident"]["ranks"] == [2] and not opened:
                    opened.append(time.time())

        t = threading.Thread(target=read, daemon=True)
        t.start()
        try:
            job.wait_fault(timeout=180)
            fault = time.time()
            end = fault + timeout
            while time.time() < end and not opened:
                time.sleep(0.1)
            return opened[0] - fault if opened else None
        finally:
            w.terminate()
            w.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--window", type=float, default=3.0)
    a = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs; diagnose over a {a.window:g} s window, {a.runs} runs per shape")
    for sync in ("blocking", "spin"):
        extra = diagnose_extra(sync, a.window, a.runs)
        print(f"  diagnose, {sync:8s}: answer {statistics.median(extra):.2f} s after the window (max {max(extra):.2f}; "
              f"target < 2 s)")
    print("watch --stall-after 5 started with the job: seconds from the fault to incident_opened (target <= 10)")
    for sync in ("blocking", "spin"):
        for ebpf in (False, True):
            lat = watch_latency(sync, ebpf)
            print(f"  {sync:8s} {'eBPF   ' if ebpf else 'no eBPF'}: " + (f"{lat:.1f} s" if lat is not None else "not opened"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
