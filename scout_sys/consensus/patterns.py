"""Where collectives show up in Python stacks: a table of frame patterns, kept as data.

A rank whose main thread sits in one of these frames is *waiting in a collective* (a witness).
Add a framework by adding rows, not code paths. Each row: (path suffix, function names, kind), where
kind is ``op`` (the function is the collective; its name is the op) or ``wrapper`` (a framework
frame that issues collectives; the op is the innermost ``op`` frame when present, else the
wrapper's name).
"""

from __future__ import annotations

from dataclasses import dataclass

from scout_sys.model import Frame

_C10D_OPS = frozenset(
    """
    all_reduce all_reduce_coalesced reduce broadcast all_gather all_gather_into_tensor
    all_gather_single all_gather_coalesced _all_gather_base all_gather_object gather gather_object
    scatter scatter_object_list reduce_scatter reduce_scatter_tensor reduce_scatter_single
    _reduce_scatter_base all_to_all all_to_all_single barrier monitored_barrier send recv
    send_object_list recv_object_list broadcast_object_list batch_isend_irecv _store_based_barrier
    """.split()
)


@dataclass(frozen=True)
class Pattern:
    path: str  # suffix of the frame's file path, "/" separated
    functions: frozenset[str]  # empty: any function in that file
    kind: str  # "op" | "wrapper"
    label: str = ""  # op name to report when it is not the function's name


PATTERNS: tuple[Pattern, ...] = (
    Pattern("torch/distributed/distributed_c10d.py", _C10D_OPS, "op"),
    Pattern("torch/distributed/_functional_collectives.py", frozenset({"wait_tensor", "_wait_tensor"}), "op"),
    Pattern("torch/distributed/_functional_collectives_impl.py", frozenset(), "op"),
    Pattern("torch/distributed/c10d_logger.py", frozenset(), "wrapper"),
    Pattern("deepspeed/comm/comm.py", frozenset(), "op"),
    Pattern("deepspeed/comm/torch.py", frozenset(), "wrapper"),
    Pattern("megatron/core/tensor_parallel/mappings.py", frozenset(), "wrapper"),
    Pattern("megatron/core/pipeline_parallel/p2p_communication.py", frozenset(), "wrapper"),
    Pattern("torch/distributed/pipelining/schedules.py", frozenset({"_wait_batch_p2p", "_batch_p2p"}), "wrapper"),
    Pattern("torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", frozenset(), "wrapper"),
    # DDP (and FSDP) all-reduce gradients from autograd hooks: the main thread waits for them at the
    # end of backward, off CPU, inside the autograd engine.
    Pattern("torch/autograd/graph.py", frozenset({"_engine_run_backward"}), "wrapper",
            "backward (gradient all-reduce)"),
    Pattern("torch/nn/parallel/distributed.py", frozenset({"_sync_buffers", "_sync_params_and_buffers",
                                                          "_distributed_broadcast_coalesced"}), "wrapper"),
)

# Frames that belong to the libraries above, skipped when looking for the caller's call site.
_LIBRARY_PARTS = ("/torch/", "/deepspeed/", "/megatron/", "/torchtitan/", "/contextlib.py", "/functools.py")


def _match(frame: Frame) -> Pattern | None:
    path = frame.file.replace("\\", "/")
    for p in PATTERNS:
        if path.endswith(p.path) and (not p.functions or frame.function in p.functions):
            return p
    return None


@dataclass(frozen=True)
class CollectiveWait:
    op: str  # e.g. "all_reduce"
    site: str  # the caller's "file:line" (innermost frame outside the libraries)
    depth: int  # index of the collective frame in the stack (innermost = 0)
    direct: bool = True  # a collective call itself, not only a framework frame that issues them

    def label(self) -> str:
        return f"{self.op} at {self.site}"


def collective_of(frames: tuple[Frame, ...]) -> CollectiveWait | None:
    """The collective a stack (innermost first) is in, or None."""
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
    op = pattern.label or frames[at].function.lstrip("_")
    return CollectiveWait(op=op, site=site, depth=at, direct=op_at is not None)


def short_path(path: str) -> str:
    """A path as a person wants to read it: from the package down (like py-spy's short names)."""
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path
