"""What `watch --prometheus` costs when Prometheus scrapes it every second: the job's throughput and
the watch's CPU with vs without a scraper, on the same watch beside an 8-rank demo job (targets: job
ratio >= 0.99, < 1% of one core more for the watch).

One watch runs throughout; phases alternate (not scraped, scraped every second, ...) so that drift on
a shared machine hits both sides alike; ratios of medians are reported. The machinery (step counting,
the watch's CPU with its py-spy helpers) is benchmarks/watch_overhead.py's.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import psutil
from watch_overhead import rate, watch_cpu

from scout_sys.demo.launch import DemoJob, free_port


def _scraper(url: str, stop: threading.Event, sizes: list[int]) -> None:
    while not stop.wait(1.0):
        try:
            sizes.append(len(urllib.request.urlopen(url, timeout=5).read()))
        except OSError:
            sizes.append(0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=15.0, help="measured seconds per phase")
    ap.add_argument("--step-time", type=float, default=0.05)
    a = ap.parse_args()
    rates: dict[str, list[float]] = {"quiet": [], "scraped": []}
    cpu: dict[str, list[float]] = {"quiet": [], "scraped": []}
    sizes: list[int] = []
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with DemoJob(a.nproc, args=["--log-every", "1", "--step-time", str(a.step_time)]) as job, \
            tempfile.TemporaryDirectory() as state:
        job.wait_steps(5, timeout=180)
        w = subprocess.Popen([sys.executable, "-m", "scout_sys", "watch", "--job", str(job.pid), "--headless",
                              "--json", "--state-dir", state, "--prometheus", f"127.0.0.1:{port}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            p = psutil.Process(w.pid)
            time.sleep(20)  # let the probes attach; their one-off compile is not the steady cost
            for _ in range(a.rounds):
                for phase in ("quiet", "scraped"):
                    stop = threading.Event()
                    t = threading.Thread(target=_scraper, args=(url, stop, sizes), daemon=True)
                    if phase == "scraped":
                        t.start()
                    c0, t0 = watch_cpu(p), time.time()
                    rates[phase].append(rate(job, a.seconds))
                    cpu[phase].append(100 * (watch_cpu(p) - c0) / (time.time() - t0))
                    stop.set()
                    if t.is_alive():
                        t.join()
        finally:
            w.terminate()
            w.wait(30)
    scraped, quiet = statistics.median(rates["scraped"]), statistics.median(rates["quiet"])
    c_s, c_q = statistics.median(cpu["scraped"]), statistics.median(cpu["quiet"])
    ok = sum(1 for s in sizes if s)
    print(f"watch --prometheus beside a {a.nproc}-rank job (paced at {a.step_time:g} s/step), "
          f"{a.rounds} alternating rounds of {a.seconds:g} s per phase:")
    print(f"  scrapes: {ok}/{len(sizes)} answered, {statistics.median(sizes) if sizes else 0:.0f} bytes each")
    print(f"  job throughput scraped/quiet: {scraped:.2f} / {quiet:.2f} steps/s = ratio {scraped / quiet:.3f} "
          f"(target >= 0.99)")
    print(f"  watch CPU scraped/quiet: {c_s:.2f}% / {c_q:.2f}% of one core = {c_s - c_q:+.2f} points (target < 1)")
    return 0 if ok == len(sizes) else 1


if __name__ == "__main__":
    sys.exit(main())
