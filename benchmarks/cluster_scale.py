"""The whole-job verdict across hosts: simulated agents on loopback, then synthetic signatures at scale.

1. **64 agents x 8 ranks on loopback** (``--agents``, ``--ranks-per-agent``): a real c10d TCPStore
   hosted by a leader agent in its own process, 63 more agents (threads of this process, each with
   its own store connection) running the real agent loop (heartbeats, requests, sealed answers) over
   synthetic ranks — one of which, on agent 37, is stuck outside the collective the others wait in.
   Reports the time from request to whole-job verdict beyond the window (target: the single-host
   answer time plus 2 s, see diagnose_latency.py), store traffic per poll and per window, and the
   leader process's CPU.
2. **1k / 8k / 64k ranks** (``--sizes``): the client's side alone — decode the agents' answers
   (activities as JSON) and run the whole-job consensus (cluster.merge.decide). Target: a 64k-rank
   verdict within 1 s of consensus time.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.consensus_scale import T0, observations  # noqa: E402
from scout_sys.cluster import answer, heartbeat, wire  # noqa: E402
from scout_sys.cluster.agent import Agent, AgentConfig  # noqa: E402
from scout_sys.cluster.answer import Answer  # noqa: E402
from scout_sys.cluster.merge import ANSWERED, AgentState, decide, merge_job  # noqa: E402
from scout_sys.consensus import hang  # noqa: E402
from scout_sys.model import Activity, Job, ProcSample, Rank, StackSample  # noqa: E402
from scout_sys.watch.config import WatchConfig  # noqa: E402

HUNG_AGENT = 37  # of 64 (fewer agents: the last one)


class SimAgent(Agent):
    """The real agent loop over synthetic ranks (no processes to probe): counts the bytes it stores."""

    def __init__(self, store: tuple[str, int], *, nnodes: int, node_rank: int, host_name: str, token: bytes,
                 per: int) -> None:
        super().__init__("sim", AgentConfig(store, nnodes, node_rank, host_name, watch=WatchConfig(ebpf=False)),
                         token=token, say=lambda _t: None)
        self.per = per
        self.sent = {"hb": [0, 0], "win": [0, 0]}  # kind -> [values, bytes]

    def _ensure_job(self) -> None:
        if self.job is None:
            base = self.node * self.per
            self.job = Job(ranks=tuple(Rank(rank=base + i, pid=1000 + base + i, host=self.name, local_rank=i)
                                       for i in range(self.per)), world_size=self.per * self.nnodes,
                           launcher="sim", launcher_pid=None, host=self.name)

    def _beats(self, now: float) -> dict[str, Any]:
        """What a real agent's heartbeat carries for ranks of an 8-GPU host in the GPU shape: running,
        seen progressing by eBPF's sequence numbers on two process groups, a step time, two places."""
        assert self.job is not None
        return heartbeat.encode_ranks(
            heartbeat.RankBeat(rank=r.rank, pid=r.pid, state="running", stall=0.4, signal="collectives",
                               where=f"train.py:{151 if r.local_rank % 4 else 78} "
                                     + ("wait_for_buckets (in distributed_c10d.py:3012 is_completed)"
                                        if r.local_rank % 4 else "load_next_batch"),
                               stack="0a1b2c3d" if r.local_rank % 4 else "ffee0011",
                               seqs=(("nccl:0", 120_345), ("nccl:1", 4_012)), step=0.3125)
            for r in self.job.ranks)

    def _window(self, window: float) -> dict[str, Any]:
        assert self.job is not None
        t0 = self.clock()
        time.sleep(window)
        hung = self.job.ranks[3].rank if self.node == min(HUNG_AGENT, self.nnodes - 1) else None
        obs = [o for o in observations(self.job.ranks[-1].rank + 1, idle=hung) if o.rank in self.job.by_rank()]
        acts = hang.activities(self.job, obs)
        return answer.encode(Answer(node=self.node, host=self.name, job=self.job, acts=acts, window=(t0, self.clock())))

    def _connect(self) -> None:
        fresh = self.store is None
        super()._connect()
        if fresh and self.store is not None:
            real_set = self.store.set

            def counted(key: str, value: bytes) -> None:
                kind = "hb" if "/hb/" in key else "win" if "/win/" in key else None
                if kind:
                    self.sent[kind][0] += 1
                    self.sent[kind][1] += len(value)
                real_set(key, value)

            self.store.set = counted  # type: ignore[method-assign]


