"""How long `q` takes to give the terminal back: the real `scout-sys watch` dashboard in tmux beside a
healthy demo job (by default the GPU shape: 8 ranks spinning at their sync point, every CPU busy; eBPF
on, so probes are attached and must be detached), `q` sent once the ranks are drawn, timed until the
shell prompt is back (the process has exited). Target: < 1 s."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from scout_sys.demo.launch import DemoJob


def tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, check=False).stdout


def one(job: DemoJob, attached_for: float) -> float:
    sock = f"scout-bench-{os.getpid()}-{time.monotonic_ns()}"
    with tempfile.TemporaryDirectory() as tmp:
        done = os.path.join(tmp, "done")
        cmd = (f"{sys.executable} -m scout_sys watch --job {job.pid} --state-dir {tmp}; "
               f"date +%s.%N > {done}; sleep 30")
        subprocess.run(["tmux", "-L", sock, "new-session", "-d", "-s", "w", "-x", "150", "-y", "45", cmd], check=True)
        try:
            end = time.time() + 120
            while time.time() < end and "ranks by host" not in tmux(sock, "capture-pane", "-p", "-t", "w"):
                time.sleep(0.2)
            time.sleep(attached_for)
            t0 = time.time()
            tmux(sock, "send-keys", "-t", "w", "q")
            while time.time() < t0 + 60:
                try:
                    with open(done) as f:
                        return float(f.read()) - t0
                except (OSError, ValueError):  # not there yet, or being written
                    time.sleep(0.02)
            raise TimeoutError("the watch did not exit within 60 s of q")
        finally:
            tmux(sock, "kill-server")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("--sync", default="spin", choices=["blocking", "spin", "wait"],
                    help="the demo job's shape (scout_sys/demo/train.py --sync)")
    ap.add_argument("--runs", type=int, default=3, help="quits with the probes attached")
    a = ap.parse_args()
    if shutil.which("tmux") is None:
        print("tmux is not installed: skipped")
        return 0
    with DemoJob(a.nproc, args=["--sync", a.sync]) as job:
        job.wait_steps(2, timeout=180)
        early = one(job, 0.5)  # quit while the eBPF probes may still be compiling
        late = [one(job, 40.0) for _ in range(a.runs)]  # probes attached (compiling takes 20-40 s on 2 busy cores)
    print(f"q to prompt beside a {a.nproc}-rank {a.sync} job: {early:.2f} s right after start (probes compiling); "
          f"with probes attached: {', '.join(f'{t:.2f}' for t in late)} s, median {statistics.median(late):.2f} s, "
          f"max {max(late):.2f} s (target < 1 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
