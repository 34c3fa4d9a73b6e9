"""``scout-sys agent``: one per host. Watches this host's ranks, talks to the others through the store.

Node rank 0 hosts the store and writes the run record (a random nonce, sealed with the token). Every
agent then, each poll:

- samples its ranks as ``watch`` does each poll (cluster/beat.py: /proc, eBPF, a rotating stack
  sample, the same progress signals) and publishes a heartbeat: a sealed key with its time, its host
  name and one compact entry per rank (heartbeat.RankBeat: state, main-thread pause, seconds since last
  seen progressing and by which signal, place and stack hash, collective sequence numbers, step
  time) — bytes per rank, not stacks;
- looks for window requests (``diagnose --cluster``): it samples its ranks for the window with the
  same Monitor as ``diagnose`` and publishes their activities (``model.Activity``: state,
  place, collective, the main stack) and the records other hosts need (:func:`wire.shareable`).

A request that does not verify is ignored and reported (one line, and counted in the heartbeat). The
store going away is said in one line; the agent retries until it is back, then says it rejoined.
"""

from __future__ import annotations

import secrets
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from scout_sys.cluster import answer, heartbeat, wire
from scout_sys.cluster.answer import Answer
from scout_sys.cluster.beat import LocalWatch
from scout_sys.cluster.store import Store
from scout_sys.errors import BadToken, ScoutError, StoreUnreachable
from scout_sys.model import Job, ProcSample
from scout_sys.watch.config import WatchConfig
from scout_sys.watch.restart import GRACE

HEARTBEAT_EVERY = 1.0
POLL = 0.2
RETRY_EVERY = 2.0
REQUEST_MAX_AGE = 30.0  # seconds: older requests (e.g. seen after a restart) are not answered
MAX_WINDOW = 60.0
MAX_PENDING = 64  # requests looked at per poll, newest first
GAP_WAIT = 2.0  # seconds a counted request may take to appear
FIND_EVERY = 2.0  # seconds between two searches for the job's ranks (a /proc scan) while there are none


