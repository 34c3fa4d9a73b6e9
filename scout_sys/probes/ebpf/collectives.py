"""Collective sequence and fingerprints of every rank, from uprobes on Gloo and NCCL entry points.

What it attaches (only to libraries the job's processes actually mapped, found in /proc/PID/maps and
opened through /proc/PID/root so containers work):

- ``libtorch_cpu.so``: ``c10d::ProcessGroupGloo::{allreduce, broadcast, reduce, allgather, gather,
  scatter, reduce_scatter, alltoall, barrier, send, recv, ...}`` (entry only: a uretprobe on a
  function that throws would kill the rank), ``AsyncWork::execute`` / ``finishWorkGloo[Error]``
  (work started / finished on Gloo's worker threads) and ``gloo::transport::tcp::UnboundBuffer::
  {send, recv}`` (peer and bytes per worker thread);
- ``libnccl.so*`` (or ``libtorch_cuda.so`` when NCCL is linked in): ``ncclAllReduce, ncclBroadcast,
  ncclReduce, ncclAllGather, ncclReduceScatter, ncclAlltoAll, ncclGather, ncclScatter, ncclSend,
  ncclRecv`` with count, datatype, reduction op, root/peer and communicator read from the argument
  registers, plus a uretprobe for the return code; ``ncclGroupStart/End`` for nesting.

The Gloo sequence number is the process group's own tag counter (read from ``this`` at the offset
``nextTag()`` uses, found by decoding its first instruction), so it is the same on every rank even
when the probe attached mid-run. When that decoding fails, the kernel counts calls from attach.
A Gloo group's global ranks are read once from the rank's memory at the group's address
(glooranks.py), so that the same name on two ranks can be told apart from the same group.

Symbols are read from the ELF symbol tables with bcc's resolver; torch is never imported.
"""

from __future__ import annotations

import math
import os
import struct
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from scout_sys.errors import ProbeUnavailable
from scout_sys.model import CollectiveSample, Fingerprint, Job, Observation
from scout_sys.probes.ebpf import glooranks
from scout_sys.probes.ebpf._common import (
    BccProbe,
    Clock,
    attach_mode_reason,
    common_reason,
    host_pid,
    mapped_libs,
    render,
)
from scout_sys.probes.ebpf._elf import function_symbols, read_code

LIB_GLOO, LIB_NCCL = 1, 2
BACKENDS = {LIB_GLOO: "gloo", LIB_NCCL: "nccl"}

# op ids, as in collectives.bpf.c
OPS = {
    1: "allreduce", 2: "allreduce_coalesced", 3: "broadcast", 4: "reduce", 5: "allgather",
    6: "allgather_base", 7: "allgather_coalesced", 8: "allgather_into_tensor_coalesced", 9: "gather",
    10: "scatter", 11: "reduce_scatter", 12: "reduce_scatter_base", 13: "reduce_scatter_tensor_coalesced",
    14: "alltoall_base", 15: "alltoall", 16: "barrier", 17: "monitored_barrier", 18: "send", 19: "recv",
    20: "recv_anysource",
}

