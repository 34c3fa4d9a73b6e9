"""The core records: what is observed of a rank (frames, stacks, /proc samples), the incident kinds
and statuses, and what a decision says (evidence, incident, diagnosis). Imported through
:mod:`scout_sys.model`, the façade of the whole vocabulary."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from scout_sys.model_activity import RankView
from scout_sys.model_job import REPORT, Job, job_to_json
from scout_sys.model_records import (
    CollectiveSample,
    DeviceSample,
    ExitRecord,
    OomRecord,
    ProcessGroupSample,
    SchedSample,
    SignalRecord,
)

SCHEMA = "scout-sys/diagnosis/v1"

# Incident kinds (the JSON "kind" field).
HANG = "hang"
STRAGGLER = "straggler"
DESYNC = "collective_desync"
PROCESS_EXIT = "process_exit"
PROCESS_STALL = "process_stall"
SDC = "sdc"
HARDWARE = "hardware"

ATTRIBUTED = "attributed"
INCONCLUSIVE = "inconclusive"

# The signals by which a rank is seen progressing (watch/progress.py), named in incidents' "trigger"
# and carried by heartbeats (cluster/heartbeat.py): here, where both read them.
COLLECTIVES, MAIN_THREAD, STACK = "collectives", "main thread", "stack"


# --------------------------------------------------------------------------- observations


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int

    def where(self) -> str:
        return f"{self.file}:{self.line} {self.function}"


@dataclass(frozen=True)
class ThreadStack:
    tid: int
    name: str
    active: bool
    frames: tuple[Frame, ...]  # innermost first, as py-spy prints them

    def to_json(self) -> dict[str, Any]:
        return {
            "tid": self.tid,
            "name": self.name,
            "active": self.active,
            "frames": [f.where() for f in self.frames],
        }


@dataclass(frozen=True)
class ProcSample:
    """One read of /proc for one rank (probe: procfs)."""

    time: float
    rank: int
    pid: int
    status: str  # psutil status names, plus "gone" when the process no longer exists
    cpu_time: float = 0.0  # user + system, whole process, seconds
    main_cpu_ns: int | None = None  # on-CPU time of the main thread (schedstat), ns
    main_delay_ns: int | None = None  # main thread runnable but not running (run queue, CPU quota), ns
    main_last_ran: float | None = None  # unix time the main thread last ran (sched exec_start)
    # the CPU cgroup's throttling counters (cpu.stat: nr_periods, nr_throttled, throttled time in ns)
    # and its quota in CPUs (cfs_quota_us / cfs_period_us, v2 cpu.max; None when unlimited)
    cg_periods: int | None = None
    cg_throttled: int | None = None
    cg_throttled_ns: int | None = None
    cg_quota: float | None = None
    ctx_switches: int = 0
    main_voluntary: int | None = None  # the main thread's voluntary context switches (it blocked or slept)
    num_threads: int = 0
    wchan: str | None = None
    write_chars: int | None = None
    read_chars: int | None = None
    exit_code: int | None = None  # zombies: exit status
    exit_signal: int | None = None  # zombies: killed by this signal
    source: str = "procfs"
    # in tracing-stop because py-spy reads its stack (a native dump pauses it for a moment: the watch's
    # own evidence bundle, or someone's `diagnose --native`): a pause for a stack read, not a stop
    paused_by_pyspy: bool = False

    @property
    def alive(self) -> bool:
        return self.status not in ("gone", "zombie", "dead")

    @property
    def stopped(self) -> bool:
        """Stopped (SIGSTOP, or a debugger holds it); a py-spy dump's momentary pause is not a stop."""
        return self.status in ("stopped", "tracing-stop") and not self.paused_by_pyspy


