"""scout_sys/cli/cluster.py's command line on its own: `agent`'s and the --cluster options' parsing and
help, and every bad input as one line on stderr and exit 2, never a traceback. The store is never
reached here (tests/test_cluster_cli.py meets a real one), except one agent that hosts its own."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

from scout_sys.cli import build_parser
from scout_sys.cli.cluster import _cluster_options
from scout_sys.cli.common import _Parser
from tests._cli_errors import one_error_line, usage_error_line
from tests.conftest import scout

AGENT = ["agent", "--job", "1", "--store", "127.0.0.1:1", "--nnodes", "2"]


_error, _usage_error = one_error_line, usage_error_line


def _token(tmp_path) -> str:
    path = tmp_path / "token"
    path.write_text(os.urandom(32).hex())
    return str(path)


def test_agent_parses_its_options_and_their_defaults():
    args = build_parser().parse_args([*AGENT, "--node-rank", "auto", "--token-file", "t"])
    assert (args.cmd, args.job, args.store, args.nnodes, args.node_rank, args.token_file) == (
        "agent", "1", "127.0.0.1:1", 2, "auto", "t")
    assert (args.topology, args.listen, args.host_name, args.ebpf) == (None, None, None, True)
    args = build_parser().parse_args([*AGENT, "--node-rank", "1", "--token-file", "t", "--no-ebpf", "--listen",
                                      "0.0.0.0", "--host-name", "b", "--topology", "dp=2,tp=2"])
    assert (args.node_rank, args.ebpf, args.listen, args.host_name, args.topology) == (
        "1", False, "0.0.0.0", "b", "dp=2,tp=2")


def test_agent_help_has_its_examples_and_exit_statuses():
    out = scout("agent", "--help")
    assert (out.returncode, out.stderr) == (0, "")
    assert out.stdout.startswith("usage: scout-sys agent [-h] --job SEL [--topology LAYOUT] --store HOST:PORT")
    lines = out.stdout.splitlines()
    assert ("  node1$ sudo scout-sys agent --job PID --store node0:29450 --nnodes 2 --node-rank 1 "
            "--token-file /etc/scout-sys/token") in lines
    assert "  then:  scout-sys diagnose --cluster node0:29450 --token-file /etc/scout-sys/token" in lines
    assert "Runs until SIGTERM / Ctrl-C (exit 0); exit 2 on a configuration error (bad token, port in use)." in lines


def test_the_cluster_options_help_says_what_applies_to_each_verb():
    helps = {}
    for verb in ("diagnose", "watch"):
        p = _Parser(prog=verb)
        _cluster_options(p, verb)
        helps[verb] = {a.dest: a.help for a in p._actions if a.dest in ("cluster", "token_file")}
        assert vars(p.parse_args([])) == {"cluster": None, "token_file": None}
    assert helps["diagnose"] == {
        "cluster": "diagnose the whole job through the agents whose store is at HOST:PORT (docs/cluster.md)",
        "token_file": "with --cluster: the file holding the agents' shared token (never pass the token itself)"}
    assert helps["watch"]["cluster"] == (
        "watch the whole job through the agents whose store is at HOST:PORT (docs/cluster.md); the dashboard "
        "groups ranks by host; --interval (at least 1 s), --stall-after, --state-dir and the metrics and alerts "
        "options apply, the probe options are the agents'")
    assert helps["watch"]["token_file"] == helps["diagnose"]["token_file"]


def test_agent_usage_errors_are_argparse_one_liners():
    assert _usage_error(scout(*AGENT[:-1], "two", "--node-rank", "0", "--token-file", "t")) == (
        "scout-sys agent: error: argument --nnodes: invalid int value: 'two'")
    assert _usage_error(scout(*AGENT, "--node-rank", "0")) == (
        "scout-sys agent: error: the following arguments are required: --token-file")
    assert _usage_error(scout("agent")) == (
        "scout-sys agent: error: the following arguments are required: --job, --store, --nnodes, --node-rank, "
        "--token-file")
    assert _usage_error(scout(*AGENT, "--node-rank", "0", "--token-file", "t", "--ebpf=yes")) == (
        "scout-sys agent: error: argument --ebpf/--no-ebpf: ignored explicit argument 'yes'")


@pytest.mark.torch  # the agent needs the cluster extra before it reads its options
@pytest.mark.parametrize("node_rank", ["x", "-1", "1.0", "²", "٣"])
def test_a_node_rank_that_is_not_a_number_is_one_line(tmp_path, node_rank):
    # "²" and "٣" are str.isdigit(): "²" was a ValueError traceback, "٣" became node 3 by int()
    assert _error(scout(*AGENT, "--node-rank", node_rank, "--token-file", _token(tmp_path))) == (
        f"scout-sys: error: --node-rank {node_rank!r}: a number 0..N-1, or auto")


@pytest.mark.torch
def test_agent_configuration_errors_are_one_line(tmp_path):
    token = _token(tmp_path)
    assert _error(scout(*AGENT[:-1], "0", "--node-rank", "0", "--token-file", token)) == (
        "scout-sys: error: --node-rank 0 is not within --nnodes 0")
    for store in ("nohost", "127.0.0.1:99999"):
        assert _error(scout("agent", "--job", "1", "--store", store, "--nnodes", "2", "--node-rank", "0",
                            "--token-file", token)) == (
            f"scout-sys: error: --store/--cluster {store!r}: expected HOST:PORT, e.g. node0:29450")
    missing = tmp_path / "none"
    assert _error(scout(*AGENT, "--node-rank", "1", "--token-file", str(missing))) == (
        f"scout-sys: error: cannot read --token-file {missing}: No such file or directory")


@pytest.mark.torch
def test_diagnose_and_watch_cluster_refuse_what_is_for_job(tmp_path):
    token = _token(tmp_path)
    need = "scout-sys: error: diagnose --cluster needs HOST:PORT and --token-file FILE, and no --job"
    assert _error(scout("diagnose", "--cluster", "h:1", "--token-file", token, "--job", "1")) == need
    assert _error(scout("diagnose", "--token-file", token)) == need  # a token without a store
    for flag in (["--native"], ["--ebpf"], ["--topology", "dp=2"]):
        assert _error(scout("diagnose", "--cluster", "h:1", "--token-file", token, *flag)) == (
            "scout-sys: error: --native, --ebpf and --topology are for --job; with --cluster the agents' own "
            "options apply"), flag
    assert _error(scout("diagnose", "--cluster", "h:1", "--token-file", token, "--window", "0")) == (
        "scout-sys: error: --window must be positive")
    need = "scout-sys: error: watch --cluster needs HOST:PORT and --token-file FILE, and no --job / --report"
    assert _error(scout("watch", "--cluster", "h:1", "--token-file", token, "--report", "r.json")) == need
    assert _error(scout("watch", "--cluster", "h:1")) == need
    for flag in (["--interval", "0"], ["--stall-after", "-1"]):
        assert _error(scout("watch", "--cluster", "h:1", "--token-file", token, *flag)) == (
            "scout-sys: error: --interval and --stall-after must be positive"), flag


@pytest.mark.torch
def test_an_agent_on_a_port_in_use_exits_2_and_one_on_sigterm_exits_0(tmp_path):
    """What the epilog promises: exit 2 on a port in use; runs until SIGTERM, then exit 0."""
    token = _token(tmp_path)
    rank = subprocess.Popen(["sleep", "600"])  # a real pid, no rank: the agent waits for ranks
    busy = socket.socket()
    try:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cmd = ["agent", "--job", str(rank.pid), "--nnodes", "2", "--node-rank", "0", "--token-file", token,
               "--no-ebpf", "--store"]
        assert _error(scout(*cmd, f"127.0.0.1:{port}")) == (
            f"scout-sys: error: cannot host the store on 127.0.0.1:{port}: Address already in use")
        busy.close()  # free now: the agent hosts its store there
        agent = subprocess.Popen([sys.executable, "-m", "scout_sys", *cmd, f"127.0.0.1:{port}"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        guard = threading.Timer(60, agent.kill)  # a readline that never returns fails the test, not hangs it
        guard.start()
        try:
            assert agent.stderr.readline() == f"scout-sys agent: hosting the store on 127.0.0.1:{port} for 2 nodes\n"
            assert agent.stderr.readline().startswith("scout-sys agent: no ranks to watch yet: no rank processes "
                                                      f"found for --job {rank.pid} ")
            agent.send_signal(signal.SIGTERM)
            out, err = agent.communicate(timeout=60)
            assert (agent.returncode, out, err) == (0, "", "")
        finally:
            guard.cancel()
            if agent.poll() is None:
                agent.kill()
            agent.wait()
    finally:
        busy.close()
        rank.kill()
        rank.wait()
