"""A tiny Gloo job for the eBPF tests and the overhead benchmark (run under torchrun).

Every step all-reduces a small gradient-like tensor (a 2-layer MLP's worth, in two buckets) and does
a little compute. Faults, on one rank at one step:

  --fault other_op    the bad rank calls broadcast where the others all_reduce
  --fault other_size  the bad rank all-reduces a tensor of a different size
  --fault hang        the bad rank sleeps forever before the step's collective
  --fault alloc       the bad rank allocates (and touches) memory until something kills it (1 GiB at most)

It starts stepping once the file given by --go exists (so a probe can attach first), rank 0 writes
"STEPS SECONDS" to --out when given, and every rank sleeps --hold seconds at the end.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--fault", choices=["none", "other_op", "other_size", "hang", "alloc"], default="none")
    ap.add_argument("--bad-rank", type=int, default=2)
    ap.add_argument("--bad-step", type=int, default=5)
    ap.add_argument("--go", default="")
    ap.add_argument("--hold", type=float, default=0.0)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--out", default="", help="file to write 'steps seconds' to (rank 0)")
    a = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    model = torch.nn.Sequential(torch.nn.Linear(a.width, a.width), torch.nn.ReLU(),
                                torch.nn.Linear(a.width, 1))
    x = torch.randn(32, a.width)
    while a.go and not os.path.exists(a.go):
        time.sleep(0.05)
    dist.barrier()
    t0 = time.perf_counter()
    step = 0
    while step < a.steps:
        loss = model(x).pow(2).mean()
        loss.backward()
        weights = torch.cat([p.grad.flatten() for p in model[0].parameters()])
        head = torch.cat([p.grad.flatten() for p in model[2].parameters()])
        bad = rank == a.bad_rank and step == a.bad_step
        if bad and a.fault == "hang":
            time.sleep(3600)
        if bad and a.fault == "alloc":
            hoard = []  # 1 MiB at a time, every page written: charged to the rank's memory cgroup;
            while len(hoard) < 1024:  # at most 1 GiB when no limit stops it (then it hangs)
                hoard.append(b"\x01" * (1 << 20))
            time.sleep(3600)
        if bad and a.fault == "other_op":
            dist.broadcast(weights, src=0)
        elif bad and a.fault == "other_size":
            dist.all_reduce(weights[:-7])
        else:
            dist.all_reduce(weights)
        dist.all_reduce(head, op=dist.ReduceOp.MAX)
        for p in model.parameters():
            p.grad = None
        step += 1
    elapsed = time.perf_counter() - t0
    if a.out and rank == 0:
        with open(a.out, "w") as f:
            f.write(f"{step} {elapsed}\n")
    if a.hold:
        time.sleep(a.hold)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