def _leader(port: int, token_file: str, agents: int, per: int) -> int:
    """The leader agent (node 0: hosts the store) in its own process, so its CPU can be read."""
    a = SimAgent(("127.0.0.1", port), nnodes=agents, node_rank=0, token=wire.read_token(token_file),
                 host_name="sim0", per=per)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()  # stdin closed: stop
    return a.run(stop)


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loopback(agents: int, per: int, window: float, runs: int) -> bool:
    from scout_sys.cluster.client import ClusterClient
    from scout_sys.demo.launch import free_port

    port = free_port()
    with tempfile.NamedTemporaryFile("w", delete=False) as f:
        f.write(os.urandom(32).hex())
        token_file = f.name
    leader = subprocess.Popen([sys.executable, __file__, "--leader", str(port), token_file, str(agents), str(per)],
                              stdin=subprocess.PIPE)
    stop = threading.Event()
    sims: list[SimAgent] = []
    threads = []
    try:
        token = wire.read_token(token_file)
        time.sleep(1.0)
        for k in range(1, agents):
            s = SimAgent(("127.0.0.1", port), nnodes=agents, node_rank=k, token=token, host_name=f"sim{k}", per=per)
            sims.append(s)
            threads.append(threading.Thread(target=s.run, args=(stop,), daemon=True))
            threads[-1].start()
        client = None
        end = time.time() + 60
        while client is None:
            try:
                client = ClusterClient(("127.0.0.1", port), token)
            except Exception:  # noqa: BLE001 - the leader is still starting
                if time.time() > end:
                    raise
                time.sleep(0.5)
        while sum(1 for hb, _ in client.heartbeats().values() if hb) < agents and time.time() < end:
            time.sleep(0.5)
        cpu0, t0 = _cpu(leader.pid), time.time()
        extra, ok = [], True
        for _ in range(runs):
            t = time.time()
            d, cl = client.diagnose(window)
            extra.append(time.time() - t - window)
            named = [(i.kind, i.ranks) for i in d.incidents]
            ok &= named == [("hang", (min(HUNG_AGENT, agents - 1) * per + 3,))] and \
                all(a["state"] == ANSWERED for a in cl["agents"])
        busy, wall = _cpu(leader.pid) - cpu0, time.time() - t0
        client.close()
        hb = [s.sent["hb"] for s in sims]
        win = [s.sent["win"] for s in sims]
        hb_bytes = sum(b for _, b in hb) / max(1, sum(n for n, _ in hb))
        win_bytes = sum(b for _, b in win) / max(1, sum(n for n, _ in win))
        print(f"loopback {agents} agents x {per} ranks: whole-job verdict {statistics.median(extra):.2f} s beyond the "
              f"{window:g} s window (median of {runs}, max {max(extra):.2f} s){'' if ok else '  WRONG VERDICT'}")
        print(f"loopback store traffic: heartbeat {hb_bytes:.0f} B per agent per poll "
              f"({hb_bytes / per:.0f} B per rank; {agents * hb_bytes / 1024:.1f} KiB per poll for the job); "
              f"window answer {win_bytes / 1024:.1f} KiB per agent ({win_bytes / per / 1024:.2f} KiB per rank)")
        print(f"loopback leader CPU (store host + its own agent): {100 * busy / wall:.1f}% of one core over "
              f"{wall:.1f} s with {agents - 1} agents polling every 0.2 s and {runs} windows")
        return ok
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        leader.stdin.close()  # type: ignore[union-attr]
        try:
            leader.wait(15)
        except subprocess.TimeoutExpired:
            leader.kill()
        os.unlink(token_file)


class MemStore:
    """Sealed values in memory, read as the client reads the store (no network: the client's CPU alone)."""

    def __init__(self, values: dict[str, bytes]) -> None:
        self.values = values

    def get(self, key: str) -> bytes | None:
        return self.values.get(key)


