"""A GPU-shaped trainer the detector was not written against: gradient buckets are all-reduced with
``async_op=True`` from autograd hooks *during* backward (overlap, as DDP and FSDP do on GPUs), and the
step waits for them afterwards in a C call (``torch.futures.wait_all``, like ``loss.item()`` or
``cudaStreamSynchronize``), or busy-polls their futures (``--wait poll``, the CUDA driver's spin). No
waiting rank has a torch.distributed frame on its stack. Run by the tests under torchrun."""

import argparse
import os
import queue
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn


class Block(nn.Module):
    def __init__(self, d=24):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Overlap:
    """Reduce each parameter's gradient as soon as autograd produced it; wait at the end."""

    def __init__(self, model):
        self.pending = []
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(self._reduce)

    def _reduce(self, p):
        self.pending.append((p, dist.all_reduce(p.grad, async_op=True)))

    def synchronize(self, mode, deadline):
        futs = [w.get_future() for _, w in self.pending]
        if mode == "poll":
            while not all(f.done() for f in futs):
                if time.time() > deadline:
                    os._exit(0)
        else:
            torch.futures.wait_all(futs)
        for p, _ in self.pending:
            p.grad /= dist.get_world_size()
        self.pending.clear()


def prefetch_from_remote_cache(deadline):
    """hang: waits for a batch nobody puts in the queue."""
    try:
        queue.Queue().get(timeout=max(0.1, deadline - time.time()))
    except queue.Empty:
        os._exit(0)


def abort_keeping_sockets(code):
    """exit: a forked worker inherits the sockets and outlives the rank (peers hang, as on NCCL)."""
    if os.fork() == 0:
        time.sleep(300)
        os._exit(0)
    os._exit(code)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--fault", default="none", choices=["none", "hang", "stop", "exit", "slow"])
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-step", type=int, default=6)
    p.add_argument("--wait", default="block", choices=["block", "poll"])
    p.add_argument("--steps", type=int, default=10**9)
    p.add_argument("--max-seconds", type=float, default=300)
    a = p.parse_args()
    deadline = time.time() + a.max_seconds
    torch.set_num_threads(1)
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block(), nn.Linear(24, 3))
    sync = Overlap(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    while time.time() < deadline and step < a.steps:
        if rank == a.fault_rank and step == a.fault_step and a.fault not in ("none", "slow"):
            print(f"ASYNC fault {a.fault} rank={rank} pid={os.getpid()}", flush=True)
            if a.fault == "hang":
                prefetch_from_remote_cache(deadline)
            elif a.fault == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif a.fault == "exit":
                abort_keeping_sockets(9)
        x = torch.randn(6, 24)
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()  # buckets are reduced from here on
        if rank == a.fault_rank and a.fault == "slow":  # more data work every step: the others wait
            end = time.time() + 0.06
            while time.time() < end:
                torch.randn(64, 64) @ torch.randn(64, 64)
        sync.synchronize(a.wait, deadline)
        opt.step()
        time.sleep(0.02)
        if rank == 0 and step % 10 == 0:
            print(f"ASYNC step {step}", flush=True)
        step += 1
    if rank == 0:
        print("ASYNC done", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
