"""TorchTitan's own trainer (llama3 debugmodel, FSDP2) on CPU / Gloo, run through a thin launcher.

TorchTitan has no CPU path of its own: while ``torchtitan.tools.utils`` is imported its device type
is made "cpu"; FSDP2's reduce-scatter op is forced to SUM (Gloo has no PREMUL_SUM). No hub: a
byte-level tokenizer and a local corpus for the ``c4_test`` loader are written to --assets.

Fault: once the file --go exists, --fault-rank blocks forever in ``read_next_shard`` (its input
pipeline, called from ``batch_generator``), outside any collective; its peers then wait in
TorchTitan's own ``dist_sum`` of the step's token count. Prints "TITAN fault hang rank=R pid=P" (the
bad rank) and "TITAN step N rank=R" after every step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

import torch
import torch._utils


def write_assets(d: str) -> None:
    """A byte-level BPE tokenizer (tokenizer.json) and a small json corpus (the c4_test layout)."""
    if os.path.exists(os.path.join(d, "tokenizer", "tokenizer.json")):
        return
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    os.makedirs(os.path.join(d, "tokenizer"), exist_ok=True)
    os.makedirs(os.path.join(d, "c4_test"), exist_ok=True)
    words = "the rank waits in a collective while its peer blocks in the loader of data".split()
    texts = [" ".join(words[(i * 7 + j) % len(words)] for j in range(200)) for i in range(200)]
    with open(os.path.join(d, "c4_test", "c4.json"), "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=512, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(os.path.join(d, "tokenizer", "tokenizer.json"))
    with open(os.path.join(d, "tokenizer", "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}, f)


def cpu_torchtitan() -> None:
    orig = torch._utils._get_available_device_type
    torch._utils._get_available_device_type = lambda: "cpu"
    try:
        import torchtitan.tools.utils  # noqa: F401  (device_type, device_module fixed at import)
    finally:
        torch._utils._get_available_device_type = orig
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as fc

    divide = fc._get_gradient_divide_factors

    def gloo_sum(rs_group, ar_group, reduce_dtype, device_type="", factor=None, force_sum=False):
        # Gloo lacks PREMUL_SUM/AVG: FSDP2 divides before/after a SUM instead
        return divide(rs_group, ar_group, reduce_dtype, device_type, factor, True)

    fc._get_gradient_divide_factors = gloo_sum

    from torchtitan.components import metrics

    class CpuMemoryMonitor(metrics.DeviceMemoryMonitor):  # torch.cpu has no memory statistics
        def __init__(self, device: str = "cpu"):
            self.device = torch.device("cpu")
            self.device_name = "cpu"
            self.device_index = 0
            self.device_capacity = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            self.device_capacity_gib = self._to_gib(self.device_capacity)

        def get_peak_stats(self):
            return metrics.DeviceMemStats(0.0, 0.0, 0.0, 0.0, 0, 0)

        def reset_peak_stats(self):
            pass

    metrics.DeviceMemoryMonitor = CpuMemoryMonitor

    from torchtitan.distributed import utils as dist_utils

    set_timeouts = dist_utils.set_pg_timeouts

    def cpu_set_pg_timeouts(*args, **kw):  # its barrier passes device_ids=["cpu"]: Gloo takes none
        barrier = torch.distributed.barrier
        torch.distributed.barrier = lambda *a, device_ids=None, **k: barrier(*a, **k)
        try:
            return set_timeouts(*args, **kw)
        finally:
            torch.distributed.barrier = barrier

    dist_utils.set_pg_timeouts = cpu_set_pg_timeouts


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--assets", required=True)
    ap.add_argument("--go", default="")
    ap.add_argument("--fault-rank", type=int, default=1)
    a, rest = ap.parse_known_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        write_assets(a.assets)
    else:
        import time
        while not os.path.exists(os.path.join(a.assets, "tokenizer", "tokenizer_config.json")):
            time.sleep(0.1)
    # ConfigManager.parse_args takes sys.argv[1:] as a default bound at import: set it first
    sys.argv = [sys.argv[0], "--model.name", "llama3", "--model.flavor", "debugmodel",
                "--model.hf_assets_path", os.path.join(a.assets, "tokenizer"),
                "--training.dataset", "c4_test", "--training.dataset_path", os.path.join(a.assets, "c4_test"),
                "--training.local_batch_size", "1", "--training.seq_len", "64", "--training.steps", "100000",
                "--comm.train_timeout_seconds", "600", "--comm.init_timeout_seconds", "600",
                "--metrics.log_freq", "1", "--parallelism.data_parallel_shard_degree", "-1", *rest]
    cpu_torchtitan()
    from torchtitan import train

    def read_next_shard():  # the fault: this rank's input pipeline never returns
        print(f"TITAN fault hang rank={rank} pid={os.getpid()}", flush=True)
        threading.Event().wait()

    class Trainer(train.Trainer):
        def batch_generator(self, data_iterable):
            for batch in super().batch_generator(data_iterable):
                if rank == a.fault_rank and a.go and os.path.exists(a.go):
                    read_next_shard()
                yield batch

        def train_step(self, *args, **kw):
            out = super().train_step(*args, **kw)
            print(f"TITAN step {self.step} rank={rank}", flush=True)
            return out

    train.main(Trainer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
