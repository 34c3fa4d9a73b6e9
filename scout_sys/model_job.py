"""The job: its rank processes, where its peer groups came from, and its JSON (the one codec).

Re-exported by :mod:`scout_sys.model`. The Job is written in two profiles, both here:

- :data:`REPORT`, the ``"job"`` object of a ``scout-sys/diagnosis/v1`` report (docs/json.md): what a
  person or the dashboard reads; the job's notes are the report's top-level ``"notes"``, and each rank's
  state is added by :meth:`scout_sys.model.Diagnosis.to_json`.
- :data:`WIRE`, what an agent sends the leader (cluster/): every field of every rank record, compact
  (a rank's fields at their default, and its host when it is the job's, are left out), and the notes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from enum import Enum
from functools import cached_property
from types import MappingProxyType
from typing import Any, Literal


class LayoutSource(str, Enum):  # enum.StrEnum from Python 3.11; the monitor runs on 3.9
    """Where a Job's peer groups came from (``"layout_source"`` in docs/json.md)."""

    def __str__(self) -> str:  # its value, as StrEnum's: f-strings and str() print "learned"
        return str(self.value)

    NONE = "none"  # nothing says: one group of every rank (consensus then groups by activity)
    TOPOLOGY = "topology"  # --topology (scout_sys.topology)
    FRAMEWORK = "framework"  # a framework's command line or config: Megatron-Core, DeepSpeed, TorchTitan
    LEARNED = "learned"  # the job's process groups, as the probes learned them (consensus/peers.py)


# How a learned layout's sentence begins (consensus/peers.py writes it); read only to decode the
# reports and agents of versions that did not write ``layout_source`` (:func:`_earlier`).
LEARNED_FROM = "process groups learned from"


@dataclass(frozen=True)
class Rank:
    """One rank process of the job, as found on this host."""

    rank: int
    pid: int
    host: str
    local_rank: int | None = None
    world_size: int | None = None
    group_rank: int | None = None
    device: str = "cpu"
    run_id: str | None = None
    name: str = ""  # process name, untrusted text
    coords: tuple[tuple[str, int], ...] = ()  # place in the parallel layout, e.g. (("dp", 1), ("pp", 0))
    container_pid: int | None = None  # its pid inside its own PID namespace (a container); ``pid`` is the host's

    def pid_text(self) -> str:
        """``1234``, or ``1234 (container pid 7)`` for a rank in its own PID namespace."""
        return f"{self.pid} (container pid {self.container_pid})" if self.container_pid is not None else str(self.pid)

    def to_json(self) -> dict[str, Any]:
        """The rank in a report (the :data:`REPORT` profile)."""
        out: dict[str, Any] = {
            "rank": self.rank,
            "pid": self.pid,
            "host": self.host,
            "local_rank": self.local_rank,
            "device": self.device,
        }
        if self.container_pid is not None:
            out["container_pid"] = self.container_pid
        if self.coords:
            out["coords"] = dict(self.coords)
        return out


