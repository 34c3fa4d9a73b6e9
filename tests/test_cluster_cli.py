"""The cluster verbs' usage errors: one line on stderr, exit 2, never a traceback, never the token."""

from __future__ import annotations

import os
import time

import pytest

from scout_sys.demo.launch import free_port
from tests.conftest import scout


def _one_line(out) -> str:
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
    return out.stderr


@pytest.mark.torch  # the store client: the cluster extra
def test_no_store_there(tmp_path):
    token = tmp_path / "t"
    token.write_text(os.urandom(32).hex())
    err = _one_line(scout("diagnose", "--cluster", f"127.0.0.1:{free_port()}", "--token-file", str(token),
                          "--window", "1"))
    assert "cannot reach the scout-sys store" in err and token.read_text() not in err


@pytest.mark.torch  # the store client: the cluster extra
def test_token_file_problems_and_bad_addresses(tmp_path):
    assert "cannot read --token-file" in _one_line(scout("diagnose", "--cluster", "h:1", "--token-file",
                                                         str(tmp_path / "none")))
    (tmp_path / "short").write_text("secret\n")
    err = _one_line(scout("watch", "--cluster", "h:1", "--token-file", str(tmp_path / "short")))
    assert "too short" in err and "secret" not in err
    assert "HOST:PORT" in _one_line(scout("diagnose", "--cluster", "nohostport", "--token-file", "x"))
    assert "--token-file" in _one_line(scout("diagnose", "--cluster", "h:1"))
    (tmp_path / "good").write_text(os.urandom(32).hex())
    assert "not within --nnodes" in _one_line(scout("agent", "--job", "1", "--store", "127.0.0.1:1", "--nnodes", "2",
                                                    "--node-rank", "2", "--token-file", str(tmp_path / "good")))


@pytest.mark.torch  # the store client: the cluster extra
def test_an_agent_started_before_its_leader_joins_and_never_says_rejoined():
    """srun starts every host's agent at once: a follower may reach the store before the leader wrote
    the run record. It waits, then *joins*; "rejoined" is only for a store that came back."""
    import threading

    from scout_sys.cluster import wire
    from scout_sys.cluster.agent import Agent, AgentConfig
    from scout_sys.cluster.store import Store
    from scout_sys.watch.config import WatchConfig

    port, token = free_port(), os.urandom(32)
    server = Store("127.0.0.1", port, serve=True)  # the leader's store, before its run record
    said: list[str] = []
    agent = Agent("999999999", AgentConfig(("127.0.0.1", port), nnodes=2, node_rank=1, host_name="b",
                                           watch=WatchConfig(ebpf=False)), token=token, say=said.append)
    stop = threading.Event()
    t = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 20
        while not any("no run record yet" in s for s in said) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any("no run record yet" in s for s in said), said
        server.set(wire.RUN, wire.seal(token, wire.RUN, "ab" * 16, {"nnodes": 2, "time": time.time(),
                                                                      "store": f"127.0.0.1:{port}"}))
        while not any("joined the store" in s for s in said) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(s.startswith("joined the store at 127.0.0.1") and "as node 1 (run abababab)" in s
                   for s in said), said
        assert not any("rejoined" in s for s in said), said
    finally:
        stop.set()
        t.join(10)
        server.close()


def test_an_agent_is_configured_by_one_value():
    import pytest

    from scout_sys.cluster.agent import Agent, AgentConfig
    from scout_sys.errors import ScoutError
    from scout_sys.watch.config import WatchConfig

    token = os.urandom(32)
    config = AgentConfig(("10.0.0.1", 29450), nnodes=2, node_rank=1, host_name="b", watch=WatchConfig(ebpf=False))
    one = Agent("999999999", config, token=token)
    assert one.agent_config == config
    assert (one.host, one.port, one.listen, one.nnodes, one.node, one.name) == ("10.0.0.1", 29450, "10.0.0.1", 2, 1, "b")
    assert one.config == WatchConfig(ebpf=False)  # the watch's settings it reads
    assert Agent("1", AgentConfig(("10.0.0.1", 29450), 2, 1, "b", listen="0.0.0.0"), token=token).listen == "0.0.0.0"
    with pytest.raises(ScoutError, match="--node-rank 2 is not within --nnodes 2"):
        Agent("1", AgentConfig(("10.0.0.1", 29450), 2, 2, "b"), token=token)
    with pytest.raises(TypeError):
        Agent("1", config, token=token, ebpf=False)  # one value: no settings one by one beside it
