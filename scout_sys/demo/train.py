"""Demo trainer: a tiny MLP trained data-parallel on CPU with Gloo, with injectable faults.

Run under torchrun (``python -m torch.distributed.run --nproc-per-node 4 -m scout_sys.demo.train``)
or as plain processes with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set. This file imports
torch: it is the watched job, never part of the monitor.

Faults (``--fault KIND --fault-rank R --fault-step S``), each on one rank at one step:

- ``hang``: stuck forever (sleeping) in a data-loading function, outside any collective;
- ``stop``: the rank stops itself with SIGSTOP;
- ``busy``: a pure-Python busy loop that never returns;
- ``exit``: exits with ``--exit-code`` (default 3). A forked helper keeps the Gloo sockets open, as a
  dead GPU rank's peers see under NCCL, so the peers hang instead of failing fast;
- ``slow``: extra compute every step from step S on (a straggler);
- ``desync``: calls broadcast where every other rank calls all_reduce;
- ``desync-size``: calls all_reduce with a tensor of a different size.

``--sync``: how a rank waits for its gradients, i.e. which shape of job this is:

- ``blocking`` (default): one synchronous ``all_reduce`` (the Gloo/CPU shape: a waiting rank sits
  inside a ``torch.distributed`` frame, off CPU);
- ``spin``: the GPU/NCCL shape. Buckets are reduced with ``async_op=True`` (the call only enqueues),
  then the rank polls ``work.is_completed()`` and yields between polls, as the CUDA driver's default
  spin-wait does: a waiting rank has no collective frame on its stack and stays on a CPU;
- ``wait``: asynchronous buckets, then ``work.wait()`` (off CPU, still no collective frame: hand-written
  overlap, FSDP-style prefetch).

In the asynchronous shapes the ``desync`` fault issues its broadcast asynchronously too and waits for
it at the same place as everyone else, as on a GPU.

``--startup-seconds T``: every rank sleeps T seconds (a slow data set preparation) before training.

``--checkpoint-every N --checkpoint-seconds T``: every N steps rank 0 writes a checkpoint for about
T seconds while the others wait at a barrier (a healthy pause).

``--eval-every N --eval-seconds T``: every N steps every rank evaluates held-out batches for about T
seconds (forward passes, no collective), then the ranks average the metric with one all-reduce: a
validation phase, another healthy pause (no collective progress anywhere, every rank computing).

Every rank exits by itself after ``--max-seconds`` so a forgotten demo never outlives its welcome.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

MARK = "SCOUT-DEMO"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scout_sys.demo.train", description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=10**9)
    p.add_argument("--step-time", type=float, default=0.05, help="seconds of (sleeping) data time per step")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--fault", default="none",
                   choices=["none", "hang", "stop", "busy", "exit", "slow", "desync", "desync-size"])
    p.add_argument("--fault-rank", type=int, default=2)
    p.add_argument("--fault-step", type=int, default=5)
    p.add_argument("--fault-when", default=None, metavar="PATH",
                   help="inject the fault at the first step >= --fault-step at which PATH exists (tests that "
                        "must attach something first)")
    p.add_argument("--exit-code", type=int, default=3)
    p.add_argument("--fault-once", action="store_true",
                   help="inject the fault only in the first attempt (TORCHELASTIC_RESTART_COUNT=0)")
    p.add_argument("--slow-factor", type=float, default=4.0, help="slow: step takes this many times longer")
    p.add_argument("--sync", default="blocking", choices=["blocking", "spin", "wait"],
                   help="blocking all_reduce (Gloo shape), or async buckets with a spinning / blocking wait (GPU shape)")
    p.add_argument("--buckets", type=int, default=2, help="gradient buckets in the async shapes")
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--checkpoint-seconds", type=float, default=1.0)
    p.add_argument("--checkpoint-dir", default=None,
                   help="with --checkpoint-every: rank 0 also keeps DIR/step_N.pt (one torch.save each), as a job would")
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--eval-seconds", type=float, default=2.0)
    p.add_argument("--startup-seconds", type=float, default=0.0,
                   help="every rank prepares its data for this long (asleep) before the first step")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--max-seconds", type=float, default=600.0)
    return p.parse_args(argv)


class MLP(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def mark(what: str, **kv: object) -> None:
    fields = " ".join(f"{k}={v}" for k, v in kv.items())
    print(f"{MARK} {what} {fields}", flush=True)


# ----------------------------------------------------------------------------- faults
# Each fault is its own function so that its frame names the fault in a stack dump.


def load_next_batch_stuck(deadline: float) -> None:
    """hang: a data loader that never returns."""
    while time.time() < deadline:
        time.sleep(0.5)
    os._exit(0)


def spin_forever(deadline: float) -> None:
    """busy: a pure-Python loop that never returns."""
    x = 1
    while time.time() < deadline:
        for _ in range(10000):
            x = (x * 1103515245 + 12345) % 2147483648
    os._exit(0)


def stop_self() -> None:
    os.kill(os.getpid(), signal.SIGSTOP)


def exit_leaving_helper(code: int, deadline: float) -> None:
    """exit: die with ``code``; a forked helper holds the sockets so peers cannot tell."""
    if os.fork() == 0:
        while time.time() < deadline:
            time.sleep(0.5)
        os._exit(0)
    os._exit(code)


def desync_collective(t: torch.Tensor) -> None:
    dist.broadcast(t, src=dist.get_rank())


def desync_size(t: torch.Tensor) -> None:
    dist.all_reduce(torch.cat([t, t[:1]]))


# ----------------------------------------------------------------------------- training


def average_gradients(model: nn.Module) -> torch.Tensor:
    grads = [p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]
    flat = torch.cat(grads)
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for p in model.parameters():
        if p.grad is not None:
            n = p.grad.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n
    return flat


def wait_for_buckets(works: list, spin: bool, deadline: float) -> None:
    """The GPU shape's wait: poll and yield (the CUDA driver's spin-wait), or block in ``wait()``.
    Past ``deadline`` the rank exits, so a forgotten demo never spins forever."""
    if spin:
        while not all(w.is_completed() for w in works):
            os.sched_yield()
            if time.time() > deadline:
                os._exit(0)
    for w in works:
        try:  # returns at once when completed; raises the collective's error if it failed
            w.wait(timedelta(seconds=max(1.0, deadline - time.time())))
        except RuntimeError:
            if time.time() > deadline:
                os._exit(0)
            raise


def average_gradients_async(model: nn.Module, buckets: int, spin: bool, deadline: float, *,
                            desync: str = "none") -> None:
    """DDP-style bucketed reduction with ``async_op=True``: enqueue every bucket, then wait.
    ``desync``: ``desync`` issues a broadcast for the first bucket, ``desync-size`` a longer all_reduce."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    per = max(1, -(-len(grads) // max(1, buckets)))
    flats, works = [], []
    for i in range(0, len(grads), per):
        flat = torch.cat([g.reshape(-1) for g in grads[i:i + per]])
        if desync == "desync" and i == 0:
            works.append(dist.broadcast(flat, src=dist.get_rank(), async_op=True))
        elif desync == "desync-size" and i == 0:
            works.append(dist.all_reduce(torch.cat([flat, flat[:1]]), async_op=True))
        else:
            works.append(dist.all_reduce(flat, async_op=True))
        flats.append((grads[i:i + per], flat))
    wait_for_buckets(works, spin, deadline)
    for bucket, flat in flats:
        flat /= dist.get_world_size()
        offset = 0
        for g in bucket:
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            offset += n


