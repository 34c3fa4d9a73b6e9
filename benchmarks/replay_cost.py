"""What replay and certify cost.

1. The live job's throughput while replay rounds run beside it vs without, in one run on the same
   job (windows alternate without / with so drift on a shared machine hits both alike; the ratio of
   the medians is reported), and how long one round takes (default kernel sizes).
2. certify's read speed on a >= 1 GB torch.save checkpoint next to plain reading of the same file
   (page cache warm for both, alternating), and with replica digests (folders of per-rank files).

Runs on 2 cores: ``python benchmarks/replay_cost.py [--nproc 4] [--gb 1.0]``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scout_sys.demo.launch import DemoJob  # noqa: E402
from scout_sys.job import find_job  # noqa: E402
from scout_sys.replay.runner import WorkerSet  # noqa: E402


def _steps(job: DemoJob) -> int:
    found = re.findall(r"SCOUT-DEMO step step=(\d+)", job.log())
    return int(found[-1]) if found else 0


def _rate(job: DemoJob, seconds: float) -> float:
    s0, t0 = _steps(job), time.time()
    time.sleep(seconds)
    return (_steps(job) - s0) / (time.time() - t0)


def replay_overhead(a: argparse.Namespace) -> None:
    rates: dict[str, list[float]] = {"without": [], "with": []}
    durations: list[float] = []
    with DemoJob(a.nproc, args=["--log-every", "1", "--step-time", str(a.step_time)]) as job:
        job.wait_steps(3, timeout=180)
        ws = WorkerSet(find_job(str(job.pid)), size=a.size, reps=3)
        t = time.time()
        ws.start()
        print(f"replay: {len(ws.workers)} workers started in {time.time() - t:.1f} s (torch import, not measured)")
        failed = [w.error for w in ws.workers if w.error]
        if failed:
            ws.close()
            raise SystemExit(f"replay workers failed: {failed}")
        try:
            n = 0
            for _ in range(a.windows):
                rates["without"].append(_rate(job, a.seconds))
                stop = threading.Event()

                def rounds(stop: threading.Event = stop) -> None:
                    nonlocal n
                    while not stop.is_set():
                        n += 1
                        t0 = time.time()
                        ws.round(n)
                        durations.append(time.time() - t0)

                th = threading.Thread(target=rounds)
                th.start()
                rates["with"].append(_rate(job, a.seconds))
                stop.set()
                th.join()
        finally:
            ws.close()
    wo, wi = statistics.median(rates["without"]), statistics.median(rates["with"])
    print(f"job throughput: {wo:.1f} steps/s without replay, {wi:.1f} with rounds running back to back: "
          f"ratio {wi / wo:.3f} ({a.nproc} ranks, step {a.step_time} s, {os.cpu_count()} cores)")
    print(f"replay round ({a.size} sizes, {a.nproc} devices at once): median {statistics.median(durations):.2f} s, "
          f"max {max(durations):.2f} s over {len(durations)} rounds")


def _plain(paths: list[str], buf: bytearray) -> float:
    t = time.perf_counter()
    for p in paths:
        with open(p, "rb", buffering=0) as f:  # into one reused buffer: no allocation per read
            while f.readinto(buf):
                pass
    return time.perf_counter() - t


def certify_speed(a: argparse.Namespace) -> None:
    import torch

    from scout_sys.replay import checkpoint as ck
    from scout_sys.replay.certify import certify

    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        g = torch.Generator().manual_seed(0)
        one = os.path.join(d, "one", "model.pt")
        os.makedirs(os.path.dirname(one))
        n = int(a.gb * (1 << 30) / 4 / 8)
        torch.save({f"layer{i}.weight": torch.randn(n, generator=g) for i in range(8)}, one)
        reps = os.path.join(d, "replicas")
        os.makedirs(reps)
        sd = {f"layer{i}.weight": torch.randn(n // 4, generator=g) for i in range(8)}
        for r in range(4):  # DDP ranks each saving the model: 4 x a quarter of the size
            torch.save(sd, os.path.join(reps, f"rank{r}.pt"))
        rep_files = ck.folder_files(reps)
        buf = bytearray(1 << 26)
        times: dict[str, list[float]] = {"plain1": [], "check1": [], "plainR": [], "certR": []}
        for _ in range(a.repeat):
            times["plain1"].append(_plain([one], buf))
            t = time.perf_counter()
            rep = ck.read(one)
            times["check1"].append(time.perf_counter() - t)
            assert rep.error is None and not rep.nonfinite
            times["plainR"].append(_plain(rep_files, buf))
            t = time.perf_counter()
            cert = certify([reps], state_dir=os.path.join(d, "state"))
            times["certR"].append(time.perf_counter() - t)
            assert cert["checkpoints"][0]["divergent"] == [] and not any(
                "replica" in r for r in cert["checkpoints"][0]["reasons"])
        m = {k: statistics.median(v) for k, v in times.items()}
        gb1 = os.path.getsize(one) / 1e9
        gbr = sum(os.path.getsize(p) for p in rep_files) / 1e9
        print(f"certify one {gb1:.2f} GB torch.save file (page cache warm): plain read {gb1 / m['plain1']:.2f} GB/s, "
              f"certify {gb1 / m['check1']:.2f} GB/s: {m['plain1'] / m['check1']:.2f}x the speed of plain reading")
        print(f"certify a folder of 4 replicas, {gbr:.2f} GB (content + tensor-by-tensor SHA-256 + vote): plain read "
              f"{gbr / m['plainR']:.2f} GB/s, certify {gbr / m['certR']:.2f} GB/s: "
              f"{m['plainR'] / m['certR']:.2f}x the speed of plain reading")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per window")
    ap.add_argument("--step-time", type=float, default=0.05)
    ap.add_argument("--size", choices=["default", "small"], default="default")
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the checkpoint is written (default: the temp dir)")
    ap.add_argument("--skip-replay", action="store_true")
    ap.add_argument("--skip-certify", action="store_true")
    a = ap.parse_args()
    if not a.skip_replay:
        replay_overhead(a)
    if not a.skip_certify:
        certify_speed(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
