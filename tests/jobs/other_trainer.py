"""A trainer the detector was not written against: DDP, an embedding model, other call sites,
other fault mechanisms. Run by the tests under torchrun or a plain shell. ``--fault-when PATH``: the
fault comes at the first step from --fault-step on once PATH exists (a healthy test first, on one job)."""

import argparse
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def fetch_shard_from_object_store(deadline):
    """hang: waits on an event nobody sets (a stuck download)."""
    threading.Event().wait(max(0.0, deadline - time.time()))
    os._exit(0)


def crash_with_leaked_fds(code):
    """exit: a worker process inherits the sockets and outlives the rank."""
    pid = os.fork()
    if pid == 0:
        time.sleep(300)
        os._exit(0)
    os._exit(code)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--fault", default="none")
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-step", type=int, default=4)
    p.add_argument("--max-seconds", type=float, default=300)
    p.add_argument("--fault-when", default=None)
    a = p.parse_args()
    deadline = time.time() + a.max_seconds
    torch.set_num_threads(1)
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(nn.Sequential(nn.EmbeddingBag(100, 16), nn.Linear(16, 4)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = 0
    while time.time() < deadline:
        if rank == a.fault_rank and a.fault != "none" and (
                step >= a.fault_step and os.path.exists(a.fault_when) if a.fault_when else step == a.fault_step):
            print(f"OTHER fault {a.fault} rank={rank} pid={os.getpid()}", flush=True)
            if a.fault == "hang":
                fetch_shard_from_object_store(deadline)
            elif a.fault == "exit":
                crash_with_leaked_fds(7)
        ids = torch.randint(0, 100, (8, 5))
        loss = model(ids).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 5 == 0:
            dist.barrier()
        time.sleep(0.03)
        if rank == 0 and step % 10 == 0:
            print(f"OTHER step {step}", flush=True)
        step += 1
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
