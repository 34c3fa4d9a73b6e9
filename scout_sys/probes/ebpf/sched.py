"""Scheduling and lifecycle of every rank, from kernel tracepoints (one BPF program, sched.bpf.c).

- ``sched:sched_switch``: per-thread on-CPU / off-CPU time, switches, involuntary switches and the
  state at switch-out, summed in the kernel for the job's threads only (``SchedSample``);
- ``sched:sched_process_exit`` (+ ``syscalls:sys_enter_exit_group``): when each rank ended and its
  exit status, read from ``task_struct.exit_code`` at the offset the kernel's BTF gives
  (``ExitRecord``);
- ``signal:signal_generate``: every signal generated for a rank, with its sender (pid and comm),
  si_code and result, counted per (target, signal, sender) (``SignalRecord``);
- ``oom:mark_victim``: the OOM killer chose a rank (``OomRecord``).

``sample()`` returns a ``SchedSample`` per live rank each time, and each exit / signal / OOM record
once (again when a signal's count grows).
"""

from __future__ import annotations

import time

from scout_sys.model import (
    ExitRecord,
    Job,
    Observation,
    OomRecord,
    SchedSample,
    SignalRecord,
    ThreadSched,
)
from scout_sys.probes.ebpf._btf import member_offset
from scout_sys.probes.ebpf._common import DEBUGFS_EVENTS, BccProbe, Clock, common_reason, load_bcc, render
from scout_sys.text import signal_name

REQUIRED = ("sched/sched_switch", "sched/sched_process_exit", "signal/signal_generate")
OPTIONAL = ("oom/mark_victim", "syscalls/sys_enter_exit_group")

_STATES = [(0x1, "S"), (0x2, "D"), (0x4, "T"), (0x8, "t"), (0x10, "X"), (0x20, "Z"), (0x40, "P"),
           (0x80, "I")]


def state_name(state: int) -> str:
    if state == 0 or state & 0x100:
        return "R"  # runnable: preempted
    for bit, letter in _STATES:
        if state & bit:
            return letter
    return f"0x{state:x}"


def _format_fields(event: str) -> set[str]:
    try:
        text = (DEBUGFS_EVENTS / event / "format").read_text()
    except OSError:
        return set()
    out = set()
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("field:"):
            decl = line[len("field:"):].split(";")[0]
            out.add(decl.split()[-1].split("[")[0])
    return out