# c10d::ProcessGroupGloo::<name> -> BPF function. Matched on the mangled nested name so that argument
# types may change between torch versions; the register layout per op is in collectives.bpf.c.
GLOO_METHODS = {
    "allreduce": "gloo_allreduce",
    "allreduce_coalesced": "gloo_allreduce_coalesced",
    "broadcast": "gloo_broadcast",
    "reduce": "gloo_reduce",
    "allgather": "gloo_allgather",
    "_allgather_base": "gloo_allgather_base",
    "allgather_coalesced": "gloo_allgather_coalesced",
    "allgather_into_tensor_coalesced": "gloo_allgather_into_tensor_coalesced",
    "gather": "gloo_gather",
    "scatter": "gloo_scatter",
    "reduce_scatter": "gloo_reduce_scatter",
    "_reduce_scatter_base": "gloo_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced": "gloo_reduce_scatter_tensor_coalesced",
    "alltoall_base": "gloo_alltoall_base",
    "alltoall": "gloo_alltoall",
    "barrier": "gloo_barrier",
    "monitoredBarrier": "gloo_monitored_barrier",
    "send": "gloo_send",
    "recv": "gloo_recv",
    "recvAnysource": "gloo_recv_anysource",
}
GLOO_WORK = {
    "_ZN4c10d16ProcessGroupGloo9AsyncWork7executeE": "gloo_work_start",
    "_ZN4c10d16ProcessGroupGloo9AsyncWork14finishWorkGlooEv": "gloo_work_done",
    "_ZN4c10d16ProcessGroupGloo9AsyncWork19finishWorkGlooErrorE": "gloo_work_error",
    "_ZN4gloo9transport3tcp13UnboundBuffer4sendEimmm": "gloo_tcp_send",
    "_ZN4gloo9transport3tcp13UnboundBuffer4recvEimmm": "gloo_tcp_recv",
}
NEXT_TAG = "_ZN4c10d16ProcessGroupGloo7nextTagEv"
NCCL_FUNCS = {
    "ncclAllReduce": "nccl_allreduce",
    "ncclBroadcast": "nccl_broadcast",
    "ncclReduce": "nccl_reduce",
    "ncclAllGather": "nccl_allgather",
    "ncclReduceScatter": "nccl_reduce_scatter",
    "ncclAlltoAll": "nccl_alltoall",
    "ncclGather": "nccl_gather",
    "ncclScatter": "nccl_scatter",
    "ncclSend": "nccl_send",
    "ncclRecv": "nccl_recv",
}
NCCL_GROUP = {"ncclGroupStart": "nccl_group_start", "ncclGroupEnd": "nccl_group_end"}

SCALAR_TYPES = {  # c10::ScalarType
    0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32",
    7: "float64", 8: "complex32", 9: "complex64", 10: "complex128", 11: "bool", 15: "bfloat16",
    23: "float8_e5m2", 24: "float8_e4m3fn",
}
NCCL_TYPES = {
    0: "int8", 1: "uint8", 2: "int32", 3: "uint32", 4: "int64", 5: "uint64", 6: "float16",
    7: "float32", 8: "float64", 9: "bfloat16", 10: "float8_e4m3fn", 11: "float8_e5m2",
}
C10D_REDOPS = {0: "sum", 1: "avg", 2: "prod", 3: "min", 4: "max", 5: "band", 6: "bor", 7: "bxor",
               8: "premul_sum"}
NCCL_REDOPS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}


@dataclass(frozen=True)
class TensorLayout:
    """Where c10::TensorImpl keeps dim, inline sizes, numel and dtype (torch 2.x, x86-64).

    The kernel copies ``length`` bytes from ``offset``; user space accepts a count only when the
    product of the sizes equals numel, so a different layout yields "unknown", never a wrong size.
    """

    offset: int = 56  # SizesAndStrides::size_
    length: int = 112
    sizes: int = 8  # relative: 5 inline sizes, then 5 strides
    inline: int = 5
    numel: int = 96
    dtype: int = 104  # caffe2::TypeMeta index == ScalarType for the built-in types

    def parse(self, raw: bytes) -> tuple[int | None, str | None]:
        if len(raw) < self.dtype + 2:
            return None, None
        dim, = struct.unpack_from("<q", raw, 0)
        numel, = struct.unpack_from("<q", raw, self.numel)
        dt, = struct.unpack_from("<H", raw, self.dtype)
        if dt not in SCALAR_TYPES or numel < 0:
            return None, None
        if 0 <= dim <= self.inline:
            sizes = struct.unpack_from(f"<{dim}q", raw, self.sizes)
            if any(s < 0 for s in sizes) or math.prod(sizes) != numel:
                return None, None
        elif not 0 < dim <= 64:
            return None, None
        return numel, SCALAR_TYPES[dt]


LAYOUT = TensorLayout()
REDOP_OFF = 16  # ReduceOp: intrusive_ptr_target (vptr, combined_refcount_), then RedOpType op_
REDUCE_ROOT_OFF = 32  # ReduceOptions: ReduceOp (32 bytes), then int64 rootRank