def write_checkpoint(model: nn.Module, seconds: float, path: str) -> int:
    """Write the model repeatedly for about ``seconds`` (real file I/O), return bytes written."""
    end = time.time() + seconds
    written = 0
    while True:
        torch.save(model.state_dict(), path)
        with open(path, "ab") as f:  # pad so the write is visible in /proc/PID/io
            f.write(os.urandom(1 << 16))
            f.flush()
            os.fsync(f.fileno())
        written += os.path.getsize(path)
        if time.time() >= end:
            return written


def evaluate(model: nn.Module, seconds: float, gen: torch.Generator) -> float:
    """--eval-every: held-out batches for about ``seconds`` (no gradient, no collective), then the
    metric averaged over the ranks (one all-reduce), as a validation phase does."""
    end = time.time() + seconds
    total, n = 0.0, 0
    with torch.no_grad():
        while time.time() < end:
            x = torch.randn(256, 32, generator=gen)
            total += float(model(x).logsumexp(1).mean())
            n += 1
    metric = torch.tensor([total / max(1, n)])
    dist.all_reduce(metric)
    return float(metric) / dist.get_world_size()


def prepare_data(seconds: float) -> None:
    """--startup-seconds: a slow start-up (reading and preparing the data set) before training."""
    end = time.time() + seconds
    while time.time() < end:
        time.sleep(min(0.5, max(0.0, end - time.time())))


