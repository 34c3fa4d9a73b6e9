"""Many hosts: `scout-sys agent`, `diagnose --cluster`, `watch --cluster` (scout_sys/cluster)."""

from __future__ import annotations

import argparse
import json
import sys

from scout_sys.cli.common import EXIT_INCIDENT, EXIT_OK, _job_options, _open_output, _save
from scout_sys.errors import ScoutError
from scout_sys.extras import require

# ====================================================================== many hosts (scout_sys/cluster)

_AGENT_EPILOG = """\
examples (one agent per host, like torchrun's static rendezvous; docs/cluster.md):
  node0$ sudo scout-sys agent --job PID --store node0:29450 --nnodes 2 --node-rank 0 --token-file /etc/scout-sys/token
  node1$ sudo scout-sys agent --job PID --store node0:29450 --nnodes 2 --node-rank 1 --token-file /etc/scout-sys/token
  then:  scout-sys diagnose --cluster node0:29450 --token-file /etc/scout-sys/token

node rank 0 hosts the store (torch.distributed TCPStore) on exactly HOST:PORT; the others connect to it.
Runs until SIGTERM / Ctrl-C (exit 0); exit 2 on a configuration error (bad token, port in use).
"""


def _cluster_options(p: argparse.ArgumentParser, verb: str = "diagnose") -> None:
    p.add_argument("--cluster", metavar="HOST:PORT", default=None,
                   help=f"{verb} the whole job through the agents whose store is at HOST:PORT (docs/cluster.md)"
                   + ("; the dashboard groups ranks by host; --interval (at least 1 s), --stall-after, --state-dir "
                      "and the metrics and alerts options apply, the probe options are the agents'" if verb == "watch" else ""))
    p.add_argument("--token-file", metavar="FILE", default=None,
                   help="with --cluster: the file holding the agents' shared token (never pass the token itself)")


