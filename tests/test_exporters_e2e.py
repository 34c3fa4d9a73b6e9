"""The exporters on real demo jobs through the real command line: a scrape during a hang shows the
culprit and the open incident, the hook gets the exact event JSON, the events file has every line the
headless stream printed, a hanging hook is killed and the watch goes on, a failing hook is reported;
and the dashboard's polls feed the sinks too. Jobs are killed at teardown (conftest ``start_job``)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_watch import watch_cli  # noqa: F401 - the fixture: `watch --headless --json` in a subprocess

from scout_sys.demo.launch import free_port
from scout_sys.exporters import Sinks
from scout_sys.exporters.events import EventsFile
from scout_sys.exporters.prometheus import PrometheusExporter
from scout_sys.job import find_job
from scout_sys.model import ATTRIBUTED, HANG
from scout_sys.tui.app import make_app
from scout_sys.watch import WatchConfig, Watcher
from tests._ebpf_jobs import ebpf_skip_reason
from tests.conftest import wait_for

pytestmark = pytest.mark.slow
EBPF = ebpf_skip_reason() is None  # root, with the distro bcc (make test): the watch's eBPF probes run
AS_ROOT = ["--on-incident-user", "root"] if os.geteuid() == 0 else []


def _scrape(port: int, starting: bool = False) -> dict[tuple[str, frozenset], float]:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except urllib.error.URLError:
        if starting:  # the watch is not listening yet
            return {}
        raise
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _get(m: dict, name: str, **labels: str) -> list[float]:
    return [v for (n, lbl), v in m.items() if n == name and set(labels.items()) <= set(lbl)]


def _wait_for(pred, timeout: float) -> None:
    end = time.time() + timeout
    while time.time() < end and not pred():
        time.sleep(0.2)
    assert pred()


def test_scrape_hook_and_events_file_during_a_real_hang(start_job, watch_cli, tmp_path) -> None:  # noqa: F811
    go = tmp_path / "go"  # the hang waits for it: the collective counts are seen growing first
    job = start_job(4, fault="hang", fault_rank=2, fault_step=1, args=["--fault-when", str(go)])
    job.wait_steps(1)
    port, hooks, events = free_port(), tmp_path / "hooks", tmp_path / "events.jsonl"
    hooks.mkdir()
    w = watch_cli(job.pid, "--stall-after", "5", "--state-dir", str(tmp_path / "state"),
                  "--prometheus", f"127.0.0.1:{port}", "--job-name", "demo", "--events", str(events),
                  "--on-incident", f"cat > {hooks}/$SCOUT_SYS_INCIDENT-$SCOUT_SYS_KIND.json", *AS_ROOT)
    _wait_for(lambda: _get(_scrape(port, starting=True), "scout_sys_rank_state", job="demo", rank="3"), timeout=30)
    if EBPF:  # the collective probe attaches in the background: its counts appear once it has
        _wait_for(lambda: _get(_scrape(port), "scout_sys_rank_collective_seq", job="demo", rank="0"), timeout=90)
    go.touch()
    job.wait_fault()
    e = w.wait_event(lambda e: e["event"] == "incident_opened" and e["incident"]["kind"] == HANG, timeout=40)
    assert e["incident"]["ranks"] == [2] and e["incident"]["status"] == ATTRIBUTED, e

    m = _scrape(port)
    assert _get(m, "scout_sys_culprit", job="demo", rank="2", kind=HANG, incident=e["incident"]["id"]) == [1.0]
    assert _get(m, "scout_sys_culprit", rank="0") == []
    assert _get(m, "scout_sys_incidents_open", kind=HANG, status=ATTRIBUTED) == [1.0]
    assert _get(m, "scout_sys_incidents_opened_total", kind=HANG) == [1.0]
    culprit_state = [dict(lbl)["state"] for (n, lbl), v in m.items()
                     if n == "scout_sys_rank_state" and dict(lbl)["rank"] == "2" and v == 1]
    peer_states = {dict(lbl)["state"] for (n, lbl), v in m.items()
                   if n == "scout_sys_rank_state" and dict(lbl)["rank"] != "2" and v == 1}
    assert culprit_state and culprit_state != ["waiting"] and peer_states == {"waiting"}, (culprit_state, peer_states)
    # the witnesses' main threads have not run since they entered the collective (past --stall-after)
    assert min(_get(m, "scout_sys_rank_main_thread_pause_seconds", rank=r)[0] for r in "013") >= 5
    assert _get(m, "scout_sys_probe_up", probe="procfs") == [1.0]
    if EBPF:  # make test set eBPF up: the probe is up and the witnesses' counts are exported
        assert _get(m, "scout_sys_probe_up", probe="ebpf-collectives") == [1.0]
        assert min(_get(m, "scout_sys_rank_collective_seq", rank=r)[0] for r in "013") > 0

    hook_file = hooks / f"{e['incident']['id']}-{HANG}.json"
    _wait_for(hook_file.exists, timeout=10)
    _wait_for(lambda: hook_file.read_text().endswith("\n"), timeout=5)
    assert hook_file.read_text() == json.dumps(e) + "\n"  # byte for byte the line the stream printed

    job.stop()
    assert w.proc.wait(timeout=30) == 1
    lines = events.read_text().splitlines()
    assert lines == [json.dumps(x) for x in w.events] and len(lines) >= 1
    assert stat.S_IMODE(events.stat().st_mode) == 0o600
    bundle = e["bundle"]
    assert stat.S_IMODE(os.stat(bundle).st_mode) == 0o700
    for name in os.listdir(bundle):
        assert stat.S_IMODE(os.stat(os.path.join(bundle, name)).st_mode) == 0o600, name
    err = w.stderr()
    assert f"scout-sys: hook for {e['incident']['id']} incident_opened: exit 0" in err, err


def test_a_hanging_hook_is_killed_and_a_failing_one_reported_while_the_watch_goes_on(
        start_job, watch_cli, tmp_path) -> None:  # noqa: F811
    job = start_job(4, fault="stop", fault_rank=1, fault_step=100)
    job.wait_steps(1)
    hook = ('case "$SCOUT_SYS_EVENT" in incident_opened) sleep 613;; '
            '*) echo "cannot reach the webhook" >&2; exit 3;; esac')
    w = watch_cli(job.pid, "--stall-after", "5", "--state-dir", str(tmp_path), "--no-ebpf", "--on-incident", hook,
                  "--on-incident-all", "--on-incident-timeout", "2", *AS_ROOT)
    job.wait_fault()
    opened = w.wait_event(lambda e: e["event"] == "incident_opened" and 1 in e["incident"]["ranks"], timeout=40)
    # the opened hook is killed at its 2 s timeout meanwhile; the watch keeps polling
    killed = f"hook for {opened['incident']['id']} incident_opened: killed at its 2 s timeout"
    wait_for(lambda: killed in w.stderr(), 60, "the hanging hook killed")
    os.kill(find_job(str(job.pid)).by_rank()[1].pid, signal.SIGCONT)
    w.wait_event(lambda e: e["event"] == "incident_closed" and e["incident"]["id"] == opened["incident"]["id"],
                 timeout=40)
    w.stop()
    err = w.stderr()
    assert killed in err, err
    assert (f"hook for {opened['incident']['id']} incident_closed: exit 3 in " in err
            and "stderr: cannot reach the webhook" in err), err
    leftovers = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if open(f"/proc/{pid}/cmdline", "rb").read() == b"sleep\x00613\x00":
                leftovers.append(pid)
        except OSError:
            continue
    assert not leftovers, "the hook's process group was not killed"


def test_the_dashboards_polls_feed_the_sinks(start_job, tmp_path) -> None:
    job = start_job(4)
    job.wait_steps(1, timeout=120)
    w = Watcher(str(job.pid), config=WatchConfig(interval=0.5, state_dir=str(tmp_path), ebpf=False))
    prom = PrometheusExporter("127.0.0.1:0", job_name="dash")
    sinks = Sinks([prom, EventsFile(str(tmp_path / "events.jsonl"))], print)
    w.start()
    try:
        sinks.attach(w)
        asyncio.run(_drive(w, prom))
    finally:
        w.close()
        sinks.close()


async def _drive(w: Watcher, prom: PrometheusExporter) -> None:
    app = make_app(w)
    async with app.run_test(size=(120, 40)) as pilot:
        start = prom.collector._polls
        await pilot.pause(2.5)
        assert prom.collector._polls >= start + 2, "the dashboard's polls did not reach the sinks"
    port = int(prom.url.rsplit(":", 1)[1].split("/")[0])
    m = _scrape(port)
    assert sorted(dict(lbl)["rank"] for (n, lbl), v in m.items() if n == "scout_sys_rank_state" and v == 1) == \
        ["0", "1", "2", "3"]
    assert _get(m, "scout_sys_poll_duration_seconds", job="dash")[0] > 0
