"""A tiny DeepSpeed ZeRO trainer on CPU / Gloo, started unmodified under torchrun.

``DS_ACCELERATOR=cpu`` (set here before deepspeed is imported), ``deepspeed.init_distributed("gloo")``,
ZeRO stage ``--zero`` (1, 2 or 3) with DeepSpeed's own engine: ``engine.backward`` / ``engine.step``
reduce (and for stage 3 gather) through ``deepspeed.comm``.

Fault, on --fault-rank once --fault-when PATH exists: ``hang`` blocks forever in a data-loading
function (outside any collective); its peers wait in DeepSpeed's gradient reduction.

Prints "DSJOB step N" (rank 0) and "DSJOB fault hang rank=R pid=P" (the bad rank).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import warnings

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def fetch_batch_from_remote_storage(deadline: float) -> None:
    """hang: a data loader that never returns."""
    threading.Event().wait(max(0.0, deadline - time.time()))
    os._exit(0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--zero", type=int, default=2, choices=[1, 2, 3])
    ap.add_argument("--fault", choices=["none", "hang"], default="none")
    ap.add_argument("--fault-rank", type=int, default=1)
    ap.add_argument("--fault-when", default=None)
    ap.add_argument("--step-sleep", type=float, default=0.05)
    ap.add_argument("--max-seconds", type=float, default=240)
    a = ap.parse_args()
    deadline = time.time() + a.max_seconds
    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    import deepspeed
    import deepspeed.ops

    # DeepSpeed's CPU accelerator JIT-compiles its shared-memory all-reduce (deepspeed_shm_comm, an
    # inference fast path) on first use: ~50 s of the 2-core test machine's time in every fresh venv,
    # and its compatibility probe runs compilers too. Training goes through deepspeed.comm over Gloo
    # either way, which is what the tests read; no op is probed or built.
    deepspeed.ops.__compatible_ops__ = {}
    deepspeed.init_distributed("gloo")
    rank = int(os.environ["RANK"])
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": a.zero},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    x, y = torch.randn(4, 32), torch.randn(4, 4)
    step = 0
    while time.time() < deadline:
        if (rank == a.fault_rank and a.fault == "hang" and a.fault_when and os.path.exists(a.fault_when)):
            print(f"DSJOB fault hang rank={rank} pid={os.getpid()}", flush=True)
            fetch_batch_from_remote_storage(deadline)
        loss = (engine(x) - y).square().mean()
        engine.backward(loss)
        engine.step()
        if rank == 0 and step % 10 == 0:
            print(f"DSJOB step {step}", flush=True)
        step += 1
        time.sleep(a.step_sleep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