def tag_offset(code: bytes) -> int | None:
    """Offset of ProcessGroupGloo::collectiveCounter_ from the first instruction of nextTag().

    Expected: ``mov eax, [rdi+disp]`` (8b 87 disp32 / 8b 47 disp8), then ``lea edx, [rax+1]``.
    """
    if code[:2] == b"\x8b\x87" and len(code) >= 6:
        off, = struct.unpack_from("<i", code, 2)
        rest = code[6:]
    elif code[:2] == b"\x8b\x47" and len(code) >= 3:
        off, = struct.unpack_from("<b", code, 2)
        rest = code[3:]
    else:
        return None
    return off if rest[:3] == b"\x8d\x50\x01" and 0 <= off < 4096 else None


@dataclass
class _Lib:
    kind: int  # LIB_GLOO | LIB_NCCL
    path: str
    open_path: str
    symbols: dict[str, int]  # mangled name -> address


def _gloo_symbols(path: str) -> dict[str, int]:
    return function_symbols(
        path, rb"_ZNK?4(?:c10d16ProcessGroupGloo|c10d7BackendC[12]Eii|gloo9transport3tcp13UnboundBuffer)[^\x00]*")


def _nccl_symbols(path: str) -> dict[str, int]:
    return function_symbols(path, ("|".join(list(NCCL_FUNCS) + list(NCCL_GROUP))).encode())


