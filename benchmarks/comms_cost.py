"""What the NCCL communicator probe (scout_sys/probes/ebpf/comms.py) costs: its compile and attach
time, the time it takes to detach, and what it adds to each NCCL collective call of a rank.

    sudo .venv/bin/python benchmarks/comms_cost.py [--calls 100000] [--rounds 3]

A child loads the real libnccl.so.2 (nvidia-nccl-cu12 wheel), "creates" a communicator as
tests/jobs/nccl_groups.py does (no GPU: the call fails, the probe records it and the handle the child
stored) and times ``--calls`` ncclAllReduce calls on it, without and with the probe attached, in
alternating rounds. Without a GPU each call returns an error at once, so the difference is the probe's
absolute cost per call (a GPU's ncclAllReduce takes tens of microseconds on the host alone).
Prints one line per round and a summary; with --json one object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scout_sys.model import Job, Rank  # noqa: E402
from scout_sys.probes.ebpf.comms import CommProbe  # noqa: E402
from tests._host import ebpf_reason, libnccl  # noqa: E402

CHILD = r"""
import ctypes, mmap, sys, time
lib = ctypes.CDLL(sys.argv[1])
m = mmap.mmap(-1, 16 << 20)
h = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(m)))
uid = (ctypes.c_char * 128)()
lib.ncclGetUniqueId(uid)
print("ready", flush=True)
for line in sys.stdin:
    n = int(line)
    lib.ncclCommInitRank(ctypes.byref(ctypes.c_void_p(h.value)), 1, uid, 0)
    buf = (ctypes.c_float * 16)()
    b = ctypes.c_void_p(ctypes.addressof(buf))
    f, cnt = lib.ncclAllReduce, ctypes.c_size_t(16)
    t = time.perf_counter()
    for _ in range(n):
        f(b, b, cnt, 7, 0, h, None)
    print((time.perf_counter() - t) / n, flush=True)
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    reason = ebpf_reason() or (None if libnccl() else "nvidia-nccl-cu12 not installed")
    if reason:
        print(f"skipped: {reason}")
        return 0
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(libnccl())], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout and child.stdin
    assert child.stdout.readline().strip() == "ready"

    def timed() -> float:
        child.stdin.write(f"{a.calls}\n")
        child.stdin.flush()
        return float(child.stdout.readline())

    plain, probed, compiles, closes = [], [], [], []
    try:
        for _ in range(a.rounds):
            plain.append(timed())
            p = CommProbe()
            t0 = time.monotonic()
            p.prepare([child.pid])  # it maps the library
            compiles.append((p.compile_s or 0.0, time.monotonic() - t0))
            p.start(Job(ranks=(Rank(rank=0, pid=child.pid, host="-"),), world_size=1, launcher="explicit",
                        launcher_pid=None, host="-"))
            probed.append(timed())
            assert p.calls() and p.calls()[0].calls == a.calls, p.calls()  # every call was counted
            t0 = time.monotonic()
            p.close()
            closes.append(time.monotonic() - t0)
            print(f"round: plain {plain[-1] * 1e6:.2f} us/call, probed {probed[-1] * 1e6:.2f} us/call, "
                  f"compile {compiles[-1][0]:.2f} s (prepare {compiles[-1][1]:.2f} s), close {closes[-1]:.2f} s")
    finally:
        child.kill()
        child.wait()
    out = {"plain_us": statistics.median(plain) * 1e6, "probed_us": statistics.median(probed) * 1e6,
           "added_us_per_call": (statistics.median(probed) - statistics.median(plain)) * 1e6,
           "compile_s": statistics.median(c for c, _ in compiles),
           "prepare_s": statistics.median(p for _, p in compiles), "close_s": statistics.median(closes),
           "load": os.getloadavg()[0]}
    print(json.dumps(out) if a.json else
          f"ncclAllReduce host call: {out['plain_us']:.2f} us plain, {out['probed_us']:.2f} us probed "
          f"(+{out['added_us_per_call']:.2f} us); compile {out['compile_s']:.2f} s, prepare {out['prepare_s']:.2f} s, "
          f"detach {out['close_s']:.2f} s (load {out['load']:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
