"""The exporters on synthetic Events and Snapshots: metric families, the HTTP endpoint, hooks (real
shells: exact stdin, environment, timeout kill of the whole process group, failures), the events file
(fsync, reopen after rotation), private file modes. Real jobs: tests/test_exporters_e2e.py."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import stat
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scout_sys import files
from scout_sys.errors import ScoutError
from scout_sys.exporters import Sinks
from scout_sys.exporters.events import EventsFile
from scout_sys.exporters.hooks import HookRunner, hook_env
from scout_sys.exporters.prometheus import PrometheusExporter, parse_listen
from scout_sys.model import (
    ATTRIBUTED,
    HANG,
    Event,
    Evidence,
    Incident,
    Job,
    Rank,
    RankView,
    Snapshot,
    with_job,
)

T = 1_764_000_000.0


def _snapshot(incidents: tuple[Incident, ...] = ()) -> Snapshot:
    ranks = tuple(Rank(rank=r, pid=100 + r, host="node7") for r in range(4))
    job = Job(ranks=ranks, world_size=4, launcher="torchrun", launcher_pid=99, host="node7")
    views = {r: RankView(rank=r, state="waiting", cpu_percent=2.0) for r in (0, 1, 3)}
    views[2] = RankView(rank=2, state="idle", cpu_percent=0.0)
    return Snapshot(time=T, started=T - 60, job=job, views=views, incidents=incidents,
                    probes={"procfs": None, "ebpf-collectives": "not requested"}, stall_after=5.0,
                    step_times={0: (0.25, 0.5)}, wait_fractions={0: (0.9,)},
                    devices={0: {"index": 3, "util_percent": 87, "mem_used": 2**30, "slowdown": "hw-thermal"}},
                    pauses={0: 12.0, 1: 12.5, 2: 13.0, 3: 12.1}, seqs={0: {"gloo:0": 41}}, lost_events=0)


HANG_2 = Incident(kind=HANG, status=ATTRIBUTED, ranks=(2,), hosts=("node7",), since=T - 10,
                  summary="rank 2 hung; the others wait in all_reduce", id="inc-1",
                  evidence=(Evidence("stack", "rank 2 in load_next_batch_stuck", rank=2),))
OPENED = Event("incident_opened", T, HANG_2, "/var/lib/scout-sys/bundles/x-inc-1-hang")


def _samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _value(samples: dict, name: str, **labels: str) -> float | None:
    for (n, lbl), v in samples.items():
        if n == name and set(labels.items()) <= set(lbl):
            return v
    return None


def test_metrics_show_the_culprit_its_state_and_the_open_incident() -> None:
    ex = PrometheusExporter("127.0.0.1:0", job_name="llama")
    try:
        ex.on_event(OPENED)
        ex.on_snapshot(_snapshot((HANG_2,)), 0.004)
        m = _samples(generate_latest(ex.registry).decode())
        # one-hot rank states
        assert _value(m, "scout_sys_rank_state", job="llama", rank="2", host="node7", state="idle") == 1
        assert _value(m, "scout_sys_rank_state", rank="2", state="waiting") == 0
        assert _value(m, "scout_sys_rank_state", rank="0", state="waiting") == 1
        assert _value(m, "scout_sys_culprit", rank="2", kind=HANG, incident="inc-1") == 1
        assert _value(m, "scout_sys_culprit", rank="0") is None
        assert _value(m, "scout_sys_incidents_open", kind=HANG, status=ATTRIBUTED) == 1
        assert _value(m, "scout_sys_incidents_open", kind="straggler", status=ATTRIBUTED) == 0
        assert _value(m, "scout_sys_incidents_opened_total", kind=HANG) == 1
        assert _value(m, "scout_sys_incident_open_since_timestamp_seconds", incident="inc-1") == T - 10
        assert _value(m, "scout_sys_last_verdict_timestamp_seconds", job="llama") == T
        assert _value(m, "scout_sys_rank_main_thread_pause_seconds", rank="2") == 13.0
        assert _value(m, "scout_sys_rank_collective_seq", rank="0", group="gloo:0") == 41
        assert _value(m, "scout_sys_rank_step_seconds", rank="0") == 0.5
        assert _value(m, "scout_sys_rank_cpu_ratio", rank="0") == 0.02
        assert _value(m, "scout_sys_gpu_utilization_ratio", rank="0", gpu="3") == 0.87
        assert _value(m, "scout_sys_gpu_memory_used_bytes", rank="0", gpu="3") == 2**30
        assert _value(m, "scout_sys_gpu_slowdown", rank="0", reason="hw-thermal") == 1
        assert _value(m, "scout_sys_probe_up", probe="procfs") == 1
        assert _value(m, "scout_sys_probe_up", probe="ebpf-collectives") == 0
        assert _value(m, "scout_sys_ebpf_lost_events_total") == 0
        assert _value(m, "scout_sys_poll_duration_seconds") == 0.004
        assert _value(m, "process_resident_memory_bytes") > 0  # the monitor's own RSS and CPU
        assert _value(m, "process_cpu_seconds_total") is not None
        # the incident closes: the culprit and the open gauge go, the counter stays
        ex.on_event(Event("incident_closed", T + 5, HANG_2))
        ex.on_snapshot(_snapshot(), 0.003)
        m = _samples(generate_latest(ex.registry).decode())
        assert _value(m, "scout_sys_culprit", rank="2") is None
        assert _value(m, "scout_sys_incidents_open", kind=HANG, status=ATTRIBUTED) == 0
        assert _value(m, "scout_sys_incidents_opened_total", kind=HANG) == 1
    finally:
        ex.close()


def test_job_label_defaults_to_the_launcher_pid_and_nothing_before_the_first_snapshot() -> None:
    ex = PrometheusExporter("127.0.0.1:0")
    try:
        assert "scout_sys_" not in generate_latest(ex.registry).decode()
        ex.on_snapshot(_snapshot(), 0.0)
        m = _samples(generate_latest(ex.registry).decode())
        assert _value(m, "scout_sys_rank_state", job="99", rank="1", state="waiting") == 1
    finally:
        ex.close()


def test_endpoint_serves_http_on_its_own_thread() -> None:
    ex = PrometheusExporter("127.0.0.1:0", job_name="j")
    try:
        ex.on_snapshot(_snapshot((HANG_2,)), 0.0)
        assert ex.url.startswith("http://127.0.0.1:") and ex.url.endswith("/metrics")
        body = urllib.request.urlopen(ex.url, timeout=5).read().decode()
        assert 'scout_sys_culprit{host="node7",incident="inc-1",job="j",kind="hang",rank="2"} 1.0' in body
    finally:
        ex.close()


@pytest.mark.parametrize("value,addr,port", [("9464", "0.0.0.0", 9464), (":9464", "0.0.0.0", 9464),
                                             ("127.0.0.1:80", "127.0.0.1", 80), ("[::1]:9464", "::1", 9464)])
def test_parse_listen(value: str, addr: str, port: int) -> None:
    assert parse_listen(value) == (addr, port)


@pytest.mark.parametrize("value", ["abc", "127.0.0.1:", "70000", "host:-1"])
def test_parse_listen_rejects(value: str) -> None:
    with pytest.raises(ScoutError, match="--prometheus"):
        parse_listen(value)


def test_port_in_use_and_bad_address_are_scout_errors() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(ScoutError, match="in use"):
            PrometheusExporter(f"127.0.0.1:{s.getsockname()[1]}")
    with pytest.raises(ScoutError, match="cannot listen"):
        PrometheusExporter("no-such-host.invalid:0")
    with pytest.raises(ScoutError, match="cannot listen"):
        PrometheusExporter("192.0.2.1:0")  # TEST-NET: not an address of this host


# ------------------------------------------------------------------------------------------ sinks


class _Broken:
    def on_event(self, e: Event) -> None:
        raise RuntimeError("boom")

    def on_snapshot(self, s: Snapshot, took: float) -> None:
        raise RuntimeError("bang")

    def close(self) -> None:
        pass


class _Kept:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.snaps: list[Snapshot] = []

    def on_event(self, e: Event) -> None:
        self.events.append(e)

    def on_snapshot(self, s: Snapshot, took: float) -> None:
        self.snaps.append(s)

    def close(self) -> None:
        pass


class _Polled:
    """What Sinks.attach uses of a watcher: ``snapshot`` and the ``sinks`` its ``poll()`` feeds (as
    scout_sys.watch.Watcher.poll does)."""

    def __init__(self) -> None:
        self.snapshot = _snapshot()
        self.sinks: list = []

    def poll(self) -> list[Event]:
        self.snapshot = _snapshot((HANG_2,))
        for sink in self.sinks:
            sink.on_event(OPENED)
            sink.on_snapshot(self.snapshot, 0.01)
        return [OPENED]


def test_a_failing_sink_is_reported_and_the_others_still_get_everything() -> None:
    said: list[str] = []
    kept = _Kept()
    w = _Polled()
    Sinks([_Broken(), kept], said.append).attach(w)
    assert w.poll() == [OPENED]  # the poll's own result is unchanged
    assert kept.events == [OPENED] and [s.incidents for s in kept.snaps] == [(), (HANG_2,)]
    assert any("boom" in m for m in said) and any("bang" in m for m in said)


# ------------------------------------------------------------------------------------------ hooks


def _wait(pred, timeout: float = 10.0) -> None:
    end = time.time() + timeout
    while time.time() < end and not pred():
        time.sleep(0.05)
    assert pred()


def test_hook_gets_the_exact_event_json_and_its_environment(tmp_path) -> None:
    said: list[str] = []
    out = tmp_path / "got"
    h = HookRunner(f"cat > {out}.json; env | grep ^SCOUT_SYS_ | sort > {out}.env", user="root" if os.geteuid() == 0
                   else None, say=said.append)
    h.on_event(OPENED)
    h.on_event(Event("incident_updated", T, HANG_2))  # not without all_events
    h.close()
    assert (tmp_path / "got.json").read_text() == json.dumps(OPENED.to_json()) + "\n"
    env = dict(line.split("=", 1) for line in (tmp_path / "got.env").read_text().splitlines())
    env = {k: v for k, v in env.items() if os.environ.get(k) != v}  # not what the runner's env passed on
    assert env == {"SCOUT_SYS_BUNDLE": OPENED.bundle, "SCOUT_SYS_EVENT": "incident_opened",
                   "SCOUT_SYS_HOSTS": "node7", "SCOUT_SYS_INCIDENT": "inc-1", "SCOUT_SYS_KIND": HANG,
                   "SCOUT_SYS_RANKS": "2", "SCOUT_SYS_STATUS": ATTRIBUTED, "SCOUT_SYS_JOB": ""}
    assert said == ["scout-sys: hook for inc-1 incident_opened: exit 0 in " + said[0].rsplit(" in ", 1)[1]]
    assert hook_env(with_job(OPENED, "run-7"))["SCOUT_SYS_JOB"] == "run-7"  # watch --every-job names the job
    assert with_job(OPENED, "run-7").to_json() == {**OPENED.to_json(), "job": "run-7"}


def test_a_failing_hook_is_reported_with_its_exit_status_and_stderr_tail() -> None:
    said: list[str] = []
    h = HookRunner("echo first >&2; echo 'webhook: 503\x1b[31m' >&2; exit 3", all_events=True, say=said.append)
    h.on_event(Event("incident_closed", T, HANG_2))
    h.close()
    assert len(said) == 1 and said[0].startswith("scout-sys: hook for inc-1 incident_closed: exit 3 in ")
    assert said[0].endswith("stderr: first | webhook: 503?[31m")  # no terminal escape gets through
    assert h.failed == 1


def test_a_hanging_hook_is_killed_with_its_process_group_at_its_timeout(tmp_path) -> None:
    said: list[str] = []
    pidfile = tmp_path / "pid"
    h = HookRunner(f"sleep 300 & echo $! > {pidfile}; echo started >&2; wait", timeout=4.0,
                   user="root" if os.geteuid() == 0 else None, say=said.append)
    t0 = time.time()
    h.on_event(OPENED)  # returns at once: the poll loop is never held (held, it would wait the 4 s timeout)
    assert time.time() - t0 < 2.0
    _wait(lambda: said, timeout=20)
    assert said[0] == "scout-sys: hook for inc-1 incident_opened: killed at its 4 s timeout; stderr: started"
    grandchild = int(pidfile.read_text())
    _wait(lambda: not os.path.exists(f"/proc/{grandchild}") or
          open(f"/proc/{grandchild}/stat").read().split(") ")[1][0] == "Z", timeout=5)
    h.close()


def test_hooks_beyond_the_backlog_are_skipped_and_said_so() -> None:
    said: list[str] = []
    h = HookRunner("sleep 0.5", workers=1, backlog=1, say=said.append)
    for _ in range(4):
        h.on_event(OPENED)
    skipped = [m for m in said if "skipped" in m]
    h.close()
    assert len(skipped) == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_as_root_hooks_run_as_nobody_unless_told() -> None:
    said: list[str] = []
    h = HookRunner("id -un >&2", say=said.append)
    h.on_event(OPENED)
    h.close()
    assert said[0].endswith("stderr: nobody")
    with pytest.raises(ScoutError, match="no such user"):
        HookRunner("true", user="no-such-user-here")


# ------------------------------------------------------------------------------------------ events file


def test_events_file_appends_fsynced_private_lines_and_reopens_after_rotation(tmp_path) -> None:
    path = tmp_path / "log" / "events.jsonl"
    ev = EventsFile(str(path))
    ev.on_event(OPENED)
    _wait(lambda: ev.written == 1)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    os.rename(path, tmp_path / "log" / "events.jsonl.1")  # logrotate moves it, then sends SIGHUP
    ev.reopen()
    closed = Event("incident_closed", T + 1, HANG_2)
    ev.on_event(closed)
    ev.close()
    assert (tmp_path / "log" / "events.jsonl.1").read_text() == json.dumps(OPENED.to_json()) + "\n"
    assert path.read_text() == json.dumps(closed.to_json()) + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_events_file_that_cannot_be_opened_is_a_scout_error(tmp_path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(ScoutError, match="--events"):
        EventsFile(str(tmp_path / "f" / "events.jsonl"))


# ------------------------------------------------------------------------------------------ file modes


def test_private_dirs_and_files(tmp_path) -> None:
    old = os.umask(0o022)
    try:
        d = files.private_dirs(str(tmp_path / "a" / "b"))
        assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o700
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
        with open(os.path.join(d, "x"), "w", opener=files.private_opener) as f:
            f.write("secret")
        assert stat.S_IMODE(os.stat(os.path.join(d, "x")).st_mode) == 0o600
        gid = os.getgroups()[0] if os.getgroups() else os.getgid()
        files.share_with_group(str(gid))
        try:
            g = files.private_dirs(str(tmp_path / "g"))
            with open(os.path.join(g, "y"), "w", opener=files.private_opener) as f:
                f.write("for on-call")
            st = os.stat(os.path.join(g, "y"))
            assert stat.S_IMODE(os.stat(g).st_mode) == 0o750 and stat.S_IMODE(st.st_mode) == 0o640
            assert st.st_gid == gid and os.stat(g).st_gid == gid
        finally:
            files.share_with_group(None)
        with pytest.raises(ScoutError, match="no such group"):
            files.share_with_group("no-such-group-here")
    finally:
        os.umask(old)


def test_bad_prometheus_values_on_the_command_line_say_one_line_and_exit_2() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        for value, says in ((f"127.0.0.1:{s.getsockname()[1]}", "in use"), ("no-such-host.invalid:9464", "cannot"),
                            ("x", "expected [ADDR:]PORT")):
            out = subprocess.run([sys.executable, "-m", "scout_sys", "watch", "--job", "999999999", "--headless",
                                  "--prometheus", value], capture_output=True, text=True, timeout=60)
            assert out.returncode == 2, out
            assert out.stdout == "" and len(out.stderr.splitlines()) == 1, out.stderr
            assert out.stderr.startswith(f"scout-sys: error: --prometheus {value}") and says in out.stderr


# ------------------------------------------------------------------------------------------ examples and docs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _every_metric_name() -> set[str]:
    """Every metric name the exporter can show (a snapshot with devices, eBPF, incidents, a verdict)."""
    ex = PrometheusExporter("127.0.0.1:0")
    try:
        ex.on_event(OPENED)
        ex.on_snapshot(_snapshot((HANG_2,)), 0.01)
        s = _snapshot((HANG_2,))
        s.devices[0].update({"mem_total": 2**34, "temperature_c": 60, "power_w": 300.0, "ecc_uncorrected": 0})
        s = dataclasses.replace(s, agents=({"node": 0, "host": "h", "state": "up", "ranks": [0], "detail": ""},),
                                probes={**s.probes, "nvml": "no rank of this job uses a CUDA device"})
        ex.on_snapshot(s, 0.01)
        return {name for name, _ in _samples(generate_latest(ex.registry).decode())}
    finally:
        ex.close()


def test_examples_and_docs_name_only_metrics_that_exist() -> None:
    import re

    names = _every_metric_name()
    docs = open(os.path.join(REPO, "docs", "metrics.md")).read()
    for f in ("examples/prometheus-alerts.yml", "examples/grafana-dashboard.json", "docs/metrics.md"):
        used = set(re.findall(r"\b(scout_sys_[a-z_]+[a-z])\b", open(os.path.join(REPO, f)).read()))
        assert used and used <= names, (f, used - names)
    # and every metric is documented
    assert {n.removesuffix("_total") for n in names if n.startswith("scout_sys_")} <= \
        {n.removesuffix("_total") for n in re.findall(r"\b(scout_sys_[a-z_]+[a-z])\b", docs)}
    json.load(open(os.path.join(REPO, "examples", "grafana-dashboard.json")))


def test_on_incident_example_dry_run_says_what_it_would_do() -> None:
    out = subprocess.run([os.path.join(REPO, "examples", "on-incident.sh"), "--dry-run", "--drain",
                          "--webhook", "https://hooks.example/x"], input=json.dumps(OPENED.to_json()) + "\n",
                         capture_output=True, text=True, timeout=30, env={"PATH": os.environ["PATH"]})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("would run: curl ") and lines[0].endswith(" https://hooks.example/x")
    assert "rank\\(s\\)\\ 2\\ on\\ node7" in lines[0]
    assert len(lines) == 1, lines  # a hang is the job's, not the node's: posted, never drained
    hw = Event("incident_opened", T, dataclasses.replace(HANG_2, kind="hardware"))
    out = subprocess.run([os.path.join(REPO, "examples", "on-incident.sh"), "--dry-run", "--drain"],
                         input=json.dumps(hw.to_json()) + "\n", capture_output=True, text=True, timeout=30,
                         env={"PATH": os.environ["PATH"]})
    assert out.stdout.splitlines() == ["would run: scontrol update nodename=node7 state=drain "
                                       "reason=scout-sys/inc-1/hardware/ranks/2"], out.stderr


def test_on_incident_example_posts_to_a_webhook() -> None:
    import http.server
    import threading

    got: list[bytes] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            got.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        closed = Event("incident_closed", T, HANG_2)
        out = subprocess.run([os.path.join(REPO, "examples", "on-incident.sh"), "--drain", "--webhook",
                              f"http://127.0.0.1:{srv.server_address[1]}/hook"],
                             input=json.dumps(closed.to_json()), capture_output=True, text=True, timeout=30)
    finally:
        srv.shutdown()
        srv.server_close()
    assert out.returncode == 0, out.stderr
    assert [json.loads(b)["text"] for b in got] == [
        "scout-sys closed inc-1: hang (attributed) rank(s) 2 on node7: rank 2 hung; the others wait in all_reduce"]


def test_saved_reports_are_private(tmp_path) -> None:
    from scout_sys.tui.source import save_report

    paths = save_report(_snapshot((HANG_2,)), str(tmp_path / "reports"))
    assert stat.S_IMODE(os.stat(tmp_path / "reports").st_mode) == 0o700
    assert [stat.S_IMODE(os.stat(p).st_mode) for p in paths] == [0o600, 0o600]


def test_a_probe_with_nothing_to_observe_is_not_down() -> None:
    """On a host without GPUs (this one) nvml is off for good: ScoutSysProbeDown (scout_sys_probe_up == 0)
    must not fire for it forever. A probe that is off for a fault to fix still reads 0."""
    from scout_sys.probes.nvml import NvmlProbe

    no_driver = NvmlProbe().check()  # the real reason on this machine: no NVIDIA driver
    assert no_driver is not None
    ex = PrometheusExporter("127.0.0.1:0", job_name="llama")
    try:
        s = dataclasses.replace(_snapshot(), probes={"procfs": None, "nvml": no_driver,
                                                     "ebpf-comms": "no NCCL library (libnccl.so*) mapped ...",
                                                     "ebpf-collectives": "failed to start: bcc missing"})
        ex.on_snapshot(s, 0.004)
        m = _samples(generate_latest(ex.registry).decode())
        assert _value(m, "scout_sys_probe_up", probe="nvml") is None
        assert _value(m, "scout_sys_probe_up", probe="ebpf-comms") is None
        assert _value(m, "scout_sys_probe_not_applicable", probe="nvml") == 1
        assert _value(m, "scout_sys_probe_not_applicable", probe="ebpf-comms") == 1
        assert _value(m, "scout_sys_probe_up", probe="ebpf-collectives") == 0
        assert _value(m, "scout_sys_probe_up", probe="procfs") == 1
        # nvml that fails on a host with a driver is a fault: it stays in probe_up, at 0
        ex.on_snapshot(dataclasses.replace(s, probes={"nvml": "failed to start: NVMLError_Unknown"}), 0.004)
        m = _samples(generate_latest(ex.registry).decode())
        assert _value(m, "scout_sys_probe_up", probe="nvml") == 0
    finally:
        ex.close()
