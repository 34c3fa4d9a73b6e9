"""Where collectives show up in Python stacks: a table of frame patterns, kept as data.

A rank whose main thread sits in one of these frames is *waiting in a collective* (a witness).
Add a framework by adding rows, not code paths. Each row: (path suffix, function names, kind), where
kind is ``op`` (the function is the collective; its name is the op) or ``wrapper`` (a framework
frame that issues collectives; the op is the innermost ``op`` frame when present, else the
wrapper's name).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from scout_sys.model import CollectiveWait, Frame
from scout_sys.text import short_path

_C10D_OPS = frozenset(
    """
    all_reduce all_reduce_coalesced reduce broadcast all_gather all_gather_into_tensor
    all_gather_single all_gather_coalesced _all_gather_base all_gather_object gather gather_object
    scatter scatter_object_list reduce_scatter reduce_scatter_tensor reduce_scatter_single
    _reduce_scatter_base all_to_all all_to_all_single barrier monitored_barrier send recv
    send_object_list recv_object_list broadcast_object_list batch_isend_irecv _store_based_barrier
    """.split()
)


_P2P_OPS = frozenset("send recv isend irecv send_object_list recv_object_list batch_isend_irecv".split())


@dataclass(frozen=True)
class Pattern:
    path: str  # suffix of the frame's file path, "/" separated
    functions: frozenset[str]  # empty: any function in that file (py-spy's "Class.method" matches "method")
    kind: str  # "op" | "wrapper"
    label: str = ""  # op name to report when it is not the function's name
    p2p: bool = False  # point-to-point (pipeline neighbours), not a collective of replicas


def _p(path: str, functions: str, kind: str, label: str = "", p2p: bool = False) -> Pattern:
    return Pattern(path, frozenset(functions.split()), kind, label, p2p)


_TD = "torch/distributed/"

# First match wins. Frame names were read from py-spy dumps of real CPU/Gloo jobs (tests/jobs/layouts.py,
# torch 2.13): see docs/layouts.md for the stacks.
PATTERNS: tuple[Pattern, ...] = (
    # torch.distributed: point-to-point first, then every collective.
    Pattern(_TD + "distributed_c10d.py", _P2P_OPS, "op", p2p=True),
    Pattern(_TD + "distributed_c10d.py", _C10D_OPS, "op"),
    # Functional collectives, DTensor redistribution and tensor parallel (wait_tensor on AsyncCollectiveTensor).
    _p(_TD + "_functional_collectives.py", "wait_tensor _wait_tensor", "op"),
    _p(_TD + "_functional_collectives_impl.py", "", "op"),
    _p(_TD + "tensor/_collective_utils.py", "mesh_broadcast mesh_scatter shard_dim_alltoall "
       "fill_empty_tensor_to_shards", "op"),
    _p(_TD + "tensor/_redistribute.py", "redistribute_local_tensor", "wrapper", "redistribute"),
    _p(_TD + "tensor/parallel/style.py", "", "wrapper", "tensor-parallel collective"),
    _p(_TD + "c10d_logger.py", "", "wrapper"),
    # torch.distributed.pipelining: the schedule waits for its neighbours' activations / gradients.
    _p(_TD + "pipelining/schedules.py", "_wait_batch_p2p _batch_p2p _sorted_batch_p2p", "wrapper",
       "pipeline p2p", p2p=True),
    _p(_TD + "pipelining/stage.py", "_recv_meta _send_meta get_fwd_recv_ops get_bwd_recv_ops", "wrapper",
       "pipeline p2p", p2p=True),
    # FSDP2 (fully_shard): all-gather before forward / backward, reduce-scatter after backward.
    _p(_TD + "fsdp/_fully_shard/_fsdp_collectives.py", "", "wrapper"),
    _p(_TD + "fsdp/_fully_shard/_fsdp_param_group.py", "unshard wait_for_unshard post_backward "
       "_wait_all_gather_streams", "wrapper", "fsdp unshard / reduce-scatter"),
    _p(_TD + "fsdp/_fully_shard/_fsdp_state.py", "_root_post_backward_final_callback", "wrapper",
       "fsdp reduce-scatter"),
    # DDP: gradients are all-reduced from autograd hooks; the main thread waits at the end of backward,
    # off CPU, inside the autograd engine.
    _p("torch/autograd/graph.py", "_engine_run_backward", "wrapper", "backward (gradient all-reduce)"),
    _p("torch/nn/parallel/distributed.py", "_sync_buffers _sync_params_and_buffers "
       "_distributed_broadcast_coalesced _sync_module_buffers", "wrapper"),
    # DeepSpeed: deepspeed.comm is the collective API; the pipeline engine's p2p; ZeRO's wrappers.
    _p("deepspeed/comm/comm.py", "send recv isend irecv", "op", p2p=True),
    _p("deepspeed/comm/comm.py", "", "op"),
    _p("deepspeed/comm/torch.py", "", "wrapper"),
    _p("deepspeed/runtime/pipe/p2p.py", "", "wrapper", "pipeline p2p", p2p=True),
    # (no row for runtime/comm/coalesced_collectives.py: it waits nowhere itself, every call goes
    # through deepspeed.comm, whose rows are inner to it)
    # Megatron-Core: tensor-parallel mappings, pipeline p2p, the DDP / distributed-optimizer buffers.
    _p("megatron/core/tensor_parallel/mappings.py", "", "wrapper"),
    _p("megatron/core/pipeline_parallel/p2p_communication.py", "", "wrapper", "pipeline p2p", p2p=True),
    _p("megatron/core/distributed/param_and_grad_buffer.py", "", "wrapper"),
    _p("megatron/core/distributed/finalize_model_grads.py", "", "wrapper"),
    _p("megatron/core/optimizer/distrib_optimizer.py", "", "wrapper"),
    # TorchTitan: its own collective helpers, which wait themselves on a GPU (dist_sum's ``.item()`` of a
    # functional all-reduce, set_pg_timeouts' synchronize; everything else goes through torch above; its
    # pipeline_parallel.py only builds torch.distributed.pipelining schedules, whose rows are inner to it).
    _p("torchtitan/distributed/utils.py", "", "wrapper"),
)

# Frames that belong to the libraries above, skipped when looking for the caller's call site.
_LIBRARY_PARTS = ("/torch/", "/deepspeed/", "/megatron/", "/torchtitan/", "/contextlib.py", "/functools.py")


def _match(frame: Frame) -> Pattern | None:
    path = frame.file.replace("\\", "/")
    for p in PATTERNS:
        if path.endswith(p.path) and (not p.functions or frame.function in p.functions
                                      or frame.function.rsplit(".", 1)[-1] in p.functions):
            return p
    return None


@lru_cache(maxsize=4096)
def collective_of(frames: tuple[Frame, ...]) -> CollectiveWait | None:
    """The collective a stack (innermost first) is in, or None. Cached by stack: the ranks of a job
    show few distinct stacks, sampled again and again (a pure function of frozen frames)."""
    op_at = wrap_at = None
    for i, f in enumerate(frames):
        p = _match(f)
        if p is None:
            continue
        if p.kind == "op" and op_at is None:
            op_at = i
        elif p.kind == "wrapper" and wrap_at is None:
            wrap_at = i
    at = op_at if op_at is not None else wrap_at
    if at is None:
        return None
    pattern = _match(frames[at])
    assert pattern is not None
    site = "?"
    for f in frames[at + 1:]:
        if not any(part in f.file for part in _LIBRARY_PARTS):
            site = f"{short_path(f.file)}:{f.line}"
            break
    op = pattern.label or frames[at].function.rsplit(".", 1)[-1].lstrip("_")
    p2p = any((m := _match(f)) is not None and m.p2p for f in frames[:at + 1]) or (
        wrap_at is not None and (w := _match(frames[wrap_at])) is not None and w.p2p)
    return CollectiveWait(op=op, site=site, depth=at, direct=op_at is not None, p2p=p2p)
