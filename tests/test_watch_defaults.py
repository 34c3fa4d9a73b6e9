"""watch at its defaults (no --stall-after) against real jobs: a desync seen in the eBPF fingerprints
is taken to a window at once, not after a stall timer. (Latencies: benchmarks/watch_defaults.py.)"""

from __future__ import annotations

import time

import pytest

from scout_sys.model import ATTRIBUTED, DESYNC
from scout_sys.watch import WatchConfig, Watcher
from scout_sys.watch.hang import DESYNC_SIGNAL

pytestmark = [pytest.mark.slow, pytest.mark.ebpf]


@pytest.mark.serial  # timing: run alone (see tests/README.md)
def test_a_fingerprint_desync_is_confirmed_within_a_poll_or_two_at_the_defaults(start_job, tmp_path):
    from tests._ebpf_jobs import ebpf_skip_reason

    if ebpf_skip_reason():
        pytest.skip(ebpf_skip_reason())
    go = tmp_path / "go"
    job = start_job(4, fault="desync", fault_rank=2, fault_step=3,
                    args=["--step-time", "0.02", "--log-every", "50", "--fault-when", str(go)])
    job.wait_steps(1, timeout=120)
    with Watcher(str(job.pid), config=WatchConfig(state_dir=str(tmp_path), replay=False)) as w:
        w.monitor.wait_started(timeout=120)
        assert w.monitor.probe_status.get("ebpf-collectives") is None, w.monitor.probe_status
        for _ in range(4):
            w.poll()
            time.sleep(0.5)
        go.touch()
        fault = float(job.wait_for(r"SCOUT-DEMO fault .* t=([0-9.]+)", timeout=60).group(1))
        evs, opened_at = [], None
        end = time.time() + 30
        while time.time() < end and opened_at is None:
            new = w.poll()
            evs += new
            if any(e.event == "incident_opened" and e.incident.kind == DESYNC for e in new):
                opened_at = time.time()
            time.sleep(max(0.0, 0.5 - (time.time() % 0.5)))
    opened = [e.incident for e in evs if e.event == "incident_opened"]
    assert [(i.kind, i.status, i.ranks) for i in opened] == [(DESYNC, ATTRIBUTED, (2,))], opened
    trigger = [v.data for v in opened[0].evidence if "trigger" in v.data]
    # the fingerprints raised it, before a strict majority had stalled for stall-after
    assert trigger and trigger[0]["trigger"] == DESYNC_SIGNAL, opened[0].evidence
    print(f"opened {opened_at - fault:.1f} s after the fault")
