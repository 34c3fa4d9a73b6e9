"""A tiny trainer in four parallel layouts, on CPU / Gloo, for the peer-group tests.

  --layout ddp    DistributedDataParallel, every rank a replica (dp = world)
  --layout fsdp   FSDP2 (torch.distributed.fsdp.fully_shard), dp = world
  --layout pp     a 2-stage pipeline (torch.distributed.pipelining, ScheduleGPipe) on a DeviceMesh
                  ("dp", "pp") (row-major: rank = dp * 2 + pp), gradients all-reduced over dp
  --layout tp     a 2-way tensor-parallel MLP (DTensor ColwiseParallel / RowwiseParallel) on a
                  DeviceMesh ("dp", "tp") (rank = dp * 2 + tp), gradients all-reduced over dp

Faults, on --fault-rank at --fault-step:
  hang    waits forever for a batch that never comes (outside any collective)
  desync  calls broadcast where its data-parallel peers all-reduce
  tpdesync  (tp) calls broadcast in its tensor-parallel group where its partner runs the forward
  tpgather  (tp) calls all_gather in its tensor-parallel group where its partner enters the forward's
            tensor-parallel all-reduce (the other tensor-parallel group passed it)
--fault-when FILE holds the fault back until FILE exists (e.g. until a watch has attached its probes).
--slow-rank R --slow-work N: rank R does N extra matrix products per step before its forward (a compute
straggler: it is late in every process group it belongs to, and its peers wait for it there).

Prints "LAYOUT step N" (rank 0) and "LAYOUT fault KIND rank=R pid=P coords=..." (the bad rank).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch import nn


def wait_for_batch_that_never_comes(deadline: float) -> None:
    threading.Event().wait(max(0.0, deadline - time.time()))
    os._exit(0)


def extra_work(n: int) -> float:
    """The slow rank's extra compute of a step, in a frame of its own."""
    a = torch.randn(96, 96) / 10
    for _ in range(n):
        a = torch.tanh(a @ a)
    return float(a.mean())


def sync_grads(params, group, rank: int, a) -> None:
    """All-reduce the local gradients over the data-parallel group (the desync fault: broadcast)."""
    flat = torch.cat([(p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).reshape(-1)
                      for p in params if p.grad is not None])
    if a.fault == "desync" and a.faulty:
        dist.broadcast(flat, src=dist.get_global_rank(group, 0), group=group)
    else:
        dist.all_reduce(flat, group=group)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", choices=["ddp", "fsdp", "pp", "tp"], required=True)
    ap.add_argument("--fault", choices=["none", "hang", "desync", "tpdesync", "tpgather"], default="none")
    ap.add_argument("--fault-rank", type=int, default=2)
    ap.add_argument("--fault-step", type=int, default=3)
    ap.add_argument("--fault-when", metavar="FILE",
                    help="the fault comes at the first step from --fault-step on at which FILE exists")
    ap.add_argument("--step-sleep", type=float, default=0.05)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-work", type=int, default=0, help="the slow rank's extra matrix products per step")
    ap.add_argument("--max-seconds", type=float, default=240)
    a = ap.parse_args()
    deadline = time.time() + a.max_seconds
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    a.faulty = rank == a.fault_rank and a.fault != "none"
    armed = a.fault_when is None
    coords = f"dp={rank}"
    x = torch.randn(8, 16)

    if a.layout in ("ddp", "fsdp"):
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
        if a.layout == "ddp":
            from torch.nn.parallel import DistributedDataParallel
            model = DistributedDataParallel(model)
        else:
            from torch.distributed.fsdp import fully_shard
            for layer in (model[0], model[2]):
                fully_shard(layer)
            fully_shard(model)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step_fn(step: int) -> None:
            if a.faulty and a.fault == "desync" and step == a.fault_step:
                report(a, rank, coords)
                dist.broadcast(torch.zeros(4), src=0)
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()

    elif a.layout == "pp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "pp"))
        pp = mesh.get_local_rank("pp")
        coords = f"dp={mesh.get_local_rank('dp')},pp={pp}"
        part = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
        mb = torch.empty(4, 16)  # static shapes: no metadata exchange (it needs numpy)
        stage = PipelineStage(part, pp, 2, torch.device("cpu"), input_args=mb, output_args=mb,
                              output_grads=mb if pp == 0 else None, input_grads=mb if pp == 1 else None,
                              group=mesh["pp"].get_group())
        sched = ScheduleGPipe(stage, 2, loss_fn=lambda out, y: (out - y).pow(2).mean())
        dp_group = mesh["dp"].get_group()
        opt = torch.optim.SGD(part.parameters(), lr=1e-3)

        def step_fn(step: int) -> None:
            if pp == 0:
                sched.step(x)
            else:
                sched.step(target=torch.zeros(8, 16))
            sync_grads(list(part.parameters()), dp_group, rank, a)
            opt.step()
            opt.zero_grad()

    else:  # tp
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        coords = f"dp={mesh.get_local_rank('dp')},tp={mesh.get_local_rank('tp')}"
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        dp_group = mesh["dp"].get_group()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        tp_group = mesh["tp"].get_group()

        def step_fn(step: int) -> None:
            if a.faulty and a.fault == "tpdesync" and step == a.fault_step:
                dist.broadcast(torch.zeros(4), src=dist.get_global_rank(tp_group, 0), group=tp_group)
            if a.faulty and a.fault == "tpgather" and step == a.fault_step:
                dist.all_gather([torch.zeros(4) for _ in range(2)], torch.zeros(4), group=tp_group)
            loss = model(x).pow(2).mean()
            loss.backward()
            sync_grads(list(model.parameters()), dp_group, rank, a)
            opt.step()
            opt.zero_grad()

    step = 0
    while time.time() < deadline:
        if a.faulty and not armed and step >= a.fault_step:
            armed = os.path.exists(a.fault_when)
            a.fault_step = step if armed else step + 1
        if a.faulty and step == a.fault_step and armed:
            if a.fault == "hang":
                report(a, rank, coords)
                wait_for_batch_that_never_comes(deadline)
            elif a.layout in ("pp", "tp"):
                report(a, rank, coords)
        if rank == a.slow_rank:
            extra_work(a.slow_work)
        step_fn(step)
        time.sleep(a.step_sleep)
        if rank == 0:
            print(f"LAYOUT step {step}", flush=True)
        step += 1
    dist.destroy_process_group()
    return 0


def report(a, rank: int, coords: str) -> None:
    print(f"LAYOUT fault {a.fault} rank={rank} pid={os.getpid()} coords={coords}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