@dataclass(frozen=True)
class Job:
    """What the selector found: the rank processes and which of them are equivalent peers."""

    ranks: tuple[Rank, ...]
    world_size: int
    launcher: str  # "torchrun", "shell", "explicit", ... (for people)
    launcher_pid: int | None
    host: str
    # Global ranks expected on this host but not found (exited before we looked).
    missing: tuple[int, ...] = ()
    # Equivalent peer groups (global ranks). Default: every rank is a replica of every other.
    peer_groups: tuple[tuple[int, ...], ...] = ()
    notes: tuple[str, ...] = ()
    # Where peer_groups came from, for people (a sentence; code reads layout_source, never this).
    layout: str = ""
    # Global ranks that run on other hosts: not observed here, never judged here.
    remote: tuple[int, ...] = ()
    # Hosts of ranks in ``missing`` when they are not ``host`` (a whole-job view merged from agents).
    missing_hosts: tuple[tuple[int, str], ...] = ()
    layout_source: LayoutSource = LayoutSource.NONE
    # The short "where" of ``layout``: "--topology dp=2,tp=2", "DeepSpeed config ds.json" (the dashboard's title)
    layout_from: str = ""
    # How many ranks the launcher says live on this host beyond those found, without saying which
    # (Open MPI, MPICH): not missing (no rank is named), but what `watch` waits for at start-up.
    unplaced: int = 0

    def by_rank(self) -> Mapping[int, Rank]:
        return self._index

    @cached_property
    def _index(self) -> Mapping[int, Rank]:
        # built once per Job (it is frozen): host_of / by_rank are called per rank by consensus
        return MappingProxyType({r.rank: r for r in self.ranks})

    def groups(self) -> tuple[tuple[int, ...], ...]:
        if self.peer_groups:
            return self.peer_groups
        return (tuple(sorted({r.rank for r in self.ranks} | set(self.missing))),)

    def host_of(self, rank: int) -> str:
        r = self.by_rank().get(rank)
        return r.host if r else self._missing_hosts.get(rank, self.host)

    @cached_property
    def _missing_hosts(self) -> Mapping[int, str]:
        return MappingProxyType(dict(self.missing_hosts))


def layout_fields(job: Job | None) -> dict[str, Any]:
    """``job``'s peer groups and where they came from, as keyword arguments of ``Job`` (a Job built
    from others' keeps their layout whole); no layout for None."""
    if job is None:
        return {}
    return {"peer_groups": job.peer_groups, "layout": job.layout, "layout_source": job.layout_source,
            "layout_from": job.layout_from}


# --------------------------------------------------------------------------- the codec

Profile = Literal["report", "wire"]
REPORT: Profile = "report"
WIRE: Profile = "wire"

_RANK_FIELDS = tuple((f.name, f.default) for f in fields(Rank))
_RANK_NAMES = frozenset(name for name, _ in _RANK_FIELDS)
_RANK_DEFAULTS = {name: default for name, default in _RANK_FIELDS if default is not MISSING}


def built(cls: type, defaults: Mapping[str, Any], kw: Mapping[str, Any]) -> Any:
    """An instance of the frozen dataclass ``cls`` (no ``__post_init__``) from decoded fields, every
    required one present. Built without its ``__init__`` (a guarded ``object.__setattr__`` per field),
    which was most of the cost of decoding 64k ranks' answers; the result is the same value."""
    a = object.__new__(cls)
    a.__dict__.update(defaults)
    a.__dict__.update(kw)
    return a


def job_to_json(job: Job, profile: Profile) -> dict[str, Any]:
    """``job`` as JSON in ``profile`` (:data:`REPORT` or :data:`WIRE`, see the module docstring)."""
    return _to_wire(job) if profile == WIRE else _to_report(job)


def job_from_json(d: Mapping[str, Any], profile: Profile, notes: Sequence[str] = ()) -> Job:
    """Read :func:`job_to_json`'s ``profile``. ``notes``: a report's top-level notes (the wire carries its own)."""
    return _from_wire(d) if profile == WIRE else _from_report(d, notes)


def _layout_to_json(job: Job) -> dict[str, Any]:
    return {"layout": job.layout, "peer_groups": [list(g) for g in job.peer_groups],
            "layout_source": job.layout_source.value, "layout_from": job.layout_from}


def _layout_from_json(d: Mapping[str, Any]) -> dict[str, Any]:
    text = str(d.get("layout", ""))
    groups = tuple(tuple(int(x) for x in g) for g in d.get("peer_groups", ()))
    if "layout_source" in d:
        source, where = LayoutSource(d["layout_source"]), str(d.get("layout_from", ""))
    else:
        source, where = _earlier(text)
    return {"peer_groups": groups, "layout": text, "layout_source": source, "layout_from": where}


def _earlier(text: str) -> tuple[LayoutSource, str]:
    """The source and short "where" of a layout sentence written by a version without ``layout_source``
    (its reports stay readable within v1): the one place a layout sentence is read."""
    if not text:
        return LayoutSource.NONE, ""
    source = (LayoutSource.LEARNED if text.startswith(LEARNED_FROM) else
              LayoutSource.TOPOLOGY if text.startswith("--topology") else LayoutSource.FRAMEWORK)
    return source, text.split(":", 1)[0].split(" (")[0]


