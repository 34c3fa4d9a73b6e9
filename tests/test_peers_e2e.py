"""Peer groups learned without a flag, on a real job: Megatron-Core dp=2 x tp=2 (tests/jobs/megatron_job.py,
no layout on its command line). The process groups learned from the ranks' connections give the peer groups
(consensus/peers.py): the report carries them with each rank's coordinates, and a rank that computes more than
the others every step is named a straggler against the ranks that do the same work (with groups of two replicas alone,
nobody could be outvoted), by diagnose and by watch."""

from __future__ import annotations

import json
import os

import pytest

from scout_sys.consensus import peers
from scout_sys.consensus.peers import LEARNED
from scout_sys.model import STRAGGLER
from scout_sys.watch import WatchConfig, Watcher
from tests.conftest import JOBS, origins, scout
from tests.test_watch import _poll_until

pytestmark = pytest.mark.slow
MEGATRON = os.path.join(JOBS, "megatron_job.py")


def test_megatron_straggler_named_against_learned_peers(start_job, tmp_path):
    job = start_job(4, script=MEGATRON, args=["--fault", "slow", "--fault-rank", "1", "--slow-seconds", "0.2",
                                                     "--step-sleep", "0"])
    job.wait_for(r"MEGATRON fault slow rank=1", timeout=150)
    out = scout("diagnose", "--job", str(job.pid), "--window", "4", "--json", timeout=90)
    assert out.stdout.strip(), out.stderr
    d = json.loads(out.stdout)
    assert d["job"]["layout"].startswith(LEARNED) and "dp=2,tp=2" in d["job"]["layout"], d["job"]
    assert d["job"]["peer_groups"] == [[0, 2], [1, 3]]
    assert {r["rank"]: r["coords"] for r in d["job"]["ranks"]}[1] == {"dp": 0, "tp": 1}
    assert origins(d) == [("straggler", "attributed", [1])], (d["incidents"], d["notes"])
    compared = [e for e in d["incidents"][0]["evidence"] if "peers" in e]
    assert compared and compared[0]["peers"] == [0, 2, 3], d["incidents"][0]["evidence"]
    # the watch, the same way: its peers learned at its first process-group sample, then 3 windows in a row
    with Watcher(str(job.pid), config=WatchConfig(ebpf=False, replay=False, state_dir=str(tmp_path))) as w:
        evs = _poll_until(w, lambda e: e.event == "incident_opened" and e.incident.kind == STRAGGLER, timeout=60)
        assert w.job is not None and peers.is_learned(w.job) and w.job.peer_groups == ((0, 2), (1, 3))
        assert w.snapshot is not None and peers.is_learned(w.snapshot.job)  # what the dashboard draws
    opened = [e.incident for e in evs if e.event == "incident_opened"]
    assert [(i.kind, i.ranks) for i in opened] == [(STRAGGLER, (1,))], [(i.summary, [e.text for e in i.evidence])
                                                                         for i in opened]
    assert any(e.data.get("peers") == [0, 2, 3] for e in opened[0].evidence), opened[0].evidence
