"""Many hosts on one machine: a real 2-node torchrun job (static rendezvous, 2 ranks per node), one
real ``scout-sys agent`` per node with its own --host-name, a real c10d store between them, and the
real ``diagnose --cluster`` command line. Every process is stopped by pid at teardown."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from scout_sys.cluster import wire
from scout_sys.cluster.client import ANSWER_GRACE, ClusterClient, to_json
from scout_sys.cluster.store import Store
from scout_sys.demo.launch import free_port
from tests.conftest import origins, scout

HOSTS = ("nodeA", "nodeB")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="agents read the ranks' stacks (py-spy): run as root")]


class Cluster:
    """A 2-node job started with ``start_job`` and its agents."""

    def __init__(self, start_job, tmp_path, **fault) -> None:
        self.tmp = tmp_path
        self.token = tmp_path / "token"
        self.token.write_text(os.urandom(32).hex() + "\n")
        self.token.chmod(0o600)
        port = free_port()
        self.jobs = [start_job(2, nnodes=2, node_rank=k, port=port, **fault) for k in (0, 1)]
        self.store = f"127.0.0.1:{free_port()}"
        self.agents: dict[int, subprocess.Popen] = {}
        self.logs: dict[int, list[str]] = {0: [], 1: []}

    def start_agent(self, k: int) -> None:
        """Node 1's agent takes its node rank from its ranks' GROUP_RANK (--node-rank auto)."""
        log = self.tmp / f"agent{k}-{len(self.logs[k])}.log"
        self.logs[k].append(str(log))
        self.agents[k] = subprocess.Popen(
            [sys.executable, "-m", "scout_sys", "agent", "--job", str(self.jobs[k].pid), "--store", self.store,
             "--nnodes", "2", "--node-rank", "auto" if k else "0", "--token-file", str(self.token), "--host-name", HOSTS[k],
             "--no-ebpf"], stdout=subprocess.DEVNULL, stderr=open(log, "w"))

    def log(self, k: int) -> str:
        return "".join(open(p).read() for p in self.logs[k])

    def wait_log(self, k: int, text: str, timeout: float = 90.0, count: int = 1) -> None:
        end = time.time() + timeout
        while self.log(k).count(text) < count:
            assert self.agents[k].poll() is None, f"agent {k} exited: {self.log(k)}"
            assert time.time() < end, f"agent {k} never said {text!r}: {self.log(k)}"
            time.sleep(0.2)

    def start(self) -> Cluster:
        for k in (0, 1):
            self.start_agent(k)
        self.wait_joined(0)
        self.wait_joined(1)
        return self

    def wait_joined(self, k: int, count: int = 1) -> None:
        """Agent k watches its ranks and is in the store (node 0 hosts it)."""
        self.wait_log(k, "watching 2 ranks", count=count)
        self.wait_log(k, "hosting the store" if k == 0 else "joined the store", count=count)

    def kill_agent(self, k: int) -> None:
        self.agents[k].send_signal(signal.SIGKILL)
        self.agents[k].wait(10)

    def diagnose(self, *extra: str, window: float = 2.0, token: str | None = None,
                 cli: bool = False) -> tuple[int, dict, str]:
        """``diagnose --cluster``: the real command line (``cli``), else its client in this process
        (the same code after argument parsing, without a fresh interpreter importing torch each time)."""
        if not cli:
            host, port = self.store.split(":")
            client = ClusterClient((host, int(port)), wire.read_token(token or str(self.token)))
            try:
                d, cl = client.diagnose(window)
            finally:
                client.close()
            return (0 if d.healthy else 1), to_json(d, cl), ""
        out = scout("diagnose", "--cluster", self.store, "--token-file", token or str(self.token),
                    "--window", str(window), "--json", *extra, timeout=90)
        doc = json.loads(out.stdout) if out.stdout.strip() else {}
        return out.returncode, doc, out.stderr

    def stop(self) -> None:
        for a in self.agents.values():
            if a.poll() is None:
                a.send_signal(signal.SIGTERM)
        for a in self.agents.values():
            try:
                a.wait(15)
            except subprocess.TimeoutExpired:
                a.kill()
                a.wait(5)


@pytest.fixture
def cluster(start_job, tmp_path):
    made: list[Cluster] = []

    def _make(**fault) -> Cluster:
        c = Cluster(start_job, tmp_path, **fault)
        made.append(c)
        return c

    yield _make
    for c in made:
        c.stop()


def _hosts(doc: dict) -> dict[int, str]:
    return {r["rank"]: r["host"] for r in doc["job"]["ranks"]}


def test_hang_on_node_1_is_named_with_global_rank_and_host_and_only_the_token_gets_in(cluster, tmp_path):
    c = cluster(fault="hang", fault_rank=3)
    c.jobs[1].wait_fault(timeout=120)
    c.start()
    saved = tmp_path / "evidence" / "cluster.json"  # the runbook's first command, --cluster form
    rc, doc, err = c.diagnose("--output", str(saved), cli=True)
    assert rc == 1, err
    assert origins(doc) == [("hang", "attributed", [3])]
    assert json.loads(saved.read_text()) == doc and oct(saved.stat().st_mode & 0o777) == "0o600"
    assert doc["incidents"][0]["hosts"] == ["nodeB"]
    assert _hosts(doc) == {0: "nodeA", 1: "nodeA", 2: "nodeB", 3: "nodeB"}
    assert [a["state"] for a in doc["cluster"]["agents"]] == ["answered", "answered"]

    # a wrong token is refused: exit 2, one line, no traceback, nothing leaked
    bad = tmp_path / "bad"
    bad.write_text(os.urandom(32).hex())
    rc, doc, err = c.diagnose(token=str(bad), cli=True)
    assert rc == 2 and doc == {}
    assert len(err.strip().splitlines()) == 1 and "token refused" in err, err

    # forged messages: a request and an answer sealed with another token are ignored and reported
    secret = c.token.read_text().strip()
    host, port = c.store.split(":")
    forger = Store(host, int(port))
    try:
        run = json.loads(forger.get(wire.RUN))  # readable by anyone: the nonce is not a secret
        forger.add(wire.REQS, 1)  # a client that died between counting its request and writing it: skipped
        rid = forger.add(wire.REQS, 1)
        forger.set(wire.req_key(rid), wire.seal(bad.read_bytes(), wire.req_key(rid), run["n"], {"window": 1.0}))
        forger.set(wire.answer_key(rid + 1, 1), wire.seal(bad.read_bytes(), wire.answer_key(rid + 1, 1), run["n"],
                                                          {"node": 1, "host": "evil", "error": "forged"}))
    finally:
        forger.close()
    c.wait_log(0, f"ignored window request #{rid}")
    c.wait_log(1, f"ignored window request #{rid}")
    rc, doc, err = c.diagnose()
    assert rc == 1 and origins(doc) == [("hang", "attributed", [3])], err  # the real answer replaced the forgery
    assert "evil" not in json.dumps(doc["job"]) and "evil" not in json.dumps(doc["incidents"])
    assert any("forged answer for node 1" in n for n in doc["cluster"]["ignored"]), doc["cluster"]
    for k in (0, 1):
        with open(f"/proc/{c.agents[k].pid}/cmdline", "rb") as f:
            assert secret.encode() not in f.read()
        assert secret not in c.log(k)


class Stream:
    """``watch --cluster --json``: its events as they come."""

    def __init__(self, c: Cluster, *extra: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "scout_sys", "watch", "--cluster", c.store, "--token-file",
                                      str(c.token), "--json", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.events: queue.Queue[dict] = queue.Queue()
        threading.Thread(target=lambda: [self.events.put(json.loads(line)) for line in self.proc.stdout],
                         daemon=True).start()
        self.seen: list[dict] = []

    def wait(self, pred, timeout: float = 90.0) -> dict:
        end = time.time() + timeout
        while time.time() < end:
            try:
                e = self.events.get(timeout=0.5)
            except queue.Empty:
                assert self.proc.poll() is None, self.proc.stderr.read()
                continue
            self.seen.append(e)
            if pred(e):
                return e
        raise AssertionError(f"no such event within {timeout} s: {self.seen}")

    def quiet(self, seconds: float) -> list[dict]:
        """The events of the next ``seconds`` (the watch must still run)."""
        end, out = time.time() + seconds, []
        while time.time() < end:
            try:
                out.append(self.events.get(timeout=0.2))
            except queue.Empty:
                assert self.proc.poll() is None, self.proc.stderr.read()
        self.seen += out
        return out

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(15)


def test_stopped_rank_on_node_1_and_an_agent_killed_mid_run(cluster):
    c = cluster(fault="stop", fault_rank=2)
    c.jobs[1].wait_fault(timeout=120)
    c.start()
    rc, doc, err = c.diagnose()
    assert rc == 1, err
    assert origins(doc) == [("process_stall", "attributed", [2])]
    assert doc["incidents"][0]["hosts"] == ["nodeB"]

    w = Stream(c)  # the whole job live
    try:
        e = w.wait(lambda e: e["event"] == "incident_opened")
        assert (e["incident"]["kind"], e["incident"]["ranks"], e["incident"]["hosts"]) == (
            "process_stall", [2], ["nodeB"])
        c.kill_agent(1)  # reported; its ranks are not observed, never blamed; the others go on
        e = w.wait(lambda e: e["event"].startswith("agent_"))
        assert (e["event"], e["node"], e["host"], e["ranks"]) == ("agent_lost", 1, "nodeB", [2, 3])
        t0 = time.time()
        rc, doc, err = c.diagnose()
        # the window, the agents' grace, and a command's start-up on a loaded 2-core machine (torch for
        # the store client): a verdict held by the dead agent would wait for it, far past this
        assert time.time() - t0 < 2.0 + ANSWER_GRACE + 10.0, "a dead agent must not block the verdict"
        assert not any(i["ranks"] for i in doc["incidents"]), doc["incidents"]
        assert {r["rank"] for r in doc["job"]["ranks"]} == {0, 1}
        assert [(u["rank"], u["host"]) for u in doc["cluster"]["not_observed"]] == [(2, "nodeB"), (3, "nodeB")]
        assert doc["cluster"]["agents"][1]["state"] == "no answer"
        assert any("not observed" in n for n in doc["notes"])

        c.start_agent(1)  # it rejoins
        c.wait_joined(1, count=2)
        e = w.wait(lambda e: e["event"].startswith("agent_"))
        assert (e["event"], e["node"]) == ("agent_back", 1)
    finally:
        assert w.stop() == 1
    # the stall stayed open while its ranks were not observed: not closed for want of an agent
    assert not any(e["event"] == "incident_closed" and e["incident"]["ranks"] == [2] for e in w.seen), w.seen
    rc, doc, err = c.diagnose()
    assert rc == 1 and origins(doc) == [("process_stall", "attributed", [2])], err


@pytest.mark.serial  # load-sensitive: run alone (see tests/README.md)
def test_healthy_job_names_nobody_and_agents_survive_the_store_host(cluster):
    c = cluster(fault="none")
    c.jobs[0].wait_steps(2, timeout=120)
    c.start()
    rc, doc, err = c.diagnose()
    assert rc == 0 and doc["incidents"] == [], (err, doc["incidents"])
    assert doc["status"] == "healthy" and len(doc["job"]["ranks"]) == 4
    port = int(c.store.split(":")[1])
    with open("/proc/net/tcp") as f:  # the store listens on the address given, not every interface
        listening = [ln.split()[1] for ln in f.read().splitlines()[1:] if ln.split()[3] == "0A"]
    assert listening.count(f"0100007F:{port:04X}") == 1 and f"00000000:{port:04X}" not in listening

    c.kill_agent(0)  # the store goes with it: the other agent says so once, and retries
    c.wait_log(1, "retrying every")
    time.sleep(3)
    assert c.log(1).count("retrying every") == 1
    c.start_agent(0)
    c.wait_log(1, "rejoined")
    rc, doc, err = c.diagnose()
    assert rc == 0 and doc["incidents"] == [] and len(doc["job"]["ranks"]) == 4, (err, doc)


def test_exit_on_node_1_is_named_with_its_host(cluster):
    c = cluster(fault="exit", fault_rank=3, torchrun_args=["--monitor-interval", "600"])
    c.jobs[1].wait_fault(timeout=120)
    c.start()
    rc, doc, err = c.diagnose()
    assert rc == 1, err
    assert origins(doc) == [("process_exit", "attributed", [3])]
    assert doc["incidents"][0]["hosts"] == ["nodeB"]
    assert "exited with code 3" in doc["incidents"][0]["summary"]
