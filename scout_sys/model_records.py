"""The probes' records beyond /proc and stacks: eBPF (collectives, sched, lifecycle), NVML, replay.

Part of the vocabulary (re-exported by :mod:`scout_sys.model`, which also puts them in its
``Observation`` union); a module of its own only to keep model.py readable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scout_sys.text import signal_name

# ---- eBPF records (probes/ebpf: collectives, sched, lifecycle). Times are unix seconds.


@dataclass(frozen=True)
class Fingerprint:
    """One collective call as the uprobe on its entry point saw it."""

    seq: int  # 1-based position in its group's collective sequence on this rank
    op: str  # "allreduce", "broadcast", ... (backend-neutral names)
    time: float  # entry
    count: int | None = None  # elements of the (first) tensor / NCCL count; None: not readable
    dtype: str | None = None  # "float32", ...
    redop: str | None = None  # "sum", "max", ...
    root: int | None = None  # broadcast / reduce / gather / scatter root
    ntensors: int | None = None

    def key(self) -> tuple[str, int | None, str | None, str | None]:
        """What must be equal on every rank at the same sequence position."""
        return (self.op, self.count, self.dtype, self.redop)

    def describe(self) -> str:
        parts = [self.op]
        if self.count is not None:
            parts.append(f"{self.count} x {self.dtype or '?'}")
        if self.redop:
            parts.append(self.redop)
        return f"#{self.seq} " + " ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in {
            "seq": self.seq, "op": self.op, "time": round(self.time, 6), "count": self.count,
            "dtype": self.dtype, "redop": self.redop, "root": self.root,
        }.items() if v is not None}


@dataclass(frozen=True)
class CollectiveSample:
    """Where one rank is in one process group's collective sequence (probe: ebpf collectives).

    ``group``: ``"gloo:0"`` is the first Gloo group this rank was seen calling, and so on (each rank
    numbers its groups in the order the probe first saw them called; ``consensus.desync.align`` makes
    the numbers agree across ranks before they are compared). ``members`` says which group it is.
    """

    time: float
    rank: int
    pid: int
    backend: str  # "gloo" | "nccl"
    group: str
    seq: int  # collectives entered on this group
    completed: int | None  # collectives finished by this process (gloo: all groups); None: unknown
    inside: bool  # entered a collective that has not finished
    last_enter: float | None
    last_exit: float | None
    last: Fingerprint | None
    recent: tuple[Fingerprint, ...] = ()  # oldest first, ends with ``last``
    p2p: int = 0  # send / recv calls (not part of ``seq``)
    waiting_peer: int | None = None  # gloo: group rank the worker last waited on (recv)
    bytes_sent: int | None = None  # gloo: bytes sent by the last finished collective
    group_ptr: int = 0  # process-group / communicator address in the rank (for people)
    # the group's global ranks, sorted (gloo: read from the group itself); () when not known. The same
    # ``group`` name on two ranks may be two groups (each tensor-parallel group of a dp x tp job): these
    # tell them apart (consensus/collgroups.py)
    members: tuple[int, ...] = ()
    source: str = "ebpf"


@dataclass(frozen=True)
class ThreadSched:
    tid: int
    comm: str
    on_cpu_ns: int
    off_cpu_ns: int
    switches: int
    involuntary: int  # switched out while runnable (preempted)
    state: str  # state at the last switch-out: "R" "S" "D" ... ; "running" when on CPU now
    last_switch: float | None  # unix time of the last switch in or out


@dataclass(frozen=True)
class SchedSample:
    """On/off-CPU time per thread of one rank, aggregated in the kernel (probe: ebpf sched)."""

    time: float
    rank: int
    pid: int
    threads: tuple[ThreadSched, ...]
    lost: int = 0  # thread updates dropped because the bounded map was full
    source: str = "ebpf"

    def main(self) -> ThreadSched | None:
        for t in self.threads:
            if t.tid == self.pid:
                return t
        return None


@dataclass(frozen=True)
class SignalRecord:
    """A signal generated for a rank (probe: ebpf lifecycle, signal:signal_generate)."""

    time: float  # last time this (target, signal, sender) was seen
    rank: int
    pid: int  # target process
    signal: int
    signal_name: str
    sender_pid: int
    sender_comm: str  # untrusted text
    code: int  # si_code: 0 SI_USER (kill), -6 SI_TKILL, 128 SI_KERNEL, ...
    result: int  # 0 delivered, 1 ignored, 2 already pending, 3 overflow, 4 lost
    count: int = 1
    first_time: float = 0.0
    source: str = "ebpf"


@dataclass(frozen=True)
class ExitRecord:
    """A rank process ended (probe: ebpf lifecycle, sched:sched_process_exit)."""

    time: float
    rank: int
    pid: int
    exit_code: int | None  # exit status when it exited; None when killed by a signal / unknown
    signal: int | None  # the signal that killed it
    core_dumped: bool = False
    comm: str = ""
    source: str = "ebpf"

    def describe(self) -> str:
        if self.signal:
            return f"killed by {signal_name(self.signal)}" + (" (core dumped)" if self.core_dumped else "")
        if self.exit_code is None:
            return "exited (status unknown)"
        return f"exited with code {self.exit_code}"


@dataclass(frozen=True)
class OomRecord:
    """The kernel OOM killer chose a rank (probe: ebpf lifecycle, oom:mark_victim)."""

    time: float
    rank: int
    pid: int
    total_vm_kb: int | None = None
    anon_rss_kb: int | None = None
    source: str = "ebpf"


# ---- NVML records (probes/nvml.py)


@dataclass(frozen=True)
class DeviceSample:
    """One read of a rank's GPU through NVML. ``None``: not readable on this device."""

    time: float
    rank: int
    pid: int
    index: int  # NVML (physical) device index
    util_percent: int | None = None
    mem_used: int | None = None  # bytes
    mem_total: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    slowdown: str | None = None  # "hw-slowdown,hw-thermal,..." when the GPU slowed itself down
    ecc_uncorrected: int | None = None  # volatile uncorrected ECC errors since the driver loaded
    source: str = "nvml"

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in {
            "index": self.index, "util_percent": self.util_percent, "mem_used": self.mem_used,
            "mem_total": self.mem_total, "temperature_c": self.temperature_c, "power_w": self.power_w,
            "slowdown": self.slowdown, "ecc_uncorrected": self.ecc_uncorrected}.items() if v is not None}


