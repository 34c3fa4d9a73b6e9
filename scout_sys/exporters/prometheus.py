"""``watch --prometheus [ADDR:]PORT``: the watch's state in the Prometheus exposition format.

The HTTP server (``prometheus_client``) runs on its own daemon threads. The poll loop only hands over
the latest :class:`~scout_sys.model.Snapshot` (one reference assignment); a custom collector turns it
into metric families when a scrape arrives, so a scrape costs the poll nothing and a poll costs nothing
when nobody scrapes. Every metric is documented in docs/metrics.md.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from scout_sys.consensus.kinds import KINDS
from scout_sys.errors import ScoutError
from scout_sys.model import (
    ATTRIBUTED,
    INCONCLUSIVE,
    STATES,
    Event,
    Snapshot,
)
from scout_sys.probes import does_not_apply

STATUSES = (ATTRIBUTED, INCONCLUSIVE)
RANK_LABELS = ["job", "rank", "host"]
GPU_LABELS = ["job", "rank", "host", "gpu"]
# NVML device fields (DeviceSample.to_json) → (metric, help, scale to base units)
_GPU_GAUGES = (
    ("util_percent", "scout_sys_gpu_utilization_ratio", "GPU utilisation (0-1) of the rank's device", 0.01),
    ("mem_used", "scout_sys_gpu_memory_used_bytes", "device memory in use", 1.0),
    ("mem_total", "scout_sys_gpu_memory_total_bytes", "device memory", 1.0),
    ("temperature_c", "scout_sys_gpu_temperature_celsius", "GPU temperature", 1.0),
    ("power_w", "scout_sys_gpu_power_watts", "GPU power draw", 1.0),
)


def parse_listen(value: str) -> tuple[str, int]:
    """``PORT``, ``:PORT``, ``ADDR:PORT`` or ``[IPv6]:PORT`` → (address, port). Raises ScoutError."""
    addr, sep, port = value.rpartition(":")
    if not sep:
        addr, port = "0.0.0.0", value
    addr = addr.strip("[]") or "0.0.0.0"
    try:
        n = int(port)
    except ValueError:
        raise ScoutError(f"--prometheus {value}: expected [ADDR:]PORT, e.g. 9464 or 127.0.0.1:9464") from None
    if not 0 <= n <= 65535:
        raise ScoutError(f"--prometheus {value}: port {n} is not in 0-65535")
    return addr, n


class SnapshotCollector(Collector):
    """Metric families built at scrape time from the latest snapshot and the event counts."""

    def __init__(self, job_name: str | None) -> None:
        self.job_name = job_name
        self._lock = threading.Lock()
        self._snap: Snapshot | None = None
        self._took = 0.0
        self._polls = 0
        self._opened: dict[str, int] = dict.fromkeys(KINDS, 0)
        self._last_event: float | None = None

    # fed by the poll loop: cheap
    def update(self, s: Snapshot, took: float) -> None:
        with self._lock:
            self._snap, self._took, self._polls = s, took, self._polls + 1

    def count(self, e: Event) -> None:
        if getattr(e, "incident", None) is None:  # watch --cluster's agent events: scout_sys_agent_up says it
            return
        with self._lock:
            if e.event == "incident_opened":
                self._opened[e.incident.kind] = self._opened.get(e.incident.kind, 0) + 1
            self._last_event = e.time

    # read by the HTTP threads
    def collect(self) -> Iterator[Any]:
        with self._lock:
            s, took, polls, opened, last = self._snap, self._took, self._polls, dict(self._opened), self._last_event
        if s is None:
            return
        job = self.job_name or str(s.job.launcher_pid or (s.job.ranks[0].pid if s.job.ranks else ""))
        yield from _rank_families(job, s)
        yield from _incident_families(job, s, opened, last)
        yield from _device_families(job, s)
        yield from _monitor_families(job, s, took, polls)


def _rank_families(job: str, s: Snapshot) -> Iterator[Any]:
    state = GaugeMetricFamily("scout_sys_rank_state", "1 for the rank's current state (one-hot over states)",
                              labels=[*RANK_LABELS, "state"])
    pause = GaugeMetricFamily("scout_sys_rank_main_thread_pause_seconds",
                              "seconds since the rank's main thread last ran (0 while running)", labels=RANK_LABELS)
    cpu = GaugeMetricFamily("scout_sys_rank_cpu_ratio", "CPU used by the rank over the last stack window, in cores",
                            labels=RANK_LABELS)
    seq = GaugeMetricFamily("scout_sys_rank_collective_seq",
                            "collectives the rank entered on a process group (eBPF)", labels=[*RANK_LABELS, "group"])
    step = GaugeMetricFamily("scout_sys_rank_step_seconds", "the rank's last measured step time", labels=RANK_LABELS)
    wait = GaugeMetricFamily("scout_sys_rank_wait_ratio", "share of the last window the rank's main thread waited",
                             labels=RANK_LABELS)
    hosts = {r.rank: r.host for r in s.job.ranks}
    for rank in sorted({*hosts, *s.job.missing, *s.views}):
        lbl = [job, str(rank), hosts.get(rank, s.job.host)]
        v = s.views.get(rank)
        now = "exited" if rank in s.job.missing and v is None else (v.state if v else "unknown")
        for st in STATES:
            state.add_metric([*lbl, st], 1.0 if st == now else 0.0)
        if rank in s.pauses:
            pause.add_metric(lbl, s.pauses[rank])
        if v is not None and v.cpu_percent is not None:
            cpu.add_metric(lbl, v.cpu_percent / 100.0)
        for group, n in sorted(s.seqs.get(rank, {}).items()):
            seq.add_metric([*lbl, group], n)
        if s.step_times.get(rank):
            step.add_metric(lbl, s.step_times[rank][-1])
        if s.wait_fractions.get(rank):
            wait.add_metric(lbl, s.wait_fractions[rank][-1])
    yield from (state, pause, cpu, seq, step, wait)


def _incident_families(job: str, s: Snapshot, opened: dict[str, int], last: float | None) -> Iterator[Any]:
    open_ = GaugeMetricFamily("scout_sys_incidents_open", "open incidents by kind and status",
                              labels=["job", "kind", "status"])
    counts = {(k, st): 0 for k in KINDS for st in STATUSES}
    for i in s.incidents:
        counts[(i.kind, i.status)] = counts.get((i.kind, i.status), 0) + 1
    for (k, st), n in sorted(counts.items()):
        open_.add_metric([job, k, st], n)
    yield open_
    since = GaugeMetricFamily("scout_sys_incident_open_since_timestamp_seconds",
                              "when each open incident began (unix time)", labels=["job", "incident", "kind", "status"])
    culprit = GaugeMetricFamily("scout_sys_culprit", "1 for each rank an open attributed incident names",
                                labels=[*RANK_LABELS, "kind", "incident"])
    for i in s.incidents:
        since.add_metric([job, i.id, i.kind, i.status], i.since)
        if i.status == ATTRIBUTED:
            for r in i.ranks:
                culprit.add_metric([job, str(r), s.job.host_of(r), i.kind, i.id], 1.0)
    yield since
    yield culprit
    total = CounterMetricFamily("scout_sys_incidents_opened", "incidents opened since the watch started, by kind",
                                labels=["job", "kind"])
    for k, n in sorted(opened.items()):
        total.add_metric([job, k], n)
    yield total
    if last is not None:
        yield _one("scout_sys_last_verdict_timestamp_seconds",
                   "when an incident was last opened, updated or closed (unix time)", job, last)


def _one(name: str, doc: str, job: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=["job"])
    g.add_metric([job], value)
    return g


def _device_families(job: str, s: Snapshot) -> Iterator[Any]:
    if not s.devices:
        return
    gauges = {field: GaugeMetricFamily(name, doc, labels=GPU_LABELS) for field, name, doc, _ in _GPU_GAUGES}
    ecc = CounterMetricFamily("scout_sys_gpu_ecc_uncorrected_errors",
                              "volatile uncorrected ECC errors since the driver loaded", labels=GPU_LABELS)
    slow = GaugeMetricFamily("scout_sys_gpu_slowdown", "1 for each reason the GPU is slowing itself down",
                             labels=[*GPU_LABELS, "reason"])
    for rank, d in sorted(s.devices.items()):
        lbl = [job, str(rank), s.job.host_of(rank), str(d.get("index", ""))]
        for field, _name, _doc, scale in _GPU_GAUGES:
            if isinstance(d.get(field), (int, float)):
                gauges[field].add_metric(lbl, float(d[field]) * scale)  # type: ignore[arg-type]
        if isinstance(d.get("ecc_uncorrected"), int):
            ecc.add_metric(lbl, float(d["ecc_uncorrected"]))  # type: ignore[arg-type]
        for reason in str(d.get("slowdown") or "").split(","):
            if reason:
                slow.add_metric([*lbl, reason], 1.0)
    yield from (*gauges.values(), ecc, slow)


def _monitor_families(job: str, s: Snapshot, took: float, polls: int) -> Iterator[Any]:
    up = GaugeMetricFamily("scout_sys_probe_up", "1 when the probe is attached, 0 when it is off (see the watch's "
                           "report for why); probes with nothing to observe here are in "
                           "scout_sys_probe_not_applicable instead", labels=["job", "probe"])
    na = GaugeMetricFamily("scout_sys_probe_not_applicable", "1 for a probe off because this host or job gives it "
                           "nothing to observe (nvml without a GPU, ebpf-comms on a Gloo job)", labels=["job", "probe"])
    for name, reason in sorted(s.probes.items()):
        if does_not_apply(name, reason):
            na.add_metric([job, name], 1.0)
        else:
            up.add_metric([job, name], 1.0 if reason is None else 0.0)
    yield up
    yield na
    if s.lost_events is not None:
        lost = CounterMetricFamily("scout_sys_ebpf_lost_events", "eBPF records dropped because a bounded kernel "
                                   "map was full", labels=["job"])
        lost.add_metric([job], s.lost_events)
        yield lost
    yield _one("scout_sys_poll_duration_seconds", "how long the last poll took", job, took)
    polls_total = CounterMetricFamily("scout_sys_polls", "polls since the watch started", labels=["job"])
    polls_total.add_metric([job], polls)
    yield polls_total
    yield _one("scout_sys_snapshot_timestamp_seconds", "when the state shown was taken (unix time)", job, s.time)
    yield _one("scout_sys_stall_after_seconds", "how long without progress the watch calls a hang", job,
               s.stall_after)
    yield _one("scout_sys_job_ended", "1 once the watched job has ended", job, 1.0 if s.ended else 0.0)
    if s.agents:  # watch --cluster
        agents = GaugeMetricFamily("scout_sys_agent_up", "1 while the host's agent reports (watch --cluster); 0 "
                                   "when it is lost or never reported: its ranks are not observed",
                                   labels=["job", "node", "host"])
        for a in s.agents:
            agents.add_metric([job, str(a["node"]), str(a["host"])], 1.0 if a["state"] == "up" else 0.0)
        yield agents


class _Jobs(Collector):
    """Every job's collector as one: families of the same name merged (one HELP/TYPE each, the jobs'
    samples apart by their ``job`` label), as a node monitor that follows several jobs serves them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.collectors: dict[str, SnapshotCollector] = {}

    def add(self, name: str, c: SnapshotCollector) -> None:
        with self._lock:
            self.collectors[name] = c

    def drop(self, name: str, c: SnapshotCollector) -> None:
        with self._lock:
            if self.collectors.get(name) is c:
                del self.collectors[name]

    def collect(self) -> Iterator[Any]:
        with self._lock:
            collectors = list(self.collectors.values())
        merged: dict[str, Any] = {}
        for c in collectors:
            for fam in c.collect():
                if fam.name in merged:
                    merged[fam.name].samples.extend(fam.samples)
                else:
                    merged[fam.name] = fam
        yield from merged.values()