def _agent_parser(sub) -> None:  # noqa: ANN001 - argparse's private subparsers type
    a = sub.add_parser("agent", help="one per host: watch this host's ranks and meet the other hosts' agents",
                       description="Watch this host's ranks and publish them through a c10d store shared by one "
                                   "agent per host, for diagnose --cluster.",
                       epilog=_AGENT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _job_options(a)
    a.add_argument("--store", required=True, metavar="HOST:PORT", help="the store: hosted here by node rank 0")
    a.add_argument("--nnodes", required=True, type=int, metavar="N", help="number of hosts (agents)")
    a.add_argument("--node-rank", required=True, metavar="K",
                   help="this host's rank among them, 0..N-1; 'auto': the GROUP_RANK of this host's ranks "
                        "(torchrun's node rank), once they are found")
    a.add_argument("--listen", default=None, metavar="ADDR",
                   help="node rank 0: the address to bind the store to when the others reach it by another "
                        "(e.g. 0.0.0.0 behind a Kubernetes Service); default: the --store host, and only it")
    a.add_argument("--token-file", required=True, metavar="FILE", help="the shared token (same file on every host)")
    a.add_argument("--host-name", default=None, metavar="NAME",
                   help="the name this host's ranks carry in verdicts (default: the hostname)")
    a.add_argument("--ebpf", action=argparse.BooleanOptionalAction, default=True,
                   help="attach the eBPF probes in the background (default: on; --no-ebpf leaves them out)")


def _agent(args: argparse.Namespace) -> int:
    require("scout-sys agent", "cluster")  # the c10d store client is torch's
    import signal
    import threading

    from scout_sys.cluster.agent import Agent, AgentConfig
    from scout_sys.cluster.store import parse_addr
    from scout_sys.cluster.wire import read_token
    from scout_sys.rankenv import host_name
    from scout_sys.watch.config import WatchConfig

    if args.node_rank != "auto" and not (args.node_rank.isascii() and args.node_rank.isdigit()):  # not "²"
        raise ScoutError(f"--node-rank {args.node_rank!r}: a number 0..N-1, or auto")
    config = AgentConfig(parse_addr(args.store), nnodes=args.nnodes,
                         node_rank=None if args.node_rank == "auto" else int(args.node_rank),
                         host_name=args.host_name or host_name(), listen=args.listen,
                         watch=WatchConfig(ebpf=args.ebpf, topology=args.topology))
    agent = Agent(args.job, config, token=read_token(args.token_file))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return agent.run(stop)


def _diagnose_cluster(args: argparse.Namespace) -> int:
    require("scout-sys diagnose --cluster", "cluster")  # the c10d store client is torch's
    from scout_sys.cluster.client import ClusterClient, to_json
    from scout_sys.cluster.store import parse_addr
    from scout_sys.cluster.wire import read_token
    from scout_sys.report import render

    if not args.cluster or not args.token_file or args.job:
        raise ScoutError("diagnose --cluster needs HOST:PORT and --token-file FILE, and no --job")
    if args.native or args.ebpf or args.topology:
        raise ScoutError("--native, --ebpf and --topology are for --job; with --cluster the agents' own options apply")
    if args.window <= 0:
        raise ScoutError("--window must be positive")
    addr = parse_addr(args.cluster)
    client = ClusterClient(addr, read_token(args.token_file))
    out = _open_output(args.output)
    try:
        d, cluster = client.diagnose(args.window)
        _save(out, json.dumps(to_json(d, cluster)))
    finally:
        client.close()
        if out is not None:
            out.close()
    if args.json:
        print(json.dumps(to_json(d, cluster)))
    else:
        print(render(d, verbose=not args.quiet))
        for a in cluster["agents"]:
            print(f"agent node {a['node']} ({a['host']}): {a['state']}" + (f" - {a['detail']}" if a["detail"] else ""))
    return EXIT_OK if d.healthy else EXIT_INCIDENT


def _watch_cluster(args: argparse.Namespace) -> int:
    require("scout-sys watch --cluster", "cluster")  # the c10d store client is torch's
    import signal
    import threading

    from scout_sys.cli.watch import _dashboard, _emitter, _front_ends
    from scout_sys.cluster.client import ClusterClient
    from scout_sys.cluster.source import ClusterSource
    from scout_sys.cluster.store import parse_addr
    from scout_sys.cluster.wire import read_token
    from scout_sys.watch.config import WatchConfig

    if not args.cluster or not args.token_file or args.job or args.report:
        raise ScoutError("watch --cluster needs HOST:PORT and --token-file FILE, and no --job / --report")
    if args.interval <= 0 or (args.stall_after is not None and args.stall_after <= 0):
        raise ScoutError("--interval and --stall-after must be positive")
    addr, token = parse_addr(args.cluster), read_token(args.token_file)
    first = ClusterClient(addr, token)  # a wrong token or no store: exit 2 now, not in the loop
    clients = iter([first])
    args.job_name = args.job_name or args.cluster  # the metrics' job label: the store, not a pid on some host
    try:
        dashboard, held, sinks = _front_ends(args)
    except BaseException:
        first.close()
        raise
    # the probe options are the agents': the watch here reads its stall-after, interval and state folder
    config = WatchConfig(interval=max(args.interval, 1.0), stall_after=args.stall_after, state_dir=args.state_dir)
    source = ClusterSource(lambda: next(clients, None) or ClusterClient(addr, token), config, store=args.cluster,
                           say=held.append if dashboard else lambda t: print(f"scout-sys: {t}", file=sys.stderr,
                                                                               flush=True))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        sinks.attach(source)
        if dashboard and (rc := _dashboard(source, stop)) is not None:
            return rc
        if not args.json:
            print(f"watching the job through {first.nnodes} agents at {args.cluster}; Ctrl-C to stop", flush=True)
        try:
            return source.run(_emitter(args, hosts=True), stop)
        except KeyboardInterrupt:
            return 1 if source.ever_opened else 0
    finally:
        source.close()
        first.close()  # when no poll took it
        sinks.close()
        for m in held:
            print(m if m.startswith("scout-sys") else f"scout-sys: {m}", file=sys.stderr)