class CollectiveProbe(BccProbe):
    """Probe contract (see scout_sys.probes). One ``CollectiveSample`` per rank and group per sample."""

    name = "ebpf-collectives"
    program = "collectives.bpf.c"

    def __init__(self, max_pids: int = 256, max_groups: int = 1024, max_threads: int = 8192,
                 history: int = 16, transport: bool = True) -> None:
        """``transport=False`` leaves out the uprobes on Gloo's per-message tcp send/recv (the peer a
        rank waits on, bytes sent): they fire several times per collective and cost a CPU-bound job
        several percent (benchmarks/ebpf_overhead.py); the collective entry points alone do not."""
        super().__init__()
        self.transport = transport
        if history & (history - 1):
            raise ValueError("history must be a power of two")
        self.max_pids, self.max_groups, self.max_threads, self.history = max_pids, max_groups, max_threads, history
        self._libs: list[_Lib] = []
        self.attached: list[str] = []  # "path: symbol" per uprobe, for people and tests
        self.tag_off: int | None = None
        self.gloo_off: glooranks.GlooOffsets | None = None  # where a Gloo group keeps its members
        self._members: dict[tuple[int, int, int], tuple[int, ...]] = {}  # (tgid, group, first_ns) -> ranks
        self._pids: dict[int, int] = {}  # host tgid -> pid in our /proc
        self._world = 0

    # -- contract

    def check(self) -> str | None:
        return common_reason() or attach_mode_reason()

    def _render(self, job: Job) -> str:
        self._libs = self._find_libs(job)
        if not self._libs:
            raise ProbeUnavailable("no rank has libtorch_cpu.so (Gloo) or libnccl mapped: nothing to probe")
        for lib in self._libs:
            if lib.kind == LIB_GLOO and self.tag_off is None and NEXT_TAG in lib.symbols:
                self.tag_off = tag_offset(read_code(lib.open_path, lib.symbols[NEXT_TAG], 16))
        if self.tag_off is None and any(lib.kind == LIB_GLOO for lib in self._libs):
            self.notes.append("Gloo tag counter not found: sequence numbers count from attach")
        self._find_gloo_offsets()
        self._pids = {host_pid(r.pid): r.pid for r in job.ranks}
        self._world = job.world_size
        return render(self.program, {
            "MAX_PIDS": self.max_pids, "MAX_GROUPS": self.max_groups, "MAX_THREADS": self.max_threads,
            "HIST": self.history, "TI_OFF": LAYOUT.offset, "TI_LEN": LAYOUT.length,
            "REDOP_OFF": REDOP_OFF, "REDUCE_ROOT_OFF": REDUCE_ROOT_OFF,
            "TAG_OFF": -1 if self.tag_off is None else self.tag_off,
        })

    def sample(self, now: float | None = None) -> list[Observation]:
        if self._bpf is None:
            return []
        clock = Clock()
        now = time.time() if now is None else now
        groups: dict[tuple[int, int], list[tuple[int, Any]]] = defaultdict(list)
        for k, v in self.entries("groups"):
            groups[(k.tgid, k.lib)].append((k.group, v))
        hist: dict[tuple[int, int, int], list[Fingerprint]] = defaultdict(list)
        for k, v in self.entries("hist"):
            hist[(k.g.tgid, k.g.lib, k.g.group)].append(self._fingerprint(k.g.lib, v, clock))
        works = {k.value: v for k, v in self.entries("works")}
        waiting: dict[int, int] = {}
        for _tid, t in self.entries("workers"):
            if t.busy and t.recv_peer >= 0:
                waiting[t.tgid] = t.recv_peer
        out: list[Observation] = []
        for (tgid, lib), entries in sorted(groups.items()):
            rank = self._ranks.get(tgid)
            if rank is None:
                continue
            w = works.get(tgid)
            # Gloo: a collective is in flight when a worker runs one, or one was entered after the
            # last completion (enqueued, not yet picked up).
            gloo_busy = bool(w is not None and w.started > w.done)
            entries.sort(key=lambda e: e[1].first_ns)
            for index, (ptr, g) in enumerate(entries):
                recent = sorted(hist.get((tgid, lib, ptr), []), key=lambda f: f.seq)
                last = recent[-1] if recent else None
                if lib == LIB_GLOO:
                    entered_after = g.calls > 0 and g.enter_ns > (w.done_ns if w is not None else 0)
                    inside = gloo_busy or entered_after
                    completed: int | None = int(w.done) if w is not None else 0
                else:
                    inside = bool(g.inside)
                    completed = None
                members = self._gloo_members(tgid, rank, ptr, g.first_ns) if lib == LIB_GLOO else ()
                out.append(CollectiveSample(
                    time=now, rank=rank, pid=tgid, backend=BACKENDS[lib], group=f"{BACKENDS[lib]}:{index}",
                    seq=last.seq if last else 0,
                    completed=completed, inside=bool(inside),
                    last_enter=clock.unix(g.enter_ns),
                    last_exit=clock.unix(w.done_ns if (lib == LIB_GLOO and w) else g.exit_ns),
                    last=last, recent=tuple(recent), p2p=int(g.p2p),
                    waiting_peer=waiting.get(tgid) if lib == LIB_GLOO else None,
                    bytes_sent=int(w.last_sent) if (lib == LIB_GLOO and w and w.done) else None,
                    group_ptr=int(ptr), members=members,
                ))
        return out

    # -- details

    def _find_gloo_offsets(self) -> None:
        for lib in self._libs:
            ctor = next((lib.symbols[s] for s in glooranks.BACKEND_CTORS if s in lib.symbols), None)
            if lib.kind != LIB_GLOO or glooranks.GROUP_RANKS not in lib.symbols or ctor is None:
                continue
            self.gloo_off = glooranks.offsets(read_code(lib.open_path, lib.symbols[glooranks.GROUP_RANKS], 32),
                                              read_code(lib.open_path, ctor, 64))
            if self.gloo_off is not None:
                return
        if any(lib.kind == LIB_GLOO for lib in self._libs):
            self.notes.append("Gloo groups' members not found in this torch build: a group is known by the "
                              "order of its first use on each rank")

    def _gloo_members(self, tgid: int, rank: int, ptr: int, first_ns: int) -> tuple[int, ...]:
        """The global ranks of a rank's Gloo group, read once (glooranks.py); () when not known."""
        key = (tgid, int(ptr), int(first_ns))
        if key not in self._members:
            off, pid = self.gloo_off, self._pids.get(tgid)
            self._members[key] = (() if off is None or pid is None else
                                  glooranks.members(glooranks.proc_reader(pid), int(ptr), off, rank, self._world))
        return self._members[key]

    def nccl_returns(self) -> dict[tuple[int, int], int]:
        """(tgid, comm) -> last NCCL return code (ncclResult_t)."""
        if self._bpf is None:
            return {}
        return {(k.tgid, k.group): int(v.ret) for k, v in self.entries("groups") if k.lib == LIB_NCCL}

    def _find_libs(self, job: Job) -> list[_Lib]:
        libs: dict[tuple[int, int], _Lib] = {}
        for r in job.ranks:
            for m in mapped_libs(r.pid, [r"^libtorch_cpu\.so", r"^libnccl\.so", r"^libtorch_cuda\.so"]):
                if m.dev_ino in libs:
                    continue
                base = os.path.basename(m.path)
                try:
                    if base.startswith("libtorch_cpu"):
                        syms, kind = _gloo_symbols(m.open_path), LIB_GLOO
                    else:
                        syms, kind = _nccl_symbols(m.open_path), LIB_NCCL
                except Exception as e:
                    self.notes.append(f"{m.path}: symbols unreadable ({e})")
                    continue
                if syms:
                    libs[m.dev_ino] = _Lib(kind, m.path, m.open_path, syms)
        return list(libs.values())

    def _uprobe(self, lib: _Lib, sym: str, fn: str, ret: bool = False) -> None:
        addr = lib.symbols[sym]
        if ret:
            self._bpf.attach_uretprobe(name=lib.open_path.encode(), addr=addr, fn_name=fn.encode())
        else:
            self._bpf.attach_uprobe(name=lib.open_path.encode(), addr=addr, fn_name=fn.encode())
        self.attached.append(f"{lib.path}: {sym}{' (return)' if ret else ''}")

    def _attach_programs(self) -> None:
        for lib in self._libs:
            if lib.kind == LIB_GLOO:
                for method, fn in GLOO_METHODS.items():
                    prefix = f"_ZN4c10d16ProcessGroupGloo{len(method)}{method}E"
                    for sym in lib.symbols:
                        if sym.startswith(prefix):
                            self._uprobe(lib, sym, fn)
                for prefix, fn in GLOO_WORK.items():
                    if not self.transport and "UnboundBuffer" in prefix:
                        continue
                    for sym in lib.symbols:
                        if sym.startswith(prefix):
                            self._uprobe(lib, sym, fn)
            else:
                for sym, fn in NCCL_FUNCS.items():
                    if sym in lib.symbols:
                        self._uprobe(lib, sym, fn)
                        self._uprobe(lib, sym, "nccl_return", ret=True)
                for sym, fn in NCCL_GROUP.items():
                    if sym in lib.symbols:
                        self._uprobe(lib, sym, fn)
        if not self.attached:
            raise ProbeUnavailable("no collective entry point found in the mapped libraries")

    def _fingerprint(self, lib: int, v: Any, clock: Clock) -> Fingerprint:
        op = OPS.get(v.op, f"op{v.op}")
        when = clock.unix(v.ns) or 0.0
        root = int(v.root) if v.root >= 0 else None
        if lib == LIB_GLOO:
            count, dtype = (None, None)
            if v.valid:
                count, dtype = LAYOUT.parse(bytes(v.ti))
            redop = C10D_REDOPS.get(v.redop) if v.redop >= 0 else None
            return Fingerprint(seq=int(v.seq), op=op, time=when, count=count, dtype=dtype, redop=redop,
                               root=root, ntensors=int(v.ntensors) or None)
        return Fingerprint(
            seq=int(v.seq), op=op, time=when, count=int(v.count) if v.count != 2**64 - 1 else None,
            dtype=NCCL_TYPES.get(v.dtype, f"nccl_type_{v.dtype}"),
            redop=NCCL_REDOPS.get(v.redop, f"nccl_op_{v.redop}") if v.redop >= 0 else None,
            root=root, ntensors=1)