def _say(text: str) -> None:
    print(f"scout-sys agent: {text}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class AgentConfig:
    """Where an agent stands, built once from the command line: ``store``: node 0's store (HOST, PORT);
    ``nnodes``: how many agents; ``node_rank``: this one's (None: the node rank of this host's ranks,
    torchrun's GROUP_RANK, once found); ``host_name``: the name it reports; ``listen``: the address the
    leader binds when others reach it by another one (behind a Kubernetes Service: the pod's address, or
    0.0.0.0), default the store's host; ``watch``: the watch's settings the agent reads (ebpf, topology)."""

    store: tuple[str, int]
    nnodes: int
    node_rank: int | None
    host_name: str
    listen: str | None = None
    watch: WatchConfig = field(default_factory=WatchConfig)


class Agent:
    def __init__(self, selector: str, cfg: AgentConfig, *, token: bytes,
                 say: Callable[[str], None] = _say, clock: Callable[[], float] = time.time) -> None:
        """``cfg``: where the agent stands, built once from the command line (:class:`AgentConfig`)."""
        self.agent_config = cfg
        store, nnodes, node_rank = cfg.store, cfg.nnodes, cfg.node_rank
        if nnodes < 1 or (node_rank is not None and not 0 <= node_rank < nnodes):
            raise ScoutError(f"--node-rank {node_rank} is not within --nnodes {nnodes}")
        self.selector, self.host, self.port = selector, store[0], store[1]
        self.listen = cfg.listen or self.host
        self.nnodes, self.node = nnodes, node_rank
        self.token, self.name = token, cfg.host_name
        self.config = cfg.watch  # the watch's settings (ebpf, topology)
        self.say, self.clock = say, clock
        self.store: Store | None = None
        self.nonce: str | None = None
        self.job: Job | None = None
        self.monitor: Any = None
        self.job_error: str | None = None
        self._seq = 0
        self._last_req = 0
        self._last_hb = 0.0
        self._forged = 0
        self._lost = False  # the store is unreachable and we said so
        self._joined = False  # we have been in this store's run before (a later join is a rejoin)
        self._procs: list[ProcSample] | None = None  # the last heartbeat's /proc samples
        self._gap: dict[int, float] = {}  # request id -> when we first found it counted but not written
        self._last_find = -FIND_EVERY
        self._partial_since: float | None = None  # since when some but not all ranks are there
        self.local = LocalWatch(HEARTBEAT_EVERY)

    # ------------------------------------------------------------------ store and run record
    def _connect(self) -> None:
        if self.store is not None:
            return
        if self.node == 0:
            self.store = Store(self.listen, self.port, serve=True)
            self.nonce = secrets.token_hex(16)
            self.store.set(wire.RUN, self._run_record())
            self.say(f"hosting the store on {self.listen}:{self.port} for {self.nnodes} nodes")
        else:
            store = Store(self.host, self.port)
            raw = store.get(wire.RUN)
            if raw is None:
                store.close()
                raise StoreUnreachable(f"store {self.host}:{self.port} has no run record yet (leader starting)")
            try:
                body = wire.unseal(self.token, wire.RUN, raw)
            except wire.Forged:
                store.close()
                raise BadToken(f"the run record at {self.host}:{self.port} does not verify with this token "
                               "(wrong --token-file, or another job's store)") from None
            self.store, self.nonce = store, body["nonce"]
        self._last_req = self.store.add(wire.REQS, 0)  # answer what comes from now on
        if self._lost and self._joined:
            self.say(f"store {self.host}:{self.port} is back: rejoined (run {self.nonce[:8]})")
        elif self.node != 0:
            # the first join, even after waiting for a leader that was still starting
            self.say(f"joined the store at {self.host}:{self.port} as node {self.node} (run {self.nonce[:8]})")
        self._lost, self._joined = False, True

    def _run_record(self) -> bytes:
        assert self.nonce is not None
        return wire.seal(self.token, wire.RUN, self.nonce, {"nnodes": self.nnodes, "time": self.clock(),
                                                              "store": f"{self.host}:{self.port}"})

    def _check_run(self) -> None:
        """Followers: a new leader (a new nonce) means a new run; rejoin it. Leader: restore a run
        record that someone overwrote."""
        assert self.store is not None
        raw = self.store.get(wire.RUN)
        try:
            if raw is None:
                raise wire.Forged("run record deleted")
            body = wire.unseal(self.token, wire.RUN, raw)
        except wire.Forged as e:
            self._forged += 1
            self.say(f"ignored a run record that does not verify ({e}); "
                     + ("restored ours" if self.node == 0 else "keeping run " + str(self.nonce)[:8]))
            if self.node == 0:
                self.store.set(wire.RUN, self._run_record())
            return
        if body["nonce"] != self.nonce and self.node != 0:
            self.say(f"the store has a new run ({body['nonce'][:8]}): the leader restarted; rejoined")
            self.nonce = body["nonce"]
            self._last_req = self.store.add(wire.REQS, 0)

    # ------------------------------------------------------------------ the local job
    def _ensure_job(self) -> None:
        """Find (or find again, after a restart of the job) this host's ranks."""
        settled = self.job is not None and not self._all_gone() and not self.job.missing
        if settled or self.clock() - self._last_find < FIND_EVERY:
            return
        self._last_find = self.clock()
        from scout_sys.job import find_job
        from scout_sys.monitor import Monitor, default_probes

        try:
            job = find_job(self.selector, self.config.topology)
        except ScoutError as e:
            if self.job is None and self.job_error != str(e):
                self.say(f"no ranks to watch yet: {e}")
            self.job_error = str(e) if self.job is None else self.job_error
            return
        job = replace(job, host=self.name, ranks=tuple(replace(r, host=self.name) for r in job.ranks))
        if self.job is not None and {r.pid for r in job.ranks} == {r.pid for r in self.job.ranks}:
            return  # the same processes (dead ones are reported as exited)
        # Started with the job (before its launcher forked every rank): wait for this host's
        # LOCAL_WORLD_SIZE ranks, as `watch` does, for up to GRACE seconds after the first one; and a
        # job bound with ranks missing is bound again when they appear.
        self._partial_since = self._partial_since if self._partial_since is not None else self.clock()
        if job.missing and self.job is None and self.clock() - self._partial_since < GRACE:
            return
        self._partial_since = None
        if self.monitor is not None:
            self.monitor.close()
        self.job, self.job_error = job, None
        self.local.forget()
        self.monitor = Monitor(job, extra_probes=default_probes(self.config.ebpf))
        self.monitor.start()
        self.say(f"watching {len(job.ranks)} ranks ({', '.join(str(r.rank) for r in job.ranks)}) of "
                 f"{job.world_size} as {self.name}")

    def _node_rank_of_job(self) -> int | None:
        if self.job is None:
            return None
        found = {r.group_rank for r in self.job.ranks if r.group_rank is not None}  # a zombie has none
        if len(found) != 1:
            raise ScoutError("--node-rank auto: the ranks on this host carry no single GROUP_RANK "
                             f"({sorted(map(str, found))}); give --node-rank K")
        k = found.pop()
        assert k is not None
        if not 0 <= k < self.nnodes:
            raise ScoutError(f"--node-rank auto: GROUP_RANK {k} is not within --nnodes {self.nnodes}")
        self.say(f"node rank {k} (GROUP_RANK of this host's ranks)")
        return k

    def _all_gone(self) -> bool:
        return self._procs is not None and bool(self._procs) and all(not p.alive for p in self._procs)

    # ------------------------------------------------------------------ each poll
    def poll(self) -> None:
        if self.node is None:  # --node-rank auto: the job's node rank on this host decides
            self._ensure_job()
            self.node = self._node_rank_of_job()
            if self.node is None:
                return
        self._connect()
        self._ensure_job()
        now = self.clock()
        if now - self._last_hb >= HEARTBEAT_EVERY:
            self._check_run()
            self._heartbeat(now)
        self._serve()

    def _heartbeat(self, now: float, busy_for: float = 0.0) -> None:
        """``busy_for``: seconds of a window about to start, during which no heartbeat comes."""
        assert self.store is not None and self.nonce is not None
        self._last_hb = now
        self._seq += 1
        assert self.node is not None
        body = heartbeat.encode(heartbeat.Heartbeat(
            node=self.node, host=self.name, time=now, seq=self._seq, body=self._beats(now),
            world_size=self.job.world_size if self.job else None, error=self.job_error, forged=self._forged,
            busy_for=busy_for, missing=self.job.missing if self.job else (),
            settling=bool(self.monitor is not None and self.monitor.settling)))
        self.store.set(wire.hb_key(self.node), wire.seal(self.token, wire.hb_key(self.node), self.nonce, body))

    def _beats(self, now: float) -> dict[str, Any]:
        """The heartbeat's per-rank part (heartbeat.encode_ranks): one cheap sample of the ranks, as a
        poll of ``watch`` takes it, and what it says of each rank."""
        if self.monitor is None:
            return heartbeat.encode_ranks(())
        self._procs = self.local.sample(self.monitor, now)
        return heartbeat.encode_ranks(self.local.beats(self._procs, now))

    def _serve(self) -> None:
        """Answer the window requests that arrived since the last poll (one window answers all)."""
        assert self.store is not None and self.nonce is not None
        top = self.store.add(wire.REQS, 0)
        pending: list[tuple[int, float]] = []
        rid = max(self._last_req, top - MAX_PENDING)  # a counter pushed far ahead (by anyone) costs little
        while rid < top:
            raw = self.store.get(wire.req_key(rid + 1))
            if raw is None:  # counted but not written yet: wait a little, then skip (its client died)
                if self.clock() - self._gap.setdefault(rid + 1, self.clock()) < GAP_WAIT:
                    break
                rid += 1
                continue
            rid += 1
            try:
                body = wire.unseal(self.token, wire.req_key(rid), raw, self.nonce)
            except wire.Stale:
                continue
            except wire.Forged as e:
                self._forged += 1
                self.say(f"ignored window request #{rid}: {e} (forged, or sent with another token)")
                continue
            window = float(body.get("window", 0.0))
            if 0 < window <= MAX_WINDOW and abs(self.clock() - float(body.get("time", 0.0))) <= REQUEST_MAX_AGE:
                pending.append((rid, window))
        self._last_req = rid
        self._gap = {k: v for k, v in self._gap.items() if k > rid}
        if pending:
            window = max(w for _, w in pending)
            self._heartbeat(self.clock(), busy_for=window)  # watchers: silent for the window, not lost
            reply = self._window(window)
            for r, _ in pending:
                key = wire.answer_key(r, self.node)
                self.store.set(key, wire.seal(self.token, key, self.nonce, {**reply, "id": r}))

    def _window(self, window: float) -> dict[str, Any]:
        """One window of this host's ranks, as the Monitor of ``diagnose`` samples it: the answer's body."""
        from scout_sys.consensus import hang
        from scout_sys.probes.pystack import check_access

        assert self.node is not None
        if self.monitor is None or self.job is None:
            return answer.encode(Answer(node=self.node, host=self.name, job=None,
                                        error=self.job_error or "no ranks found yet"))
        t0 = self.clock()
        obs = self.monitor.collect(window)
        t1 = self.clock()
        self.local.window(obs, t1)
        try:
            check_access(obs)
        except ScoutError as e:
            return answer.encode(Answer(node=self.node, host=self.name, job=None, error=str(e)))
        probes = {k: ("not attached within the window" if v == "starting" else v)
                  for k, v in self.monitor.probe_status.items()}
        return answer.encode(Answer(node=self.node, host=self.name, job=self.job, acts=hang.activities(self.job, obs),
                                    records=tuple(wire.shareable(self.local.records())), probes=probes,
                                    window=(t0, t1)))

    # ------------------------------------------------------------------ the loop
    def run(self, stop: threading.Event) -> int:
        """Until ``stop``: poll; when the store is unreachable say so once and retry."""
        try:
            while not stop.is_set():
                try:
                    self.poll()
                except StoreUnreachable as e:
                    if self.node == 0 and self.store is None:
                        raise  # the leader cannot host its store: a configuration error
                    self._drop_store()
                    if not self._lost:
                        self.say(f"{e}; retrying every {RETRY_EVERY:g} s")
                        self._lost = True
                    stop.wait(RETRY_EVERY)
                    continue
                stop.wait(POLL)
        finally:
            self.close()
        return 0

    def _drop_store(self) -> None:
        if self.store is not None:
            self.store.close()
        self.store = None

    def close(self) -> None:
        self._drop_store()
        if self.monitor is not None:
            self.monitor.close()
            self.monitor = None