@dataclass(frozen=True)
class StackSample:
    """One Python stack dump of one rank (probe: pystack, py-spy)."""

    time: float
    rank: int
    pid: int
    threads: tuple[ThreadStack, ...] = ()
    error: str | None = None
    native: bool = False
    source: str = "stack"
    denied: bool = False  # the error is a refusal to read the process (ptrace / permissions), said by the probe

    def main(self) -> ThreadStack | None:
        """The thread that runs the training loop: MainThread, else the first one listed."""
        for t in self.threads:
            if t.name == "MainThread":
                return t
        return self.threads[0] if self.threads else None


# What the probes return (the records of model_records.py come from eBPF and NVML)
Observation = Union[  # noqa: UP007
    ProcSample, StackSample, CollectiveSample, SchedSample, SignalRecord, ExitRecord, OomRecord, DeviceSample,
    ProcessGroupSample,
]


# --------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class Evidence:
    """A fact a person can check. ``data`` holds the machine-readable part."""

    source: str  # "stack" | "procfs" | "ebpf" | "nvml" | "replay" | "cluster" (docs/json.md)
    text: str
    rank: int | None = None
    data: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source, "text": self.text}
        if self.rank is not None:
            out["rank"] = self.rank
        out.update(self.data)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Evidence:
        data = {k: v for k, v in d.items() if k not in ("source", "text", "rank")}
        return cls(source=str(d.get("source", "")), text=str(d.get("text", "")), rank=d.get("rank"), data=data)


@dataclass(frozen=True)
class Incident:
    kind: str
    status: str  # ATTRIBUTED | INCONCLUSIVE
    ranks: tuple[int, ...]  # origin global ranks; empty when inconclusive
    hosts: tuple[str, ...]
    since: float
    summary: str
    evidence: tuple[Evidence, ...] = ()
    id: str = ""  # set by the Monitor when it tracks the incident

    def key(self) -> tuple[str, str, tuple[int, ...]]:
        """What makes two findings the same incident across polls."""
        return (self.kind, self.status, self.ranks)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "status": self.status,
            "ranks": list(self.ranks),
            "hosts": list(self.hosts),
            "since": round(self.since, 3),
            "summary": self.summary,
            "evidence": [e.to_json() for e in self.evidence],
        }
        if self.id:
            out["id"] = self.id
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Incident:
        return cls(kind=str(d.get("kind", "")), status=str(d.get("status", "")),
                   ranks=tuple(int(r) for r in d.get("ranks", ())), hosts=tuple(d.get("hosts", ())),
                   since=float(d.get("since", 0.0)), summary=str(d.get("summary", "")),
                   evidence=tuple(Evidence.from_json(e) for e in d.get("evidence", ())), id=str(d.get("id", "")))


@dataclass(frozen=True)
class Diagnosis:
    """The answer of one decision round: what ``diagnose`` prints and the Monitor publishes."""

    time: float
    job: Job
    views: dict[int, RankView] = field(hash=False, compare=False)
    incidents: tuple[Incident, ...]
    probes: dict[str, str | None] = field(hash=False, compare=False)  # name -> None (on) | reason off
    window: float = 0.0
    notes: tuple[str, ...] = ()

    @property
    def healthy(self) -> bool:
        return not self.incidents

    def to_json(self) -> dict[str, Any]:
        job = job_to_json(self.job, REPORT)
        for d in job["ranks"]:
            if d["pid"] is None:  # exited before it was seen (Job.missing)
                d["state"] = "exited"
                continue
            v = self.views.get(d["rank"])
            d["state"] = v.state if v else "unknown"
            if v:
                d["where"] = v.where
                if v.collective:
                    d["collective"] = v.collective
                if v.cpu_percent is not None:  # the CPU% column of the text output
                    d["cpu_percent"] = round(v.cpu_percent, 1)
        return {
            "schema": SCHEMA,
            "time": round(self.time, 3),
            "job": job,
            "status": "healthy" if self.healthy else "incident",
            "incidents": [i.to_json() for i in self.incidents],
            "probes": {k: ("on" if v is None else f"off: {v}") for k, v in self.probes.items()},
            "window": round(self.window, 3),
            "notes": list(self.notes),
        }
