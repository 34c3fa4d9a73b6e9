"""The job's NCCL process groups, learned from communicator creation (uprobes, ``comms.bpf.c``).

Every NCCL communicator is made by one of (all of them are probed, entry and return):

- ``ncclCommInitRank(comm*, nranks, ncclUniqueId id, rank)`` / ``ncclCommInitRankConfig(...,
  config*)`` / ``ncclCommInitRankScalable(comm*, nranks, rank, nId, ids*, config*)``: the members of
  one communicator pass the same 128-byte id (made by one of them with ``ncclGetUniqueId`` and
  shared through the c10d store), each its own rank below ``nranks``;
- ``ncclCommSplit(parent, color, key, newcomm*, config*)``: collective over the parent, every member
  calls it, in the same order; the members passing one color form one new communicator (``-1``,
  ``NCCL_SPLIT_NOCOLOR``: none), ordered by key.

So, per rank process (its global rank from its environ, as ``job.ranks`` has it): the creation calls
in order, and from the uretprobe the handle NCCL stored in ``*newcomm``. A communicator made from an
id is the set of ranks that passed that id; one made by a split is (the parent's group, the n-th split
of that parent, the color). A split's parent is found by its handle; the collective probe
(``CollectiveSample.group_ptr``) reports the same handles, so each NCCL collective maps to its group.

A group is reported when every member's creation was seen (``nranks`` members with ranks 0..n-1; a
split, when every member of its parent made it). When the job has ranks on other hosts, a group with
members not seen here is *partial*, as probes/pgroups.py reports it; on one host, a group missing a
member's creation is left out (its creation came before the probe attached) and said in ``health()``.

Attaching: uprobes sit on the library's inode and fire in every process that maps it, also later;
the probe can therefore be prepared (compiled and attached) before the ranks exist, from the
launcher's libraries (``prepare``), so that a watch started with the job sees the communicators made
in the job's first seconds. Attached after the ranks started, it says that their groups may be
unknown from this probe. Not probed: ``ncclCommInitAll`` (one process, many devices: no process
group across ranks), ``ncclCommShrink`` / ``ncclCommGrow`` (fault-tolerance resizing).
"""

from __future__ import annotations

import glob
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from scout_sys.errors import ProbeUnavailable
from scout_sys.model import Job, Observation, ProcessGroupSample
from scout_sys.probes import NO_NCCL
from scout_sys.probes.ebpf._common import (
    BccProbe,
    Clock,
    attach_mode_reason,
    common_reason,
    compile_program,
    detach_all,
    host_pid,
    load_bcc,
    mapped_libs,
    render,
)
from scout_sys.probes.ebpf._elf import function_symbols
from scout_sys.probes.ebpf.commgroups import (
    INIT_KINDS,
    CommCalls,
    Communicators,
    Creation,
    learn,
    progress,
)

FUNCS = {  # symbol -> BPF function (entry); every one also gets comm_return (kinds: commgroups.K_*)
    "ncclCommInitRank": "comm_init_rank",
    "ncclCommInitRankConfig": "comm_init_rank_config",
    "ncclCommInitRankScalable": "comm_init_rank_scalable",
    "ncclCommSplit": "comm_split",
}
DESTROY = ("ncclCommDestroy", "ncclCommAbort")
COLL_OPS = {1: "allreduce", 2: "broadcast", 3: "reduce", 4: "allgather", 5: "reduce_scatter", 6: "alltoall",
            7: "gather", 8: "scatter"}  # as in comms.bpf.c
COLL_FUNCS = {"ncclAllReduce": "coll_allreduce", "ncclBroadcast": "coll_broadcast", "ncclReduce": "coll_reduce",
              "ncclAllGather": "coll_allgather", "ncclReduceScatter": "coll_reduce_scatter",
              "ncclAlltoAll": "coll_alltoall", "ncclGather": "coll_gather", "ncclScatter": "coll_scatter"}
LIB_PATTERNS = (r"^libnccl\.so", r"^libtorch_cuda\.so")
LIB_GLOBS = ("nvidia/nccl/lib/libnccl.so*", "torch/lib/libtorch_cuda.so")  # in a site-packages folder
SOURCE = "ebpf-comms"


# --------------------------------------------------------------------------- finding the library


def site_dirs(pid: int) -> list[str]:
    """site-packages / dist-packages folders of the Python libraries ``pid`` has mapped (through
    /proc/PID/root), e.g. the launcher's torch: where its ranks will load NCCL from."""
    out: list[str] = []
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        path = line.split(None, 5)[-1]
        for marker in ("/site-packages/", "/dist-packages/"):
            i = path.find(marker)
            if path.startswith("/") and i >= 0:
                d = f"/proc/{pid}/root{path[:i + len(marker) - 1]}"
                if d not in out:
                    out.append(d)
    return out