class JobMetrics:
    """One job's sink on a shared exporter (:meth:`PrometheusExporter.job`): its series carry its
    ``job`` label; closed, they are served ``keep`` seconds more (a scrape after the job ended still
    sees how it ended), then dropped."""

    def __init__(self, jobs: _Jobs, name: str, keep: float) -> None:
        self.jobs, self.name, self.keep = jobs, name, keep
        self.collector = SnapshotCollector(name)
        jobs.add(name, self.collector)

    def on_event(self, e: Event) -> None:
        self.collector.count(e)

    def on_snapshot(self, s: Snapshot, took: float) -> None:
        self.collector.update(s, took)

    def close(self) -> None:
        t = threading.Timer(self.keep, self.jobs.drop, (self.name, self.collector))
        t.daemon = True
        t.start()


class PrometheusExporter:
    """The sink: serves ``/metrics`` on ``listen`` from the moment it is constructed. One job's (fed
    as a sink), or several (``watch --every-job``: one :meth:`job` sink each, one port for the node)."""

    def __init__(self, listen: str, job_name: str | None = None) -> None:
        addr, port = parse_listen(listen)
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = SnapshotCollector(job_name)
        self._jobs = _Jobs()
        self._jobs.add("", self.collector)  # the one job's, while nothing is fed through job()
        self.registry.register(self._jobs)
        ProcessCollector(registry=self.registry)  # the monitor's own CPU seconds and RSS (process_*)
        try:
            self._httpd, self._thread = start_http_server(port, addr, registry=self.registry)
        except OSError as e:  # port in use, address not on this host, unresolvable name
            raise ScoutError(f"--prometheus {listen}: cannot listen on {addr}:{port}: "
                             f"{e.strerror or e}") from None
        host, bound = self._httpd.server_address[:2]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{bound}/metrics"

    def job(self, name: str, keep: float = 300.0) -> JobMetrics:
        """A sink for one job of several, its series labelled ``job=name``."""
        self._jobs.drop("", self.collector)
        return JobMetrics(self._jobs, name, keep)

    def on_event(self, e: Event) -> None:
        self.collector.count(e)

    def on_snapshot(self, s: Snapshot, took: float) -> None:
        self.collector.update(s, took)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


__all__ = ["JobMetrics", "PrometheusExporter", "SnapshotCollector", "parse_listen"]