@dataclass(frozen=True)
class ProcessGroupSample:
    """The job's process groups as learned from outside (probe: process-groups, see
    scout_sys/probes/pgroups.py; or ebpf-comms, scout_sys/probes/ebpf/comms.py), and the group each
    waiting rank's last send went to."""

    time: float
    groups: tuple[tuple[int, ...], ...]  # global members of each group, sorted
    partial: tuple[int, ...] = ()  # indices of groups with members on other hosts
    waits_in: tuple[tuple[int, int], ...] = ()  # (rank, group index): the group it last sent to
    # (rank, group indices): its newest sends tie (one clock tick) between these groups
    waits_in_one_of: tuple[tuple[int, tuple[int, ...]], ...] = ()
    notes: tuple[str, ...] = ()
    rank: int = -1  # a job-wide record
    source: str = "procfs"  # "procfs" (Gloo's sockets) | "ebpf-comms" (NCCL communicator creation)
    # ebpf-comms: (rank, communicator handle, group index), so that the collective probe's NCCL calls
    # (CollectiveSample.group_ptr) map to their group
    handles: tuple[tuple[int, int, int], ...] = ()
    # ebpf-comms: (rank, group index, collectives it entered in the group since the group was made),
    # and (rank, group index, op, when: unix time) of its latest NCCL collective
    seqs: tuple[tuple[int, int, int], ...] = ()
    latest: tuple[tuple[int, int, str, float], ...] = ()


# ---- replay records (scout_sys/replay: one worker per device beside the job)


@dataclass(frozen=True)
class KernelResult:
    """One kernel on one device: the digest of its output bits, the wall time of its repetitions in
    the round, and whether they all gave the same bits."""

    digest: str
    seconds: float
    stable: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"digest": self.digest, "seconds": round(self.seconds, 6), "stable": self.stable}


@dataclass(frozen=True)
class DeviceRound:
    """One replay round on one device. ``device`` names it for people ("cpu/rank2", "cuda:3")."""

    device: str
    ranks: tuple[int, ...]
    peer_kind: str  # devices that must agree bit for bit share it (model and torch build)
    kernels: dict[str, KernelResult] = field(default_factory=dict, hash=False, compare=False)
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)  # torch, capability, threads

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"device": self.device, "ranks": list(self.ranks), "peer_kind": self.peer_kind,
                               "kernels": {k: v.to_json() for k, v in sorted(self.kernels.items())}}
        if self.error:
            out["error"] = self.error
        if self.info:
            out["context"] = dict(self.info)
        return out
