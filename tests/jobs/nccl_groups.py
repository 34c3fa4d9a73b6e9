"""A GPU-shaped 4-rank job whose tensor- and data-parallel groups exist only as NCCL communicators.

Run under torchrun. The real libnccl.so.2 of the nvidia-nccl-cu12 wheel is loaded with ctypes and its
creation entry points are called as ProcessGroupNCCL calls them: rank 0 makes the world's
``ncclUniqueId`` (ncclGetUniqueId, no GPU needed), rank 0 / 2 make their tensor-parallel pair's, all
shared through torch's c10d store; then ``ncclCommInitRank`` for the world (4), and for the tp pairs
``ncclCommInitRankConfig`` ({0, 1}: what ProcessGroupNCCL calls) and ``ncclCommInitRankScalable``
({2, 3}: one id), and ``ncclCommSplit`` of the world by color into the data-parallel pairs {0, 2},
{1, 3} and a group {0, 1, 2} (rank 3 passes NCCL_SPLIT_NOCOLOR).

There is no GPU here, so every call returns an error after the uprobes fired. Where NCCL would store
the new communicator's handle, each rank has stored beforehand the handle it then uses (a zeroed
mapping NCCL rejects as a communicator): the stand-in for the driver's boundary. Each step enqueues
an ``ncclAllReduce`` on the tp communicator, then waits for its tp partner in ``tp_sync``, then one on
the dp communicator and waits in ``dp_sync`` (the GPU shape: the collective returns at once and the
rank spins at a sync point, no collective frame; the partners meet through the store). The only Gloo
group is the world's (init_process_group), so the pairs are invisible to the Gloo-socket method.

``--fault hang --fault-rank R --fault-step N``: rank R blocks on a queue at step N, before its tp
all-reduce; with ``--fault-when PATH``, at its first step once PATH exists instead.
"""

import argparse
import ctypes
import mmap
import os
import queue
import sys
import time

import torch
import torch.distributed as dist

NOCOLOR = -1
COMM_BYTES = 16 << 20


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def handle() -> tuple[mmap.mmap, int]:
    m = mmap.mmap(-1, COMM_BYTES)  # zero pages, never touched: no memory used
    return m, ctypes.addressof(ctypes.c_char.from_buffer(m))


def shared_id(lib, store, key: str, maker: bool) -> UniqueId:
    uid = UniqueId()
    if maker:
        rc = lib.ncclGetUniqueId(ctypes.byref(uid))
        assert rc == 0, rc
        store.set(key, ctypes.string_at(ctypes.addressof(uid), 128))
    else:
        raw = store.get(key)
        ctypes.memmove(ctypes.byref(uid), raw, 128)
    return uid


def meet(store, key: str, n: int, deadline: float) -> None:
    """Spin until ``n`` ranks have arrived at ``key`` (a stream sync's busy poll: on a CPU, asking the
    store every 100 ms)."""
    store.add(key, 1)
    while store.add(key, 0) < n:
        if time.time() > deadline:
            os._exit(0)
        end = time.perf_counter() + 0.1
        while time.perf_counter() < end:
            pass


def tp_sync(store, pair: int, step: int, deadline: float) -> None:
    meet(store, f"tp{pair}/{step}", 2, deadline)


def dp_sync(store, pair: int, step: int, deadline: float) -> None:
    meet(store, f"dp{pair}/{step}", 2, deadline)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--lib", required=True)
    p.add_argument("--fault", default="none", choices=["none", "hang"])
    p.add_argument("--fault-rank", type=int, default=2)
    p.add_argument("--fault-step", type=int, default=10**9)
    p.add_argument("--fault-when", default=None)
    p.add_argument("--max-seconds", type=float, default=240)
    a = p.parse_args()
    deadline = time.time() + a.max_seconds
    torch.set_num_threads(1)
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 4, world
    store = dist.distributed_c10d._get_default_store()
    lib = ctypes.CDLL(a.lib)
    keep = []

    def new_handle() -> ctypes.c_void_p:
        m, addr = handle()
        keep.append(m)
        return ctypes.c_void_p(addr)

    world_id = shared_id(lib, store, "nccl/world", rank == 0)
    tp_id = shared_id(lib, store, f"nccl/tp{rank // 2}", rank % 2 == 0)
    world_comm, tp_comm, dp_comm, trio_comm = new_handle(), new_handle(), new_handle(), new_handle()
    rcs = [
        lib.ncclCommInitRank(ctypes.byref(ctypes.c_void_p(world_comm.value)), world, world_id, rank),
        lib.ncclCommInitRankConfig(ctypes.byref(ctypes.c_void_p(tp_comm.value)), 2, tp_id, rank % 2, None)
        if rank < 2 else
        lib.ncclCommInitRankScalable(ctypes.byref(ctypes.c_void_p(tp_comm.value)), 2, rank % 2, 1, ctypes.byref(tp_id),
                                     None),
        lib.ncclCommSplit(world_comm, rank % 2, rank, ctypes.byref(ctypes.c_void_p(dp_comm.value)), None),
        lib.ncclCommSplit(world_comm, NOCOLOR if rank == 3 else 5, -rank, ctypes.byref(ctypes.c_void_p(trio_comm.value)),
                          None),
    ]
    # one write, newline included: the ranks share the log (print writes the end apart when unbuffered)
    sys.stdout.write(f"NCCLJOB created rank={rank} world={world_comm.value} tp={tp_comm.value} dp={dp_comm.value} "
                     f"trio={trio_comm.value} rcs={','.join(map(str, rcs))}\n")
    sys.stdout.flush()
    buf = (ctypes.c_float * 64)()
    b = ctypes.c_void_p(ctypes.addressof(buf))
    step = 0
    while time.time() < deadline:
        due = os.path.exists(a.fault_when) if a.fault_when else step == a.fault_step
        if rank == a.fault_rank and a.fault == "hang" and due:
            print(f"NCCLJOB fault hang rank={rank} step={step}", flush=True)
            try:
                queue.Queue().get(timeout=max(0.1, deadline - time.time()))
            except queue.Empty:
                os._exit(0)
        x = torch.randn(32, 32)
        (x @ x).sum()
        time.sleep(0.03)
        lib.ncclAllReduce(b, b, ctypes.c_size_t(64), 7, 0, tp_comm, None)  # enqueue; the wait follows
        tp_sync(store, rank // 2, step, deadline)
        lib.ncclAllReduce(b, b, ctypes.c_size_t(64), 7, 0, dp_comm, None)
        dp_sync(store, rank % 2, step, deadline)
        if rank == 0 and step % 10 == 0:
            print(f"NCCLJOB step {step}", flush=True)
        step += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
