"""What `scout-sys watch` costs: the job's throughput with vs without a watch beside it, and the
watch's own CPU and memory, on an 8-rank demo job (targets: ratio >= 0.99, < 5% of one core,
< 200 MB RSS).

Runs alternate (without, with, without, with, ...) on the same job so that drift on a shared machine
hits both sides alike; the ratio of the medians is reported. ``--ebpf both`` (the default) starts a
watch with eBPF and one with ``--no-ebpf`` in each round, side by side on the same job; ``--sync
spin`` runs the job in the GPU shape (asynchronous buckets, a spinning wait), where every rank is
always on a CPU and the watch's CPU is taken from them.

The steady cost is measured once the watch's eBPF probes are attached (its Prometheus endpoint's
``scout_sys_probe_up``, read only while waiting): their one-off compile (clang, 20-60 s of a shared
2-core machine's CPU) is printed on its own line, not averaged into the steady cost.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import psutil

from scout_sys.demo.launch import DemoJob, free_port

PROBES = ("ebpf-collectives", "ebpf-sched")  # the kernel probes a Gloo job's watch attaches


def steps(job: DemoJob) -> int:
    found = re.findall(r"SCOUT-DEMO step step=(\d+)", job.log())
    return int(found[-1]) if found else 0


def watch_cpu(p: psutil.Process) -> tuple[float, float]:
    """The watch's CPU seconds: (its own, its helpers' (py-spy): reaped children and live ones)."""
    t = p.cpu_times()
    helpers = t.children_user + t.children_system
    for c in p.children(recursive=True):
        try:
            ct = c.cpu_times()
            helpers += ct.user + ct.system
        except psutil.Error:
            pass
    return t.user + t.system, helpers


def attached(port: int) -> bool:
    """The watch says (Prometheus) that its kernel probes are up."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return False
    return all(re.search(rf'scout_sys_probe_up{{[^}}]*probe="{p}"[^}}]*}} 1\.0', text) for p in PROBES)


def settle(p: psutil.Process, port: int, ebpf: bool, least: float, most: float = 300.0) -> float:
    """Wait ``least`` seconds, and with eBPF until the probes are attached; the watch's CPU seconds so far."""
    t0 = time.time()
    time.sleep(least)
    while ebpf and not attached(port) and time.time() - t0 < most:
        time.sleep(1.0)
    if ebpf and not attached(port):
        raise RuntimeError(f"the watch's eBPF probes did not attach within {most:g} s")
    return sum(watch_cpu(p))


def rate(job: DemoJob, seconds: float) -> float:
    s0, t0 = steps(job), time.time()
    time.sleep(seconds)
    return (steps(job) - s0) / (time.time() - t0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=30.0, help="measured seconds per watch")
    ap.add_argument("--ebpf", default="both", choices=["both", "on", "off"],
                    help="a watch with eBPF and one without each round (both), or one of them")
    ap.add_argument("--sync", default="blocking", choices=["blocking", "spin", "wait"],
                    help="the demo job's shape (scout_sys/demo/train.py --sync)")
    ap.add_argument("--step-time", type=float, default=0.05,
                    help="the demo job's paced step (0: CPU-bound, every cycle the watch takes is the job's)")
    ap.add_argument("--settle", type=float, default=10.0,
                    help="seconds between starting the watch and measuring at least; with eBPF, also until its probes "
                         "are attached (their one-off compile is not the steady cost)")
    a = ap.parse_args()
    modes = {"both": [False, True], "on": [True], "off": [False]}[a.ebpf]
    rates: dict[str, list[float]] = {"without": [], "with": []}
    cpu: dict[bool, list[tuple[float, float]]] = {m: [] for m in modes}
    rss: dict[bool, list[float]] = {m: [] for m in modes}
    compile_cpu: list[float] = []
    with DemoJob(a.nproc, args=["--log-every", "1", "--step-time", str(a.step_time), "--sync", a.sync]) as job, \
            tempfile.TemporaryDirectory() as state:
        job.wait_steps(5, timeout=180)
        for _ in range(a.rounds):
            for ebpf in modes:
                rates["without"].append(rate(job, a.seconds))
                port = free_port()
                cmd = [sys.executable, "-m", "scout_sys", "watch", "--job", str(job.pid), "--headless", "--json",
                       "--state-dir", state, "--prometheus", f"127.0.0.1:{port}"] + ([] if ebpf else ["--no-ebpf"])
                w = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                p = psutil.Process(w.pid)
                try:
                    settled = settle(p, port, ebpf, a.settle)
                    if ebpf:
                        compile_cpu.append(settled)
                    (o0, h0), t0 = watch_cpu(p), time.time()
                    r = rate(job, a.seconds)
                    (o1, h1), dt = watch_cpu(p), time.time() - t0
                    if ebpf:
                        rates["with"].append(r)
                    cpu[ebpf].append((100 * (o1 - o0) / dt, 100 * (h1 - h0) / dt))
                    rss[ebpf].append(p.memory_info().rss / 2**20)
                finally:
                    w.terminate()
                    w.wait(30)
    pace = "CPU-bound" if a.step_time <= 0 else f"paced at {a.step_time:g} s/step"
    print(f"watch beside a {a.nproc}-rank {a.sync} job ({pace}), {a.rounds} rounds of {a.seconds:g} s a watch, "
          f"{'eBPF on and off side by side' if len(modes) > 1 else 'eBPF ' + a.ebpf}:")
    if rates["with"]:
        w_, wo = statistics.median(rates["with"]), statistics.median(rates["without"])
        print(f"  job throughput with (eBPF) / without watch: {w_:.2f} / {wo:.2f} steps/s = ratio {w_ / wo:.3f} "
              "(target >= 0.99)")
    for ebpf in modes:
        own = statistics.median(c[0] for c in cpu[ebpf])
        helpers = statistics.median(c[1] for c in cpu[ebpf])
        total = statistics.median(sum(c) for c in cpu[ebpf])
        print(f"  watch CPU, eBPF {'on ' if ebpf else 'off'}: median {total:.1f}% of one core = its own {own:.1f}% "
              f"+ py-spy helpers {helpers:.1f}% (target < 5%); RSS max {max(rss[ebpf]):.0f} MB (target < 200 MB)")
    if compile_cpu:
        print(f"  one-off, before the steady cost: the watch's CPU until its probes attached (clang), median "
              f"{statistics.median(compile_cpu):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
