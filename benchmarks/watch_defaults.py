"""``watch`` at its defaults (no --stall-after): seconds from a fault to ``incident_opened``, and the
false alarms of each job's healthy twin, side by side with ``--stall-after 5`` in the same run.

Jobs (4-rank demo, Gloo on CPU; the watch is started with the job, as a user would, so it also sees
the start-up): ``fast`` (20 ms steps), ``slow`` (2 s steps), ``gpu`` (the GPU shape: async buckets,
``is_completed()`` polling, spinning waiters), ``startup`` (a 10 s pause before training, then 20 ms
steps), ``checkpoint`` (20 ms steps, rank 0 writes a 2 s checkpoint about every 10 s while the others
wait at a barrier), ``eval`` (20 ms steps, every rank evaluates for 3 s about every 9 s: no collective
anywhere meanwhile, then one all-reduce of the metric). The fault is a hang (a rank stuck in its data
loader, outside any collective); latency runs from the fault's own timestamp (the demo's marker) to the moment the event is read.
Healthy twins run ``--quiet`` seconds each (default 60; ``--quiet 600`` is the 10-minute check):
any incident there, attributed or inconclusive, is a false alarm.

Targets at the defaults: median <= 3 s on ``fast``, <= 10 s on every job, no incident on a healthy
twin. ``--jobs``, ``--modes`` and ``--runs`` narrow a run. Run alone (real jobs; the machine's load
moves the numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from scout_sys.demo.launch import DemoJob

FAST = ["--step-time", "0.02", "--log-every", "50"]
JOBS: dict[str, tuple[list[str], int]] = {  # demo arguments, fault step
    "fast": (FAST, 150),
    "slow": (["--step-time", "2.0", "--log-every", "1"], 8),
    "gpu": (["--sync", "spin", *FAST], 150),
    "startup": (["--startup-seconds", "10", *FAST], 150),
    "checkpoint": (["--checkpoint-every", "400", "--checkpoint-seconds", "2", *FAST], 700),
    "eval": (["--eval-every", "300", "--eval-seconds", "3", *FAST], 700),
}
MODES = {"defaults": [], "stall-after 5": ["--stall-after", "5"]}


class Watch:
    def __init__(self, job: DemoJob, state: str, args: list[str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "scout_sys", "watch", "--job", str(job.pid), "--headless",
                                      "--json", "--state-dir", state, *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.opened: list[tuple[float, dict]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("event") == "incident_opened":
                self.opened.append((time.time(), e["incident"]))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def latency(name: str, args: list[str], ebpf: bool, timeout: float = 60.0) -> tuple[float | None, str]:
    demo, step = JOBS[name]
    with DemoJob(4, fault="hang", fault_rank=2, fault_step=step, args=demo) as job, \
            tempfile.TemporaryDirectory() as state:
        w = Watch(job, state, [*args, *([] if ebpf else ["--no-ebpf"])])
        try:
            m = job.wait_for(r"SCOUT-DEMO fault .* t=([0-9.]+)", timeout=240)
            fault = float(m.group(1))
            end = time.time() + timeout
            while time.time() < end and not any(inc["ranks"] == [2] for _t, inc in w.opened):
                time.sleep(0.05)
            named = [t for t, inc in w.opened if inc["ranks"] == [2]]
            others = [f"{inc['kind']} {inc['status']} {inc['ranks']}" for t, inc in w.opened
                      if inc["ranks"] != [2] and (not named or t <= named[0])]
            return (named[0] - fault if named else None), "; ".join(others)
        finally:
            w.stop()


def false_alarms(name: str, args: list[str], ebpf: bool, seconds: float) -> list[str]:
    demo, _step = JOBS[name]
    with DemoJob(4, args=demo) as job, tempfile.TemporaryDirectory() as state:
        w = Watch(job, state, [*args, *([] if ebpf else ["--no-ebpf"])])
        try:
            time.sleep(seconds)
            if name == "checkpoint":
                assert len(re.findall("SCOUT-DEMO checkpoint", job.log())) >= 1, "no checkpoint written"
            return [f"{inc['kind']} {inc['status']} {inc['ranks']}: {inc['summary'][:80]}" for _t, inc in w.opened]
        finally:
            w.stop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", default=",".join(JOBS), help="comma-separated, of: " + ",".join(JOBS))
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated, of: " + ",".join(MODES))
    ap.add_argument("--ebpf", default="off,on", help="off, on or off,on")
    ap.add_argument("--runs", type=int, default=2, help="latency runs per job, mode and eBPF setting")
    ap.add_argument("--quiet", type=float, default=60.0,
                    help="seconds each healthy twin runs (0: skip them; 600 for the 10-minute check)")
    a = ap.parse_args()
    # `timeout` and Ctrl-C: unwind, so that every DemoJob (its own session) is stopped on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    jobs, modes = a.jobs.split(","), a.modes.split(",")
    ebpfs = [x == "on" for x in a.ebpf.split(",")]
    print(f"machine: {os.cpu_count()} CPUs; 4-rank demo jobs, watch started with the job; {a.runs} run(s) each; "
          f"healthy twins {a.quiet:g} s each")
    worst = 0.0
    if a.runs > 0:
        print("seconds from the fault to incident_opened (targets at the defaults: median <= 3 on fast, <= 10 on all)")
    for name in jobs if a.runs > 0 else []:
        for ebpf in ebpfs:
            for mode in modes:
                lats, notes = [], []
                for _ in range(a.runs):
                    lat, other = latency(name, MODES[mode], ebpf)
                    lats.append(lat)
                    if other:
                        notes.append(other)
                got = [x for x in lats if x is not None]
                text = ", ".join("-" if x is None else f"{x:.1f}" for x in lats)
                med = f"median {statistics.median(got):.1f}" if got else "never named"
                print(f"  {name:10s} {'eBPF   ' if ebpf else 'no eBPF'} {mode:14s}: {med} ({text})"
                      + (f"  also opened: {' | '.join(notes)}" if notes else ""), flush=True)
                if mode == "defaults":
                    worst = max([worst, *(x if x is not None else float("inf") for x in lats)])
    if a.quiet > 0:
        print(f"healthy twins, {a.quiet:g} s each: incidents opened (target: none)")
        for name in jobs:
            for ebpf in ebpfs:
                for mode in modes:
                    alarms = false_alarms(name, MODES[mode], ebpf, a.quiet)
                    print(f"  {name:10s} {'eBPF   ' if ebpf else 'no eBPF'} {mode:14s}: "
                          + (f"{len(alarms)}: {' | '.join(alarms)}" if alarms else "none"), flush=True)
    if a.runs > 0:
        print(f"worst latency at the defaults: {worst:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