def _to_report(job: Job) -> dict[str, Any]:
    ranks = [r.to_json() for r in sorted(job.ranks, key=lambda r: r.rank)]
    ranks += [{"rank": m, "pid": None, "host": job.host_of(m), "local_rank": None} for m in job.missing]
    ranks.sort(key=lambda d: d["rank"])
    return {
        "world_size": job.world_size,
        "launcher": job.launcher,
        "launcher_pid": job.launcher_pid,
        "ranks": ranks,
        **({"not_observed": list(job.remote)} if job.remote else {}),
        **(_layout_to_json(job) if job.peer_groups else {}),
    }


def _from_report(j: Mapping[str, Any], notes: Sequence[str]) -> Job:
    ranks: list[Rank] = []
    missing: list[tuple[int, str]] = []
    for r in j.get("ranks", ()):
        n = int(r["rank"])
        if r.get("pid") is None:  # a rank that exited before it was seen
            missing.append((n, str(r.get("host", ""))))
            continue
        ranks.append(Rank(rank=n, pid=int(r["pid"]), host=str(r.get("host", "")), local_rank=r.get("local_rank"),
                          world_size=j.get("world_size"), device=str(r.get("device", "cpu")),
                          container_pid=r.get("container_pid"),
                          coords=tuple((str(k), int(v)) for k, v in (r.get("coords") or {}).items())))
    host = ranks[0].host if ranks else ""
    return Job(ranks=tuple(ranks), world_size=int(j.get("world_size", len(ranks))),
               launcher=str(j.get("launcher", "?")), launcher_pid=j.get("launcher_pid"), host=host,
               missing=tuple(m for m, _ in missing), notes=tuple(notes),
               remote=tuple(int(r) for r in j.get("not_observed", ())),
               missing_hosts=tuple((m, h) for m, h in missing if h and h != host), **_layout_from_json(j))


def _to_wire(job: Job) -> dict[str, Any]:
    ranks = []
    for r in job.ranks:
        d: dict[str, Any] = {}
        for name, default in _RANK_FIELDS:
            v = getattr(r, name)
            if v == default or (name == "host" and v == job.host):
                continue
            d[name] = [list(c) for c in v] if name == "coords" else v
        ranks.append(d)
    return {"ranks": ranks, "world_size": job.world_size, "launcher": job.launcher, "launcher_pid": job.launcher_pid,
            "host": job.host, "missing": list(job.missing), **_layout_to_json(job), "notes": list(job.notes),
            **({"remote": list(job.remote)} if job.remote else {}),
            **({"unplaced": job.unplaced} if job.unplaced else {}),
            **({"missing_hosts": [list(x) for x in job.missing_hosts]} if job.missing_hosts else {})}


def _from_wire(d: Mapping[str, Any]) -> Job:
    host = str(d.get("host", ""))
    ranks = []
    for r in d.get("ranks", ()):
        kw = {"host": host, **{k: v for k, v in r.items() if k in _RANK_NAMES}}
        kw["rank"], kw["pid"] = int(kw["rank"]), int(kw["pid"])
        if "coords" in kw:
            kw["coords"] = tuple((str(k), int(v)) for k, v in kw["coords"])
        ranks.append(built(Rank, _RANK_DEFAULTS, kw))
    return Job(ranks=tuple(ranks), world_size=int(d.get("world_size", len(ranks))), launcher=str(d.get("launcher", "?")),
               launcher_pid=d.get("launcher_pid"), host=host,
               missing=tuple(int(m) for m in d.get("missing", ())), notes=tuple(d.get("notes", ())),
               remote=tuple(int(r) for r in d.get("remote", ())), unplaced=int(d.get("unplaced", 0)),
               missing_hosts=tuple((int(m), str(h)) for m, h in d.get("missing_hosts", ())), **_layout_from_json(d))
