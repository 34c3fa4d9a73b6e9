"""What `scout-sys watch` costs: the job's throughput with vs without a watch beside it, and the
watch's own CPU and memory, on an 8-rank demo job (targets: ratio >= 0.99, < 5% of one core,
< 200 MB RSS).

Runs alternate (without, with, without, with, ...) on the same job so that drift on a shared machine
hits both sides alike; the ratio of the medians is reported. ``--no-ebpf`` measures procfs+stacks
alone; ``--sync spin`` runs the job in the GPU shape (asynchronous buckets, a spinning wait), where
every rank is always on a CPU and the watch's CPU is taken from them.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

from scout_sys.demo.launch import DemoJob


def steps(job: DemoJob) -> int:
    found = re.findall(r"SCOUT-DEMO step step=(\d+)", job.log())
    return int(found[-1]) if found else 0


def watch_cpu(p: psutil.Process) -> float:
    """The watch's CPU seconds, its helpers (py-spy) included: reaped children, and live ones."""
    t = p.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for c in p.children(recursive=True):
        try:
            ct = c.cpu_times()
            total += ct.user + ct.system
        except psutil.Error:
            pass
    return total


def rate(job: DemoJob, seconds: float) -> float:
    s0, t0 = steps(job), time.time()
    time.sleep(seconds)
    return (steps(job) - s0) / (time.time() - t0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=15.0, help="measured seconds per run")
    ap.add_argument("--no-ebpf", action="store_true")
    ap.add_argument("--sync", default="blocking", choices=["blocking", "spin", "wait"],
                    help="the demo job's shape (scout_sys/demo/train.py --sync)")
    ap.add_argument("--step-time", type=float, default=0.05,
                    help="the demo job's paced step (0: CPU-bound, every cycle the watch takes is the job's)")
    ap.add_argument("--settle", type=float, default=30.0,
                    help="seconds between starting the watch and measuring: the probes' one-off compile (clang, "
                         "about 20 s on a loaded 2-core machine) is not the steady cost")
    a = ap.parse_args()
    rates: dict[str, list[float]] = {"without": [], "with": []}
    cpu, rss = [], []
    with DemoJob(a.nproc, args=["--log-every", "1", "--step-time", str(a.step_time), "--sync", a.sync]) as job, \
            tempfile.TemporaryDirectory() as state:
        job.wait_steps(5, timeout=180)
        for _ in range(a.rounds):
            rates["without"].append(rate(job, a.seconds))
            cmd = [sys.executable, "-m", "scout_sys", "watch", "--job", str(job.pid), "--headless", "--json",
                   "--state-dir", state] + (["--no-ebpf"] if a.no_ebpf else [])
            w = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            p = psutil.Process(w.pid)
            time.sleep(a.settle)  # let the probes attach; their one-off compile is not the steady cost
            c0 = watch_cpu(p)
            t0 = time.time()
            rates["with"].append(rate(job, a.seconds))
            cpu.append(100 * (watch_cpu(p) - c0) / (time.time() - t0))
            rss.append(p.memory_info().rss / 2**20)
            w.terminate()
            w.wait(30)
    w_, wo = statistics.median(rates["with"]), statistics.median(rates["without"])
    mode = "procfs+stacks" if a.no_ebpf else "procfs+stacks+eBPF"
    pace = "CPU-bound" if a.step_time <= 0 else f"paced at {a.step_time:g} s/step"
    print(f"watch ({mode}) beside a {a.nproc}-rank {a.sync} job ({pace}), {a.rounds} alternating rounds of "
          f"{a.seconds:g} s:")
    print(f"  job throughput with/without watch: {w_:.2f} / {wo:.2f} steps/s = ratio {w_ / wo:.3f} (target >= 0.99)")
    print(f"  watch CPU (py-spy helpers included): median {statistics.median(cpu):.1f}% of one core (target < 5%)")
    print(f"  watch RSS: max {max(rss):.0f} MB (target < 200 MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