def synthetic(sizes: list[int], per: int) -> bool:
    from scout_sys.cluster.client import ClusterClient, gc_paused
    from scout_sys.cluster.watch import ClusterWatcher

    def one(obs: list[Any]) -> Activity:
        return hang.summarize(0, [o for o in obs if isinstance(o, ProcSample)],
                              [o for o in obs if isinstance(o, StackSample)])

    token, nonce = os.urandom(32), "0" * 32
    idle, wait = one(observations(1, idle=0)), one(observations(1))
    ok = True
    for n in sizes:
        raws, beats = {}, {}
        for k in range(n // per):
            ranks = range(k * per, (k + 1) * per)
            job = Job(ranks=tuple(Rank(rank=r, pid=1000 + r, host=f"h{k}", local_rank=r - ranks.start) for r in ranks),
                      world_size=n, launcher="sim", launcher_pid=None, host=f"h{k}")
            acts = [replace(idle if r == n // 3 else wait, rank=r, pid=1000 + r) for r in ranks]
            key = wire.answer_key(1, k)
            body = answer.encode(Answer(node=k, host=f"h{k}", job=job, acts={a.rank: a for a in acts},
                                        window=(T0, T0 + 2)))
            raws[key] = wire.seal(token, key, nonce, {**body, "id": 1})
            sim = SimAgent(("127.0.0.1", 1), nnodes=n // per, node_rank=k, token=token, host_name=f"h{k}", per=per)
            sim.job = job
            beats[wire.hb_key(k)] = wire.seal(token, wire.hb_key(k), nonce, {"node": k, "host": f"h{k}", "time": T0,
                                                                            "seq": 1, **sim._beats(T0)})
        t = time.process_time()
        with gc_paused():  # as the client decodes them
            bodies = {k: wire.unseal(token, wire.answer_key(1, k), raws[wire.answer_key(1, k)], nonce)
                      for k in range(n // per)}
            t_verify = time.process_time() - t
            answers = [answer.decode(b, k) for k, b in bodies.items()]
            t_parse = time.process_time() - t - t_verify
            t = time.process_time()
            d, _ = decide(answers, [AgentState(a.node, a.host, ANSWERED) for a in answers], world_size=n,
                          source="sim", now=T0 + 3)
            t_decide = time.process_time() - t
        t = time.process_time()
        gc.collect()  # what pausing the collector deferred, paid here
        t_gc = time.process_time() - t
        job, acts = merge_job(answers, n, "sim"), {r: a for x in answers for r, a in x.acts.items()}
        t = time.process_time()
        hang.analyze_activities(job, acts, window=(T0, T0 + 2))
        t_rules = time.process_time() - t
        right = [(i.kind, i.ranks) for i in d.incidents] == [("hang", (n // 3,))]
        ok &= right
        size = sum(map(len, raws.values())) / n
        print(f"whole-job {n:>6} ranks from {n // per} agents: answers {size:.0f} B a rank (sealed); verify them "
              f"{t_verify:.3f} CPU s, decode {t_parse:.3f} CPU s; verdict "
              f"{t_decide:.3f} CPU s ({1e6 * t_decide / n:.1f} us/rank); the collection the pause deferred "
              f"{t_gc:.3f} s; total {t_verify + t_parse + t_decide + t_gc:.3f} CPU s. The hang rules alone "
              f"{t_rules:.3f} s{'' if right else '  WRONG VERDICT'}",
              flush=True)

        # watch --cluster's steady poll: read every heartbeat, the majority's stall, HangWatch
        client = ClusterClient.__new__(ClusterClient)
        client.token, client.nonce, client.nnodes, client.source = token, nonce, n // per, "sim"
        client.store = MemStore(beats)  # type: ignore[assignment]
        clock = [T0]
        w = ClusterWatcher(lambda c=client: c, clock=lambda c=clock: c[0])
        w.poll()
        clock[0] += 1.0
        t = time.process_time()
        w.poll()
        t_poll = time.process_time() - t
        hb = sum(map(len, beats.values())) / n
        print(f"watch --cluster at {n:>6} ranks: heartbeats {hb:.0f} B a rank (sealed, {hb * n / 1024:.0f} KiB a "
              f"poll for the job); one poll (verify + decode + suspicion) {t_poll:.3f} CPU s", flush=True)
    return ok


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--leader":
        return _leader(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=64)
    ap.add_argument("--ranks-per-agent", type=int, default=8)
    ap.add_argument("--window", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes", default="1024,8192,65536")
    a = ap.parse_args()
    ok = synthetic([int(x) for x in a.sizes.split(",")], a.ranks_per_agent)
    ok &= loopback(a.agents, a.ranks_per_agent, a.window, a.runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