def candidate_libs(pids: Iterable[int]) -> list[tuple[str, str]]:
    """(path as the process sees it, path to open) of every NCCL library the processes have mapped,
    or that their Python installation holds (nvidia-nccl-cu12's wheel, torch's libtorch_cuda.so)."""
    seen: set[tuple[int, int]] = set()
    out: list[tuple[str, str]] = []

    def add(path: str, open_path: str) -> None:
        try:
            st = os.stat(open_path)
        except OSError:
            return
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            out.append((path, open_path))

    for pid in pids:
        for m in mapped_libs(pid, LIB_PATTERNS):
            add(m.path, m.open_path)
        for d in site_dirs(pid):
            for pattern in LIB_GLOBS:
                for p in sorted(glob.glob(os.path.join(d, pattern))):
                    add(p.split("/root", 1)[1] if p.startswith("/proc/") else p, p)
    return out


# --------------------------------------------------------------------------- the probe


def _start_ns(pid: int) -> int | None:
    """When a process started, in CLOCK_MONOTONIC ns (boot-relative, as bpf_ktime_get_ns)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19]) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class CommProbe(BccProbe):
    """Probe contract (see scout_sys.probes): one :class:`ProcessGroupSample` (``source="ebpf-comms"``)
    per sample, once a communicator is known. ``prepare(pids)`` compiles and attaches ahead of the
    job (the watch calls it when it starts); ``start(job)`` then only binds the ranks."""

    name = SOURCE
    program = "comms.bpf.c"

    def __init__(self, max_pids: int = 1024, max_creations: int = 4096, max_threads: int = 4096) -> None:
        super().__init__()
        self.max_pids, self.max_creations, self.max_threads = max_pids, max_creations, max_threads
        self.attached: list[str] = []
        self.compile_s: float | None = None
        self.attached_ns: int | None = None  # CLOCK_MONOTONIC when the uprobes were in place
        self._prep = threading.Lock()
        self._job: Job | None = None
        self._late: list[int] = []  # ranks that may have made communicators before the probe attached
        self._mapped_at_attach: dict[int, bool] = {}
        self._notes: tuple[str, ...] = ()

    def check(self) -> str | None:
        return common_reason() or attach_mode_reason()

    def prepare(self, pids: Iterable[int]) -> None:
        """Compile and attach to the NCCL libraries of ``pids`` (mapped, or in their Python
        installation). Once; safe from several threads (the second caller waits for the first)."""
        with self._prep:
            if self._bpf is not None:
                return
            reason = self.check()
            if reason:
                raise ProbeUnavailable(reason)
            pids = list(pids)
            libs = candidate_libs(pids)
            found = []
            for path, open_path in libs:
                try:
                    syms = function_symbols(open_path, "|".join([*FUNCS, *DESTROY, *COLL_FUNCS]).encode())
                except Exception as e:  # noqa: BLE001 - an unreadable library is said, others go on
                    self.notes.append(f"{path}: symbols unreadable ({e})")
                    continue
                if any(s in syms for s in FUNCS):
                    found.append((path, open_path, syms))
            if not found:
                raise ProbeUnavailable(f"{NO_NCCL} (libnccl.so*) mapped by or installed beside the job's "
                                       "Python: no communicator to learn")
            bcc, _ = load_bcc()
            assert bcc is not None
            self.text = render(self.program, {"MAX_PIDS": self.max_pids, "MAX_CREATIONS": self.max_creations,
                                              "MAX_THREADS": self.max_threads})
            t0 = time.monotonic()
            try:
                self._bpf = compile_program(bcc, self.text)
                self.compile_s = time.monotonic() - t0
                for path, open_path, syms in found:
                    for sym, fn in FUNCS.items():
                        if sym in syms:
                            self._attach(path, open_path, syms[sym], sym, fn)
                            self._attach(path, open_path, syms[sym], sym, "comm_return", ret=True)
                    for sym in DESTROY:
                        if sym in syms:
                            self._attach(path, open_path, syms[sym], sym, "comm_destroy")
                    for sym, fn in COLL_FUNCS.items():
                        if sym in syms:
                            self._attach(path, open_path, syms[sym], sym, fn)
            except Exception as e:
                self.close()
                raise ProbeUnavailable(f"loading the {self.program} program failed: {e}") from e
            self.attached_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            # which of those processes could have made a communicator before now (a rank found here
            # without NCCL mapped yet makes its communicators under the probe's eyes)
            self._mapped_at_attach = {pid: self._maps_nccl(pid) for pid in pids}

    def _attach(self, path: str, open_path: str, addr: int, sym: str, fn: str, ret: bool = False) -> None:
        attach = self._bpf.attach_uretprobe if ret else self._bpf.attach_uprobe
        attach(name=open_path.encode(), addr=addr, fn_name=fn.encode())
        self.attached.append(f"{path}: {sym}{' (return)' if ret else ''}")

    def start(self, job: Job) -> None:
        pids = [r.pid for r in job.ranks] + ([job.launcher_pid] if job.launcher_pid else [])
        self.prepare(pids)
        self._job = job
        self._ranks = {host_pid(r.pid): r.rank for r in job.ranks}
        self._late = sorted(r.rank for r in job.ranks if self._maybe_late(r.pid))

    def _maybe_late(self, pid: int) -> bool:
        """Had NCCL loaded before the uprobes were in place (so may have made communicators unseen)."""
        if pid in self._mapped_at_attach:
            return self._mapped_at_attach[pid]
        started = _start_ns(pid)  # not looked at when attaching: started before, and NCCL loaded now
        return started is not None and self.attached_ns is not None and started < self.attached_ns \
            and self._maps_nccl(pid)

    def _maps_nccl(self, pid: int) -> bool:
        return bool(mapped_libs(pid, LIB_PATTERNS))

    def records(self) -> tuple[dict[int, list[Creation]], dict[tuple[int, int], int]]:
        """(global rank -> its creation calls, (rank, handle) -> destroyed ns) for the job's ranks."""
        recs: dict[int, list[Creation]] = {}
        gone: dict[tuple[int, int], int] = {}
        if self._bpf is None:
            return recs, gone
        for k, v in sorted(self.entries("creations"), key=lambda kv: kv[0].ns):
            rank = self._ranks.get(k.tgid)
            if rank is None:
                continue
            recs.setdefault(rank, []).append(Creation(
                seq=len(recs.get(rank, ())), kind=int(v.kind), nranks=int(v.nranks), comm_rank=int(v.rank),
                id=bytes(v.id) if v.kind in INIT_KINDS else b"", parent=int(v.parent), color=int(v.color),
                comm=int(v.comm), ret=int(v.ret) if v.returned else None, ns=int(v.ns)))
        for k, v in self.entries("gone"):
            rank = self._ranks.get(k.tgid)
            if rank is not None:
                gone[(rank, int(k.comm))] = int(v.value)
        return recs, gone

    def calls(self) -> list[CommCalls]:
        if self._bpf is None:
            return []
        return [CommCalls(rank, int(k.comm), int(v.calls), int(v.last_ns), COLL_OPS.get(v.last_op, ""))
                for k, v in self.entries("known") if (rank := self._ranks.get(k.tgid)) is not None]

    def learned(self) -> Communicators:
        recs, gone = self.records()
        job = self._job
        elsewhere = bool(job and (job.world_size or 0) > len(job.ranks) + len(job.missing))
        return learn(recs, gone, others_elsewhere=elsewhere)

    def sample(self, now: float | None = None) -> list[Observation]:
        if self._bpf is None or self._job is None:
            return []
        comms = self.learned()
        notes = list(comms.notes)
        if self._late:
            notes.append(f"attached after ranks {', '.join(map(str, self._late))} had started with NCCL loaded: "
                         "communicators they made before then are unknown from this probe")
        self._notes = tuple(notes)
        if not comms.groups:
            return []
        seqs, latest = progress(comms, self.calls(), Clock().unix)
        return [ProcessGroupSample(time=time.time() if now is None else now, groups=comms.groups,
                                   partial=comms.partial, notes=tuple(notes), source=SOURCE,
                                   handles=comms.handles, seqs=seqs, latest=latest)]

    def health(self) -> Any:
        from scout_sys.probes import Health

        return Health(notes=self._notes + tuple(self.notes), lost=self.lost())

    def unbind(self) -> None:
        """Forget the job (its Monitor closed) and stay attached for the next one."""
        self._job = None
        self._ranks = {}

    def close(self) -> None:
        """Detach. The kernel unregisters each uprobe after an RCU grace period (~0.1 s each, 2 s for
        the 18 here one after another): their perf-event fds are closed in parallel, then bcc's
        cleanup does the rest."""
        bpf, self._bpf = self._bpf, None  # taken once: a second close (another thread) finds None
        if bpf is not None:
            try:
                _close_uprobes_in_parallel(bpf)
            except Exception:  # noqa: BLE001, S110 - bcc's own cleanup below detaches what is left
                pass
            detach_all(bpf)
        self.unbind()



def _close_uprobes_in_parallel(bpf: Any) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from bcc.libbcc import lib  # type: ignore[import-not-found]

    events = list(bpf.uprobe_fds.items())
    if not events:
        return
    with ThreadPoolExecutor(max_workers=len(events)) as pool:  # ctypes calls release the GIL
        list(pool.map(lambda ev: lib.bpf_close_perf_event_fd(ev[1]), events))
    for name, _fd in events:
        # bpf_close_perf_event_fd closes the fd even when it reports an error (its DISABLE ioctl
        # failed): forgotten either way, so nothing closes that fd number again
        lib.bpf_detach_uprobe(name)
        bpf._del_uprobe_fd(name)