def extra_compute(seconds: float) -> None:
    a = torch.randn(128, 128)
    end = time.time() + seconds
    while time.time() < end:
        a = torch.tanh(a @ a)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    deadline = time.time() + args.max_seconds
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = MLP(args.hidden)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1000 + rank)
    ckpt = os.path.join(tempfile.gettempdir(), f"scout-demo-ckpt-{os.getpid()}.pt")
    mine = rank == args.fault_rank
    if args.fault_once and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        mine = False
    if rank == 0:
        mark("start", world=world, pid=os.getpid())
    if args.startup_seconds:
        prepare_data(args.startup_seconds)
        if rank == 0:
            mark("training", world=world)
    step = 0
    fault_step = args.fault_step
    try:
        for step in range(args.steps):
            if mine and step >= fault_step and args.fault_when and not os.path.exists(args.fault_when):
                fault_step = step + 1  # not yet
            if time.time() > deadline:
                break
            t0 = time.time()
            if mine and step == fault_step and args.fault not in ("none", "slow"):
                mark("fault", kind=args.fault, rank=rank, step=step, pid=os.getpid(), t=f"{time.time():.3f}")
                if args.fault == "hang":
                    load_next_batch_stuck(deadline)
                elif args.fault == "busy":
                    spin_forever(deadline)
                elif args.fault == "stop":
                    stop_self()
                elif args.fault == "exit":
                    exit_leaving_helper(args.exit_code, deadline)
            x = torch.randn(16, 32, generator=gen)
            y = torch.randint(0, 10, (16,), generator=gen)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            if args.sync != "blocking":
                average_gradients_async(model, args.buckets, args.sync == "spin", deadline,
                                        desync=args.fault if mine and step == fault_step else "none")
            else:
                if mine and step == fault_step and args.fault == "desync":
                    desync_collective(torch.zeros(8))
                elif mine and step == fault_step and args.fault == "desync-size":
                    desync_size(torch.zeros(8))
                average_gradients(model)
            opt.step()
            if mine and args.fault == "slow" and step >= fault_step:
                if step == fault_step:
                    mark("fault", kind="slow", rank=rank, step=step, pid=os.getpid())
                extra_compute(args.step_time * (args.slow_factor - 1.0))
            if args.checkpoint_every and step and step % args.checkpoint_every == 0:
                if rank == 0:
                    mark("checkpoint", step=step)
                    write_checkpoint(model, args.checkpoint_seconds, ckpt)
                    if args.checkpoint_dir:
                        torch.save(model.state_dict(), os.path.join(args.checkpoint_dir, f"step_{step}.pt"))
                dist.barrier()
            if args.eval_every and step and step % args.eval_every == 0:
                if rank == 0:
                    mark("eval", step=step)
                evaluate(model, args.eval_seconds, gen)
            time.sleep(max(0.0, args.step_time - (time.time() - t0)) if args.step_time else 0.0)
            if rank == 0 and args.log_every and step % args.log_every == 0:
                mark("step", step=step, loss=f"{loss.item():.4f}")
    finally:
        if os.path.exists(ckpt):
            os.unlink(ckpt)
    if rank == 0:
        mark("done", steps=step + 1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
