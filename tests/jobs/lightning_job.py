"""A tiny PyTorch Lightning trainer on CPU / Gloo, started as its users start it: ``python
lightning_job.py`` with ``Trainer(strategy="ddp", devices=N)``, no torchrun. Lightning's own launcher
then makes this process local rank 0 and starts a copy of it per other local rank (no RANK in their
environment). Several nodes: ``--num-nodes M`` with NODE_RANK, MASTER_ADDR and MASTER_PORT set, one
such command per node.

Fault, on global rank ``--fault-rank`` at ``--fault-step``: ``hang`` blocks in a data-loading function
(outside any collective); its peers wait in DDP's gradient all-reduce.

Prints the demo's marks (scout_sys/demo/launch.py reads them): "SCOUT-DEMO step step=N" (rank 0,
every 10 steps) and "SCOUT-DEMO fault kind=hang rank=R step=S pid=P" (the bad rank).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import warnings


def load_next_batch_stuck(deadline: float) -> None:
    """hang: a data loader that never returns."""
    threading.Event().wait(max(0.0, deadline - time.time()))
    os._exit(0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--num-nodes", type=int, default=1)
    ap.add_argument("--fault", choices=["none", "hang"], default="none")
    ap.add_argument("--fault-rank", type=int, default=1)
    ap.add_argument("--fault-step", type=int, default=30)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--step-sleep", type=float, default=0.05)
    ap.add_argument("--max-seconds", type=float, default=240)
    a = ap.parse_args()
    deadline = time.time() + a.max_seconds
    warnings.simplefilter("ignore")
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, Dataset

    torch.set_num_threads(1)

    class Random(Dataset):
        def __len__(self) -> int:
            return 1_000_000

        def __getitem__(self, i: int):
            g = torch.Generator().manual_seed(i)
            return torch.randn(32, generator=g), int(torch.randint(0, 4, (1,), generator=g))

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

        def training_step(self, batch, i):
            if a.fault == "hang" and self.global_rank == a.fault_rank and i == a.fault_step:
                print(f"SCOUT-DEMO fault kind=hang rank={self.global_rank} step={i} pid={os.getpid()}", flush=True)
                load_next_batch_stuck(deadline)
            if time.time() > deadline:
                self.trainer.should_stop = True
            time.sleep(a.step_sleep)
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            if self.global_rank == 0 and i % 10 == 0:
                print(f"SCOUT-DEMO step step={i} loss={loss.item():.4f}", flush=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = L.Trainer(accelerator="cpu", devices=a.devices, num_nodes=a.num_nodes, strategy="ddp",
                        max_steps=a.steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Tiny(), DataLoader(Random(), batch_size=8, num_workers=0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
