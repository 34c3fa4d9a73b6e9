"""The GPU shape across hosts, on real processes: a 2-node torchrun job (static rendezvous, 2 ranks a
node) whose ranks reduce asynchronously and spin while they wait (demo ``--sync spin``: every rank
running, no collective frame, main threads never asleep), one real agent per node (no eBPF: the
rotating stack sample is the progress signal), and the real ``watch --cluster --headless --json``.
A watch that read main-thread pauses alone never suspects this shape."""

from __future__ import annotations

import os
import time

import pytest

from scout_sys.cluster import wire
from scout_sys.cluster.client import ClusterClient
from scout_sys.cluster.heartbeat import RankBeat
from scout_sys.watch.progress import MAIN_THREAD, STACK
from tests.test_cluster import Stream, cluster  # noqa: F401 - the fixture

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="agents read the ranks' stacks (py-spy): run as root")]


def _beats(c, pred, timeout: float = 60.0) -> dict[int, RankBeat]:
    """The ranks' beats as the agents publish them, once ``pred`` holds."""
    host, port = c.store.split(":")
    client = ClusterClient((host, int(port)), wire.read_token(str(c.token)))
    try:
        end = time.time() + timeout
        while True:
            beats = {b.rank: b for hb, _ in client.heartbeats().values() if hb for b in hb.beats}
            if pred(beats):
                return beats
            assert time.time() < end, f"heartbeats never showed it: {beats}"
            time.sleep(0.5)
    finally:
        client.close()


def test_spinning_hang_on_node_1_is_named_by_watch_cluster_and_a_healthy_stretch_names_nobody(cluster, tmp_path):  # noqa: F811
    go = tmp_path / "go"
    c = cluster(fault="hang", fault_rank=3, args=["--sync", "spin", "--fault-when", str(go)])
    c.start()  # the agents wait for their ranks, as when started beside the job
    w = Stream(c, "--headless", "--stall-after", "4")
    try:
        # every rank's beat says where its latest stack sample was, and how long since it progressed
        beats = _beats(c, lambda bs: len(bs) == 4 and all(b.stack and b.where for b in bs.values()))
        assert all(not b.dead and b.stall < 30 for b in beats.values()), beats
        assert w.quiet(6.0) == []  # healthy, spinning: nobody named (1.5x the stall-after)
        go.touch()
        c.jobs[1].wait_fault(timeout=60)
        e = w.wait(lambda e: e["event"] == "incident_opened", timeout=60)
        inc = e["incident"]
        assert (inc["kind"], inc["status"], inc["ranks"], inc["hosts"]) == ("hang", "attributed", [3], ["nodeB"]), inc
        trigger = [x for x in inc["evidence"] if "trigger" in x]
        # the spinners stopped blocking (their voluntary switches stood still) or their stacks stood still
        assert trigger and trigger[0]["trigger"] in (MAIN_THREAD, STACK), inc["evidence"]
        # its beat says so too: stuck at one place past the stall-after (counted from its first stack sample
        # there, read in turn with its host's other rank, so it may trail the witnesses' by a rotation)
        stuck = _beats(c, lambda bs: "load_next_batch" in bs[3].where and bs[3].stall >= 4.0, timeout=30)[3]
        assert stuck.signal == STACK and not stuck.dead, stuck
    finally:
        assert w.stop() == 1
