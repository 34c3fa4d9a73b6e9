"""A DDP job (Gloo) whose step is real compute, for the straggler tests: every rank runs ``--work``
matrix products per step inside its model's forward, then sleeps out the rest of ``--step-time``;
``--slow-rank R --slow-factor F`` gives rank R F times the work (a compute straggler). A rank held to a
CPU sliver by its cgroup's quota takes longer for the same work (a throttled straggler). The peers wait
for the slow rank in DDP's backward all-reduce each step."""

import argparse
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class Heavy(nn.Module):
    def __init__(self, work: int) -> None:
        super().__init__()
        self.work = work
        self.lin = nn.Linear(64, 8)
        self.a = torch.randn(96, 96) / 10

    def forward(self, x):
        a = self.a
        for _ in range(self.work):  # the step's compute, in a frame of its own
            a = torch.tanh(a @ a)
        return self.lin(x) + a.mean()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--work", type=int, default=60)
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-factor", type=float, default=4.0)
    p.add_argument("--max-seconds", type=float, default=120)
    a = p.parse_args()
    deadline = time.time() + a.max_seconds
    torch.set_num_threads(1)
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    work = int(a.work * (a.slow_factor if rank == a.slow_rank else 1.0))
    model = DistributedDataParallel(Heavy(work))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    step = 0
    while time.time() < deadline:
        t0 = time.time()
        loss = model(torch.randn(8, 64)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(max(0.0, a.step_time - (time.time() - t0)))
        if rank == 0 and step % 10 == 0:
            print(f"STRAGGLER-JOB step {step} {time.time() - t0:.3f}", flush=True)
        step += 1
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
