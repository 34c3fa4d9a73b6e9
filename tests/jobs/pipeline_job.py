"""Pipeline-parallel test jobs on CPU / Gloo with no layout anywhere (nothing on the command line says it).

  --layout pp    torch.distributed.pipelining: one stage per rank (world = stages, 4 for the tests),
                 Schedule1F1B over 4 micro-batches, the default group as the pipeline group
  --layout mix   dp=2 x tp=2 x pp=2 on 8 ranks, rank = pp*4 + dp*2 + tp (Megatron's order: tp fastest,
                 pp outermost). Each step: a tensor-parallel MLP (column then row shard; its output
                 all-reduced in the tp group), the activation sent to stage 1 (send / recv in the pp
                 group), stage 1's loss and gradient all-reduce in its tp group, the gradient sent
                 back to stage 0 (recv there), then the weight gradients all-reduced in the dp group

Faults (like scout_sys/demo/train.py's), after a step, on the faulty rank:
  stall   blocks on a lock (in Python, outside any collective) until released
  stop    sends itself SIGSTOP
  exit    exits with code 3; a forked helper keeps its sockets open so the peers keep waiting
--fault KIND --fault-rank R --fault-step N [--fault-when FILE]: one fault, from step N on once FILE exists
  (a stall then lasts until --max-seconds).
--control DIR: many faults in one job, one after another: a rank whose file DIR/rank<R> appears reads
  the fault from it after its step; ``stop`` and ``exit`` remove the file first; ``stall`` lasts while
  the file exists (remove it to release the rank).

Prints "PIPE step N" (rank 0), "PIPE fault KIND rank=R pid=P coords=..." (the faulty rank, before the
fault) and "PIPE resumed rank=R" (after a stall or a stop).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch import nn


def stall_on_lock(lock: threading.Lock, still: callable, deadline: float) -> None:
    """stall: blocked on a lock that nobody releases, as long as ``still()``."""
    while still() and time.time() < deadline:
        lock.acquire(timeout=0.2)


def exit_leaving_helper(deadline: float) -> None:
    if os.fork() == 0:
        while time.time() < deadline:
            time.sleep(0.5)
        os._exit(0)
    os._exit(3)


def pipeline(world: int, rank: int):
    """One stage per rank, Schedule1F1B; returns step(n)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    first, last = rank == 0, rank == world - 1
    part = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
    mb = torch.empty(2, 16)  # static shapes: no metadata exchange
    stage = PipelineStage(part, rank, world, torch.device("cpu"), input_args=mb, output_args=mb,
                          output_grads=None if last else mb, input_grads=None if first else mb)
    sched = Schedule1F1B(stage, 4, loss_fn=lambda out, y: (out - y).pow(2).mean())
    opt = torch.optim.SGD(part.parameters(), lr=1e-3)
    x, y = torch.randn(8, 16), torch.zeros(8, 16)

    def step(n: int) -> None:
        sched.step(*([x] if first else []), **({"target": y} if last else {}))
        opt.step()
        opt.zero_grad()

    return step, f"pp={rank}"


def mix(world: int, rank: int):
    """dp=2 x tp=2 x pp=2 with explicit collectives and point-to-point calls; returns step(n)."""
    if world != 8:
        raise SystemExit("--layout mix needs 8 ranks")
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
    pp, dp, tp = (mesh.get_local_rank(d) for d in ("pp", "dp", "tp"))
    tp_g, dp_g, pp_g = (mesh[d].get_group() for d in ("tp", "dp", "pp"))
    peer = dist.get_global_rank(pp_g, 1 - pp)  # the other stage, same dp and tp
    torch.manual_seed(pp)
    col = torch.randn(16, 16) * 0.1  # this rank's column shard (16 -> 32 split in two)
    row = torch.randn(16, 16) * 0.1  # this rank's row shard (32 -> 16 split in two)
    x = torch.randn(8, 16)

    def tp_mlp(inp: torch.Tensor) -> torch.Tensor:
        out = torch.relu(inp @ col) @ row
        dist.all_reduce(out, group=tp_g)  # the row-parallel layer's reduction
        return out

    def step(n: int) -> None:
        if pp == 0:
            act = tp_mlp(x)
            dist.send(act, dst=peer, group=pp_g)
            grad = torch.empty_like(act)
            dist.recv(grad, src=peer, group=pp_g)
            wgrad = (x.T @ grad)[:, :16]
        else:
            act = torch.empty(8, 16)
            dist.recv(act, src=peer, group=pp_g)
            out = tp_mlp(act)
            grad = 2 * out / out.numel()
            dist.all_reduce(grad, group=tp_g)  # the column-parallel layer's input gradient
            dist.send(grad, dst=peer, group=pp_g)
            wgrad = act.T @ grad
        dist.all_reduce(wgrad, group=dp_g)  # data-parallel gradient reduction
        col.sub_(1e-4 * wgrad)

    return step, f"pp={pp},dp={dp},tp={tp}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", choices=["pp", "mix"], required=True)
    ap.add_argument("--fault", choices=["none", "stall", "stop", "exit"], default="none")
    ap.add_argument("--fault-rank", type=int, default=1)
    ap.add_argument("--fault-step", type=int, default=3)
    ap.add_argument("--fault-when", metavar="FILE")
    ap.add_argument("--control", metavar="DIR")
    ap.add_argument("--step-sleep", type=float, default=0.05)
    ap.add_argument("--max-seconds", type=float, default=240)
    a = ap.parse_args()
    deadline = time.time() + a.max_seconds
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    step_fn, coords = (pipeline if a.layout == "pp" else mix)(world, rank)
    lock = threading.Lock()
    lock.acquire()
    mine = os.path.join(a.control, f"rank{rank}") if a.control else None

    def fault_now(step: int) -> str | None:
        if mine is not None and os.path.exists(mine):
            with open(mine) as f:
                return f.read().strip() or None
        if rank == a.fault_rank and a.fault != "none" and step >= a.fault_step:
            if a.fault_when is None or os.path.exists(a.fault_when):
                a.fault_rank = -1  # once
                return a.fault
        return None

    step = 0
    while time.time() < deadline:
        step_fn(step)
        time.sleep(a.step_sleep)
        if rank == 0:
            print(f"PIPE step {step}", flush=True)
        kind = fault_now(step)
        if kind is not None:
            print(f"PIPE fault {kind} rank={rank} pid={os.getpid()} coords={coords}", flush=True)
            if kind == "stall":
                stall_on_lock(lock, (lambda: os.path.exists(mine)) if mine and os.path.exists(mine)
                              else (lambda: True), deadline)
            else:
                if mine is not None and os.path.exists(mine):
                    os.unlink(mine)
                if kind == "exit":
                    exit_leaving_helper(deadline)
                os.kill(os.getpid(), signal.SIGSTOP)
            print(f"PIPE resumed rank={rank}", flush=True)
        step += 1
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
