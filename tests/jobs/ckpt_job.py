"""A DDP job (Gloo, CPU) that writes checkpoints as real training does, for certify's tests (under
torchrun): once the file given by --go exists (all ranks agree on the step), every rank saves its
replica of the model (``REPLICAS/step_N/rank{r}.pt``, as DDP ranks each saving the model) and all
ranks save one ``torch.distributed.checkpoint`` folder together (``DCP/step_N``); rank 0 prints
``SCOUT-DEMO saved step=N``. It trains on (``SCOUT-DEMO step N`` lines) until it is killed."""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--go", required=True)
    ap.add_argument("--replicas", required=True)
    ap.add_argument("--dcp", required=True)
    ap.add_argument("--step-time", type=float, default=0.05)
    a = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial weights everywhere; DDP keeps the replicas equal
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    saved = False
    step = 0
    while True:
        x = torch.randn(16, 64, generator=g)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        step += 1
        if rank == 0:
            print(f"SCOUT-DEMO step {step}", flush=True)
        go = torch.tensor([1 if (rank == 0 and not saved and os.path.exists(a.go)) else 0])
        dist.broadcast(go, 0)  # every rank saves at the same step: dcp.save is collective
        if go.item():
            sd = model.module.state_dict()
            folder = os.path.join(a.replicas, f"step_{step}")
            os.makedirs(folder, exist_ok=True)
            torch.save(sd, os.path.join(folder, f"rank{rank}.pt"))
            dcp.save({"model": sd}, checkpoint_id=os.path.join(a.dcp, f"step_{step}"))
            dist.barrier()
            saved = True
            if rank == 0:
                print(f"SCOUT-DEMO saved step={step}", flush=True)
        time.sleep(a.step_time)


if __name__ == "__main__":
    main()