class SchedProbe(BccProbe):
    """Probe contract (see scout_sys.probes)."""

    name = "ebpf-sched"
    program = "sched.bpf.c"

    def __init__(self, max_pids: int = 256, max_threads: int = 16384, max_signals: int = 1024,
                 switches: bool = True) -> None:
        """``switches=False`` leaves out the sched_switch program (per-thread on/off-CPU time): it
        runs on every context switch of the machine, the lifecycle programs only on rare events."""
        super().__init__()
        self.max_pids, self.max_threads, self.max_signals = max_pids, max_threads, max_signals
        self.switches = switches
        self._seen_exits: set[int] = set()
        self._seen_signals: dict[tuple[int, int, int], int] = {}
        self._seen_ooms: set[int] = set()

    def check(self) -> str | None:
        reason = common_reason()
        if reason:
            return reason
        bcc, _ = load_bcc()
        assert bcc is not None
        for tp in REQUIRED:
            cat, ev = tp.split("/")
            if not bcc.BPF.tracepoint_exists(cat, ev):
                return f"kernel has no tracepoint {cat}:{ev}"
        return None

    def _render(self, job: Job) -> str:
        bcc, _ = load_bcc()
        assert bcc is not None
        exit_off = member_offset("task_struct", "exit_code")
        if exit_off is None:
            self.notes.append("no BTF offset for task_struct.exit_code: exit status from exit_group only")
        exit_fields = _format_fields("sched/sched_process_exit")
        oom_fields = _format_fields("oom/mark_victim")
        has_oom = bcc.BPF.tracepoint_exists("oom", "mark_victim") and "pid" in oom_fields
        if not has_oom:
            self.notes.append("no oom:mark_victim tracepoint: OOM kills seen only as SIGKILL")
        has_exit_group = bcc.BPF.tracepoint_exists("syscalls", "sys_enter_exit_group")
        return render(self.program, {
            "MAX_PIDS": self.max_pids, "MAX_THREADS": self.max_threads, "MAX_SIGNALS": self.max_signals,
            "EXIT_CODE_OFF": -1 if exit_off is None else exit_off,
            "GROUP_DEAD": "args->group_dead" if "group_dead" in exit_fields else "tid == tgid",
            "HAS_OOM": int(has_oom), "HAS_EXIT_GROUP": int(has_exit_group), "HAS_SWITCH": int(self.switches),
            "OOM_TOTAL_VM": "args->total_vm" if "total_vm" in oom_fields else "0",
            "OOM_ANON_RSS": "args->anon_rss" if "anon_rss" in oom_fields else "0",
        })

    def sample(self, now: float | None = None) -> list[Observation]:
        if self._bpf is None:
            return []
        clock = Clock()
        now = time.time() if now is None else now
        now_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        out: list[Observation] = []

        per_pid: dict[int, list[ThreadSched]] = {}
        # filled by the sched_switch program only: without it the map stays empty, not worth a syscall a poll
        for k, t in self.entries("threads") if self.switches else []:
            on_cpu, off_cpu = int(t.on_ns), int(t.off_ns)
            running = bool(t.last_in)
            if running:
                on_cpu += max(0, now_ns - t.last_in)
            elif t.last_out:
                off_cpu += max(0, now_ns - t.last_out)
            per_pid.setdefault(int(t.tgid), []).append(ThreadSched(
                tid=int(k.value), comm=bytes(t.comm).split(b"\0", 1)[0].decode(errors="replace"),
                on_cpu_ns=on_cpu, off_cpu_ns=off_cpu, switches=int(t.switches), involuntary=int(t.invol),
                state="running" if running else state_name(int(t.state)),
                last_switch=clock.unix(max(t.last_in, t.last_out)),
            ))
        lost = self.lost()

        exits = {k.value: e for k, e in self.entries("exits")}
        for tgid, threads in sorted(per_pid.items()):
            rank = self._ranks.get(tgid)
            if rank is not None and tgid not in exits:
                out.append(SchedSample(time=now, rank=rank, pid=tgid, lost=lost,
                                       threads=tuple(sorted(threads, key=lambda t: t.tid))))

        for tgid, e in sorted(exits.items(), key=lambda kv: kv[1].ns):
            rank = self._ranks.get(tgid)
            if rank is None or tgid in self._seen_exits:
                continue
            self._seen_exits.add(tgid)
            exit_code, sig, core = decode_exit(int(e.code), int(e.group_code))
            out.append(ExitRecord(time=clock.unix(e.ns) or now, rank=rank, pid=tgid, exit_code=exit_code,
                                  signal=sig, core_dumped=core,
                                  comm=bytes(e.comm).split(b"\0", 1)[0].decode(errors="replace")))
            # Threads of a dead process are done: free their slots.
            for tid in [t.tid for t in per_pid.get(tgid, [])]:
                try:
                    del self._bpf[b"threads"][self._bpf[b"threads"].Key(tid)]
                except KeyError:
                    pass

        for k, v in self.entries("signals"):
            rank = self._ranks.get(k.target)
            key = (int(k.target), int(k.sig), int(k.sender))
            if rank is None or self._seen_signals.get(key) == v.count:
                continue
            self._seen_signals[key] = int(v.count)
            out.append(SignalRecord(
                time=clock.unix(v.last_ns) or now, rank=rank, pid=int(k.target), signal=int(k.sig),
                signal_name=signal_name(int(k.sig)), sender_pid=int(k.sender),
                sender_comm=bytes(v.comm).split(b"\0", 1)[0].decode(errors="replace"),
                code=int(v.code), result=int(v.result), count=int(v.count),
                first_time=clock.unix(v.first_ns) or now,
            ))

        for k, o in self.entries("ooms"):
            rank = self._ranks.get(k.value)
            if rank is None or k.value in self._seen_ooms:
                continue
            self._seen_ooms.add(k.value)
            out.append(OomRecord(time=clock.unix(o.ns) or now, rank=rank, pid=int(k.value),
                                 total_vm_kb=int(o.total_vm) * 4 or None, anon_rss_kb=int(o.anon_rss) * 4 or None))
        return out


def decode_exit(code: int, group_code: int) -> tuple[int | None, int | None, bool]:
    """(exit status, killing signal, core dumped) from task_struct.exit_code and exit_group()."""
    if code >= 0:
        sig = code & 0x7F
        if sig:
            return None, sig, bool(code & 0x80)
        return (code >> 8) & 0xFF, None, False
    if group_code >= 0:
        return group_code & 0xFF, None, False
    return None, None, False
