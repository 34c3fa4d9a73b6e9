"""A tiny Megatron-Core trainer on CPU / Gloo, for the wait-for graph tests (no layout on its command line).

dp=2 x tp=2 (``parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)``, Megatron's
rank order tp-cp-ep-dp-pp: tensor-parallel partners are adjacent ranks). The model is Megatron's own
``ColumnParallelLinear`` -> ``RowParallelLinear`` (``use_cpu_initialization=True``); the gradients are
all-reduced over ``parallel_state.get_data_parallel_group()`` after each step.

Faults, on --fault-rank at --fault-step:
  lock    blocks on a lock after its step (outside any collective): its dp partner waits in the
          data-parallel all-reduce, its tp partner in RowParallelLinear's all-reduce
  stop    sends itself SIGSTOP after its step
  slow    computes --slow-seconds more than its peers every step from then on (a straggler)

--fault-when PATH: the fault (lock or stop) comes at the first step from --fault-step on once PATH
exists (one job serves a healthy test, then its fault).

Prints "MEGATRON step N" (rank 0) and "MEGATRON fault KIND rank=R pid=P" (the bad rank).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import warnings

import torch
import torch.distributed as dist


def extra_compute(seconds: float) -> None:
    w, end = torch.randn(64, 64), time.time() + seconds
    while time.time() < end:
        w = torch.tanh(w @ w)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fault", choices=["none", "lock", "stop", "slow"], default="none")
    ap.add_argument("--slow-seconds", type=float, default=0.1)
    ap.add_argument("--fault-rank", type=int, default=2)
    ap.add_argument("--fault-step", type=int, default=3)
    ap.add_argument("--step-sleep", type=float, default=0.05)
    ap.add_argument("--max-seconds", type=float, default=240)
    ap.add_argument("--fault-when", default=None)
    a = ap.parse_args()
    deadline = time.time() + a.max_seconds
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group(backend="gloo")
    from megatron.core import parallel_state
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    rank = dist.get_rank()
    cfg = ModelParallelConfig(tensor_model_parallel_size=2, use_cpu_initialization=True,
                              params_dtype=torch.float32)
    init = torch.nn.init.xavier_normal_
    col = ColumnParallelLinear(16, 32, config=cfg, init_method=init, bias=True, gather_output=False)
    row = RowParallelLinear(32, 16, config=cfg, init_method=init, bias=True, input_is_parallel=True,
                            skip_bias_add=False)
    params = list(col.parameters()) + list(row.parameters())
    opt = torch.optim.SGD(params, lr=1e-3)
    dp_group = parallel_state.get_data_parallel_group()
    x = torch.randn(8, 16)
    lock = threading.Lock()
    lock.acquire()
    step = 0
    while time.time() < deadline:
        h, _ = col(x)
        y, _ = row(torch.relu(h))
        y.pow(2).mean().backward()
        for p in params:
            dist.all_reduce(p.grad, group=dp_group)
        opt.step()
        opt.zero_grad()
        if rank == a.fault_rank and step >= a.fault_step and a.fault == "slow":
            if step == a.fault_step:
                print(f"MEGATRON fault slow rank={rank} pid={os.getpid()}", flush=True)
            extra_compute(a.slow_seconds)
        elif rank == a.fault_rank and a.fault != "none" and (
                step >= a.fault_step and os.path.exists(a.fault_when) if a.fault_when else step == a.fault_step):
            print(f"MEGATRON fault {a.fault} rank={rank} pid={os.getpid()}", flush=True)
            if a.fault == "lock":
                lock.acquire(timeout=max(0.0, deadline - time.time()))
                os._exit(0)
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(a.step_sleep)
        if rank == 0:
            print(f"MEGATRON step {step}", flush=True)
        step += 1
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
