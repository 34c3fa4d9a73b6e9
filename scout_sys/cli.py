"""Command line: argument parsing and output only. The work is in job / monitor / consensus."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from scout_sys import __version__
from scout_sys.errors import ScoutError

EXIT_OK, EXIT_INCIDENT, EXIT_ERROR = 0, 1, 2

_DIAGNOSE_EPILOG = """\
examples:
  sudo scout-sys diagnose --job 12345            # torchrun's pid, or any rank's pid
  sudo scout-sys diagnose --job pgid:12345       # every process of a process group
  sudo scout-sys diagnose --job 101,102,103,104  # explicit rank processes
  sudo scout-sys diagnose --job 12345 --json | jq .incidents
  sudo scout-sys diagnose --job 12345 --topology dp=4,pp=2   # peers: ranks at the same pipeline stage

  sudo scout-sys diagnose --cluster node0:29450 --token-file /etc/scout-sys/token   # every host's agents

exit status: 0 healthy, 1 incident reported, 2 could not diagnose.
"""

_DEMO_EPILOG = """\
examples:
  scout-sys demo                       # 4 ranks, rank 2 hangs at step 5, then diagnose
  scout-sys demo --fault stop --rank 1 # rank 1 stops itself (SIGSTOP)
  scout-sys demo --fault desync        # rank 2 calls broadcast where the others all_reduce
  scout-sys demo --fault exit --launcher shell
"""


_WATCH_EPILOG = """\
examples:
  torchrun --nproc-per-node 8 train.py &                 # start the job and the watch together:
  sudo scout-sys watch --job $! --headless --json >> incidents.jsonl   # waits for the ranks
  sudo scout-sys watch --job 12345                       # the dashboard
  sudo scout-sys watch --job 12345 --headless            # one line per incident event
  sudo scout-sys watch --job 12345 --headless --json     # one JSON object per line
  sudo scout-sys watch --job 12345 --stall-after 30      # a job with long, legitimate pauses
  scout-sys watch --report incident.json                 # reopen a saved report in the dashboard
  scout-sys watch --cluster node0:29450 --token-file T --json   # the whole job through its agents (docs/cluster.md)

events (--json): {"event": "incident_opened" | "incident_updated" | "incident_closed",
                  "time": <unix s>, "incident": {...same object as diagnose...}, "bundle": <path>}
exit status: 0 the job ended without incidents, 1 incidents were opened, 2 could not watch.
SIGINT / SIGTERM stop the watch cleanly (probes detached).
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse's own convention too)
        self.print_usage(sys.stderr)
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


def _job_options(p: argparse.ArgumentParser, *, required: bool = True, topology: bool = True) -> None:
    p.add_argument("--job", required=required, metavar="SEL",
                   help="PID of the launcher or of any rank, pgid:N, env:NAME=VALUE (ranks whose environment holds it, "
                        "e.g. env:SLURM_JOB_ID=1234), or PID,PID,... of rank processes")
    if not topology:
        return
    p.add_argument("--topology", default=None, metavar="LAYOUT",
                   help="the parallel layout, e.g. dp=4,pp=2 or dp=2,tp=2,pp=2,order=megatron (orders: mesh "
                        "(default: as written, last fastest), megatron, deepspeed, torchtitan; see "
                        "docs/layouts.md). Default: read from Megatron-Core / DeepSpeed / TorchTitan command "
                        "lines, else peer groups from the ranks' activity")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="scout-sys", description="Find which rank broke a distributed PyTorch job, from outside it.")
    p.add_argument("--version", action="version", version=f"scout-sys {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)

    d = sub.add_parser("diagnose", help="one-shot triage: sample the job for a few seconds and name the culprit",
                       description="Sample the job over a window, decide by strict majority of equivalent "
                                   "ranks, print the verdict and exit.",
                       epilog=_DIAGNOSE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _job_options(d, required=False)
    _cluster_options(d)
    d.add_argument("--window", type=float, default=3.0, metavar="SECONDS",
                   help="how long to sample before deciding (default: 3)")
    d.add_argument("--json", action="store_true", help="print exactly one JSON object (scout-sys/diagnosis/v1)")
    d.add_argument("--native", action="store_true",
                   help="once a hang is confirmed, add native stacks of the origin ranks (pauses them briefly)")
    d.add_argument("-q", "--quiet", action="store_true", help="verdict only, no evidence")
    d.add_argument("--ebpf", action=argparse.BooleanOptionalAction, default=False,
                   help="also attach the eBPF probes (collective sequence numbers, exits and signals) before "
                        "the window; compiling them adds several seconds (default: off; see docs/ebpf.md)")

    dm = sub.add_parser("demo", help="start a 4-rank demo job with one faulty rank, diagnose it, stop it",
                        epilog=_DEMO_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    dm.add_argument("--fault", default="hang",
                    choices=["none", "hang", "stop", "busy", "exit", "desync"])
    dm.add_argument("--rank", type=int, default=2, help="the faulty rank (default: 2)")
    dm.add_argument("--nproc", type=int, default=4, help="ranks (default: 4)")
    dm.add_argument("--launcher", choices=["torchrun", "shell"], default="torchrun")
    dm.add_argument("--window", type=float, default=3.0, metavar="SECONDS")
    dm.add_argument("--json", action="store_true")

    w = sub.add_parser("watch", help="follow the job live: open, update and close incidents as it runs",
                       description="Watch a running job until it ends. On a terminal it opens the dashboard; "
                                   "with --headless (or without a terminal) it prints one line per event.",
                       epilog=_WATCH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _job_options(w, required=False)
    w.add_argument("--report", metavar="FILE",
                   help="instead of a live job, reopen a saved report (diagnose --json, or one saved with 's' "
                        "in the dashboard) in the dashboard")
    w.add_argument("--stall-after", type=float, default=None, metavar="SECONDS",
                   help="call the job hung after this long without progress (default: adapts to the job, "
                        "4x its longest healthy pause, at least 5 s)")
    w.add_argument("--interval", type=float, default=0.5, metavar="SECONDS", help="poll period (default: 0.5)")
    w.add_argument("--headless", action="store_true", help="print events instead of drawing the dashboard")
    w.add_argument("--json", action="store_true", help="with --headless: one JSON object per line per event")
    w.add_argument("--state-dir", default=None, metavar="DIR",
                   help="where evidence bundles go (default: /var/lib/scout-sys as root, else ~/.local/state/scout-sys)")
    w.add_argument("--ebpf", action=argparse.BooleanOptionalAction, default=True,
                   help="attach the eBPF probes in the background (default: on; --no-ebpf leaves them out)")
    w.add_argument("--wait-ranks", type=float, default=None, metavar="SECONDS",
                   help="when the job has no rank yet (watch started with the launcher), wait at most this long "
                        "for its ranks (default: as long as the selected process lives)")
    w.add_argument("--replay", action=argparse.BooleanOptionalAction, default=True,
                   help="run a replay round (docs/replay.md) when a straggler is confirmed, to tell a slow device "
                        "from a slow network or input pipeline (default: on)")
    w.add_argument("--replay-every", type=float, default=None, metavar="SECONDS",
                   help="also run a replay round every so many seconds (sdc: silent data corruption; default: off)")
    _export_options(w)
    _cluster_options(w)

    sub.add_parser("doctor", help="check eBPF, py-spy, ptrace and NVML prerequisites and say how to fix them")
    _agent_parser(sub)
    _replay_parsers(sub)
    return p


def _diagnose(job_sel: str, window: float, *, as_json: bool, native: bool, quiet: bool, ebpf: bool,
              topology: str | None = None) -> int:
    from scout_sys.job import find_job
    from scout_sys.monitor import Monitor, default_probes
    from scout_sys.report import render, to_json

    if window <= 0:
        raise ScoutError("--window must be positive")
    job = find_job(job_sel, topology)
    with Monitor(job, extra_probes=default_probes(ebpf)) as mon:
        mon.wait_started()
        d = mon.diagnose(window, native=native)
    if not ebpf:
        d = replace(d, probes={**d.probes, "ebpf": "not requested (--ebpf)"})
    print(to_json(d) if as_json else render(d, verbose=not quiet))
    return EXIT_OK if d.healthy else EXIT_INCIDENT


def _demo(args: argparse.Namespace) -> int:
    from scout_sys.demo.launch import DemoJob
    from scout_sys.job import find_job
    from scout_sys.monitor import Monitor
    from scout_sys.report import render, to_json

    torchrun_args = ["--monitor-interval", "600"] if args.fault == "exit" else []
    say = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    job = DemoJob(args.nproc, fault=args.fault, fault_rank=args.rank, launcher=args.launcher,
                  torchrun_args=torchrun_args if args.launcher == "torchrun" else None)
    say(f"demo: starting {args.nproc} ranks ({args.launcher}), fault {args.fault!r} on rank {args.rank} at step 5")
    with job:
        if args.fault == "none":
            job.wait_steps(2, timeout=120)
        else:
            job.wait_fault(timeout=120)
            say(f"demo: rank {args.rank} faulted; letting the others reach the next collective")
            time.sleep(1.5)
        say(f"demo: $ scout-sys diagnose --job {job.pid} --window {args.window:g}")
        t0 = time.time()
        with Monitor(find_job(str(job.pid))) as mon:
            d = mon.diagnose(args.window)
        print(to_json(d) if args.json else render(d))
        say(f"demo: answered in {time.time() - t0:.1f} s; stopping the job")
    named = {r for i in d.incidents for r in i.ranks}
    if args.fault == "none":
        return EXIT_OK if d.healthy else EXIT_INCIDENT
    return EXIT_OK if named == {args.rank} else EXIT_INCIDENT


# ---------------------------------------------------------------- watch: the cluster's tooling (exporters/)
_EXPORT_EPILOG = """\

the cluster's tooling (docs/metrics.md, examples/):
  sudo scout-sys watch --job 12345 --prometheus 9464 --job-name llama-70b   # /metrics for Prometheus
  sudo scout-sys watch --job 12345 --headless --on-incident examples/on-incident.sh --on-incident-user root
  sudo scout-sys watch --job 12345 --events /var/log/scout-sys/events.jsonl  # the dashboard, and a log
hooks get the event JSON on stdin and SCOUT_SYS_{EVENT,INCIDENT,KIND,STATUS,RANKS,HOSTS,BUNDLE}; as root
they run as nobody unless --on-incident-user says otherwise. Bundles, reports and --events files are
0600 in 0700 folders (--group G: 0640/0750, group G). SIGHUP reopens the --events file (log rotation).
"""


def _export_options(w: argparse.ArgumentParser) -> None:
    g = w.add_argument_group("the cluster's tooling")
    g.add_argument("--prometheus", metavar="[ADDR:]PORT",
                   help="serve Prometheus metrics on http://ADDR:PORT/metrics (ADDR default: all interfaces)")
    g.add_argument("--job-name", metavar="NAME", help="the metrics' job label (default: the launcher's pid)")
    g.add_argument("--on-incident", metavar="CMD",
                   help="run CMD (through sh) on every incident_opened, the event JSON on its stdin")
    g.add_argument("--on-incident-all", action="store_true", help="also on incident_updated and incident_closed")
    g.add_argument("--on-incident-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="kill a hook (its whole process group) still running after this long (default: 60)")
    g.add_argument("--on-incident-user", metavar="USER",
                   help="run hooks as USER (as root the default is nobody: name root to give them the watch's "
                        "privileges)")
    g.add_argument("--events", metavar="FILE",
                   help="append every event as a JSON line to FILE (fsynced; SIGHUP reopens it), dashboard too")
    g.add_argument("--group", metavar="GROUP",
                   help="make bundles, reports and the --events file readable by GROUP (default: owner only)")
    w.epilog = (w.epilog or "") + _EXPORT_EPILOG


def _export_sinks(args: argparse.Namespace, say: Callable[[str], None]) -> Any:  # exporters.Sinks
    """The sinks the options ask for, started; bad values raise ScoutError before the watch starts."""
    import signal

    from scout_sys import files
    from scout_sys.exporters import Sinks

    files.share_with_group(args.group)
    sinks: list = []
    try:
        if args.events:
            from scout_sys.exporters.events import EventsFile

            events = EventsFile(args.events, say=say)
            sinks.append(events)
            signal.signal(signal.SIGHUP, lambda *_: events.reopen())
        if args.on_incident:
            from scout_sys.exporters.hooks import HookRunner

            sinks.append(HookRunner(args.on_incident, timeout=args.on_incident_timeout,
                                    all_events=args.on_incident_all, user=args.on_incident_user, say=say))
        if args.prometheus is not None:
            from scout_sys.exporters.prometheus import PrometheusExporter

            prom = PrometheusExporter(args.prometheus, job_name=args.job_name)
            sinks.append(prom)
            print(f"scout-sys: metrics at {prom.url}", file=sys.stderr, flush=True)
    except BaseException:
        Sinks(sinks, say).close()
        raise
    return Sinks(sinks, say)


def _watch(args: argparse.Namespace) -> int:
    import signal
    import threading

    from scout_sys.model import Event, Job
    from scout_sys.report import printable
    from scout_sys.watch import Watcher

    if args.interval <= 0 or any(v is not None and v <= 0 for v in (args.stall_after, args.wait_ranks,
                                                                    args.replay_every)):
        raise ScoutError("--interval, --stall-after, --wait-ranks and --replay-every must be positive")
    if bool(args.job) == bool(args.report):
        raise ScoutError("watch needs exactly one of --job SEL (a live job) or --report FILE (a saved report)")
    if args.report:
        from scout_sys.tui.app import run_dashboard
        from scout_sys.tui.source import ReportSource

        return run_dashboard(ReportSource(args.report))
    dashboard = not args.headless and not args.json and sys.stdout.isatty()
    held: deque[str] = deque(maxlen=50)  # the dashboard owns the terminal: sinks' messages wait till it closes
    sinks = _export_sinks(args, held.append if dashboard else lambda m: print(m, file=sys.stderr, flush=True))
    watcher = Watcher(args.job, interval=args.interval, stall_after=args.stall_after, state_dir=args.state_dir,
                      ebpf=args.ebpf, topology=args.topology, wait_ranks=args.wait_ranks, replay=args.replay,
                      replay_every=args.replay_every)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        watcher.start()
        sinks.attach(watcher)
        if dashboard:
            try:
                from scout_sys.tui.app import run_dashboard
            except ImportError:
                run_dashboard = None
            if run_dashboard is not None:
                try:
                    rc = run_dashboard(watcher)
                finally:  # the dashboard's loop restored the default handler; keep close() reachable
                    signal.signal(signal.SIGTERM, lambda *_: stop.set())
                # the terminal is back: give the prompt back too, and detach the probes behind it
                watcher.close(background=True)
                return rc

        def emit(e: Event) -> None:
            if args.json:
                print(json.dumps(e.to_json()), flush=True)
                return
            inc = e.incident
            word = e.event.removeprefix("incident_").upper()
            line = f"{time.strftime('%H:%M:%S', time.localtime(e.time))} {word} {inc.id} {inc.kind} ({inc.status})"
            if inc.ranks:
                line += f" rank{'s' if len(inc.ranks) > 1 else ''} {','.join(map(str, inc.ranks))}"
            print(printable(f"{line}: {inc.summary}"), flush=True)
            if e.bundle:
                print(printable(f"  evidence saved to {e.bundle}"), flush=True)

        def on_job(job: Job) -> None:
            if not args.json:
                print(f"watching {job.world_size} ranks ({len(job.ranks)} on {job.host}), launcher {job.launcher} "
                      f"pid {job.launcher_pid}; Ctrl-C to stop", flush=True)

        if watcher.job is None:
            print(f"scout-sys: {watcher.waiting}", file=sys.stderr, flush=True)
        try:
            rc = watcher.run(emit, stop, on_job=on_job)
        except KeyboardInterrupt:
            rc = 1 if watcher.ever_opened else 0
        if not args.json:
            print("job ended" if watcher.ended else "watch stopped", flush=True)
        return rc
    finally:
        watcher.close()
        sinks.close()
        for m in held:
            print(m, file=sys.stderr)


def _doctor() -> int:
    try:
        from scout_sys import doctor
    except ImportError:
        raise ScoutError("doctor is not available in this build") from None
    return doctor.run()


# ====================================================================== many hosts (scout_sys/cluster)

_AGENT_EPILOG = """\
examples (one agent per host, like torchrun's static rendezvous; docs/cluster.md):
  node0$ sudo scout-sys agent --job PID --store node0:29450 --nnodes 2 --node-rank 0 --token-file /etc/scout-sys/token
  node1$ sudo scout-sys agent --job PID --store node0:29450 --nnodes 2 --node-rank 1 --token-file /etc/scout-sys/token
  then:  scout-sys diagnose --cluster node0:29450 --token-file /etc/scout-sys/token

node rank 0 hosts the store (torch.distributed TCPStore) on exactly HOST:PORT; the others connect to it.
Runs until SIGTERM / Ctrl-C (exit 0); exit 2 on a configuration error (bad token, port in use).
"""


def _cluster_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", metavar="HOST:PORT", default=None,
                   help="diagnose the whole job through the agents whose store is at HOST:PORT (docs/cluster.md)")
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
    import signal
    import socket
    import threading

    from scout_sys.cluster.agent import Agent
    from scout_sys.cluster.store import parse_addr
    from scout_sys.cluster.wire import read_token

    if args.node_rank != "auto" and not args.node_rank.isdigit():
        raise ScoutError(f"--node-rank {args.node_rank!r}: a number 0..N-1, or auto")
    agent = Agent(args.job, parse_addr(args.store), nnodes=args.nnodes,
                  node_rank=None if args.node_rank == "auto" else int(args.node_rank),
                  token=read_token(args.token_file), host_name=args.host_name or socket.gethostname(),
                  ebpf=args.ebpf, topology=args.topology, listen=args.listen)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return agent.run(stop)


def _diagnose_cluster(args: argparse.Namespace) -> int:
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
    try:
        d, cluster = client.diagnose(args.window)
    finally:
        client.close()
    if args.json:
        print(json.dumps(to_json(d, cluster)))
    else:
        print(render(d, verbose=not args.quiet))
        for a in cluster["agents"]:
            print(f"agent node {a['node']} ({a['host']}): {a['state']}" + (f" - {a['detail']}" if a["detail"] else ""))
    return EXIT_OK if d.healthy else EXIT_INCIDENT


def _watch_cluster(args: argparse.Namespace) -> int:
    import signal
    import threading

    from scout_sys.cluster.client import ClusterClient
    from scout_sys.cluster.store import parse_addr
    from scout_sys.cluster.watch import ClusterWatcher
    from scout_sys.cluster.wire import read_token
    from scout_sys.report import printable

    if not args.cluster or not args.token_file or args.job or args.report:
        raise ScoutError("watch --cluster needs HOST:PORT and --token-file FILE, and no --job / --report")
    addr, token = parse_addr(args.cluster), read_token(args.token_file)
    first = ClusterClient(addr, token)  # a wrong token or no store: exit 2 now, not in the loop
    clients = iter([first])
    watcher = ClusterWatcher(lambda: next(clients, None) or ClusterClient(addr, token),
                             stall_after=args.stall_after, interval=max(args.interval, 1.0),
                             say=lambda t: print(f"scout-sys: {t}", file=sys.stderr, flush=True))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if not args.json:
        print(f"watching the job through {first.nnodes} agents at {args.cluster} (events only: no dashboard for "
              "--cluster yet); Ctrl-C to stop", flush=True)

    def emit(e) -> None:  # noqa: ANN001 - an incident Event or an AgentEvent
        if args.json:
            print(json.dumps(e.to_json()), flush=True)
        elif hasattr(e, "incident"):
            inc = e.incident
            ranks = f" rank{'s' if len(inc.ranks) > 1 else ''} {','.join(map(str, inc.ranks))}" if inc.ranks else ""
            print(printable(f"{time.strftime('%H:%M:%S', time.localtime(e.time))} "
                            f"{e.event.removeprefix('incident_').upper()} {inc.id} {inc.kind} ({inc.status}){ranks}"
                            f"{' on ' + ','.join(inc.hosts) if inc.ranks else ''}: {inc.summary}"), flush=True)
        else:
            print(printable(f"{time.strftime('%H:%M:%S', time.localtime(e.time))} {e.event.upper()} node {e.node} "
                            f"({e.host}) ranks {','.join(map(str, e.ranks))} {e.detail}"), flush=True)

    try:
        return watcher.run(emit, stop)
    except KeyboardInterrupt:
        return 1 if watcher.book.ever_opened else 0


# --------------------------------------------------------------------------- replay and certify

_REPLAY_EPILOG = """\
examples:
  sudo scout-sys replay --job 12345                     # 2 rounds of kernels beside every device of the job
  sudo scout-sys replay --job 12345 --rounds 3 --json   # one JSON object (scout-sys/diagnosis/v1)
  sudo scout-sys replay --job 12345 --checkpoint ckpt/step_1000/model.pt   # GEMMs on the model's own weights

incidents: sdc (a device computes other bits than the strict majority of its peers), straggler (a
device runs the same kernels slower, in 2 rounds in a row); inconclusive without a strict majority.
Each round is appended to <state dir>/replay/ledger.jsonl, which certify reads.
exit status: 0 every device agrees, 1 incident reported, 2 could not replay. The job keeps running;
every worker is gone when the command ends (SIGINT / SIGTERM included). See docs/replay.md.
"""

_CERTIFY_EPILOG = """\
examples:
  scout-sys certify ckpt/step_1000                       # a DCP folder, or a folder of per-rank files
  scout-sys certify ckpt/step_900 ckpt/step_1000 --json  # which one to restart from: "recommended"
  scout-sys certify model.safetensors optimizer.pt

certified: content clean and a complete clean replay round between the previous checkpoint and this
one; rejected: unreadable, truncated, code-carrying pickle (never executed), NaN/Inf, a divergent
replica, or sdc/inconclusive replay in that interval; unverified: clean content, no covering round.
exit status: 0 every checkpoint certified, 1 any unverified or rejected, 2 could not run.
"""


def _replay_parsers(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("replay", help="run seeded kernels beside every device of the job; name a device that "
                                      "computes other bits (sdc) or runs slower (straggler)",
                       description="Start one worker per device of the job, as its rank runs (interpreter, "
                                   "environment, CPU set, cgroups, device; lower priority, bounded memory), run "
                                   "the same deterministic kernels on each and vote by strict majority.",
                       epilog=_REPLAY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _job_options(r, topology=False)  # peers are devices of one kind, whatever the parallel layout
    r.add_argument("--checkpoint", metavar="PATH", help="also run GEMMs with this checkpoint's weights and shapes "
                                                        "(.pt/.pth/.bin read with weights_only=True, .safetensors)")
    r.add_argument("--rounds", type=int, default=2, help="rounds (default: 2; a slow device needs 2 in a row)")
    r.add_argument("--size", choices=["default", "small"], default="default",
                   help="kernel sizes: default takes the tuned paths of real training; small is for tests")
    r.add_argument("--reps", type=int, default=3, help="repetitions of each kernel per round (default: 3)")
    r.add_argument("--state-dir", default=None, metavar="DIR",
                   help="where the ledger goes (default: /var/lib/scout-sys as root, else ~/.local/state/scout-sys)")
    r.add_argument("--json", action="store_true", help="print exactly one JSON object (scout-sys/diagnosis/v1)")
    r.add_argument("-q", "--quiet", action="store_true", help="verdict only, no evidence")

    c = sub.add_parser("certify", help="check checkpoints (content, replicas, replay coverage) before a restart",
                       epilog=_CERTIFY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("paths", nargs="+", metavar="PATH", help="checkpoint files or folders")
    c.add_argument("--state-dir", default=None, metavar="DIR", help="where the replay ledger is (as replay)")
    c.add_argument("--json", action="store_true", help="print exactly one JSON object (scout-sys/certificate/v1)")


def _replay(args: argparse.Namespace) -> int:
    import signal

    from scout_sys.job import find_job
    from scout_sys.replay.report import render_replay
    from scout_sys.replay.runner import run_rounds
    from scout_sys.watch.bundle import default_state_dir

    if args.rounds < 1 or args.reps < 1:
        raise ScoutError("--rounds and --reps must be at least 1")
    if args.checkpoint and not os.path.exists(args.checkpoint):
        raise ScoutError(f"no such checkpoint: {args.checkpoint}")

    def _term(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)  # the workers are closed on the way out, as on SIGINT
    job = find_job(args.job)
    res = run_rounds(job, args.rounds, size=args.size, reps=args.reps, checkpoint=args.checkpoint,
                     state_dir=args.state_dir or default_state_dir())
    d = res.diagnosis
    if args.json:
        out = d.to_json()
        out["replay"] = {"rounds": [[x.to_json() for x in rnd] for rnd in res.rounds]}
        print(json.dumps(out))
    else:
        print(render_replay(res, verbose=not args.quiet))
    return EXIT_OK if d.healthy else EXIT_INCIDENT


def _certify(args: argparse.Namespace) -> int:
    from scout_sys.replay.certify import certify, render_certificate
    from scout_sys.watch.bundle import default_state_dir

    cert = certify(args.paths, state_dir=args.state_dir or default_state_dir())
    print(json.dumps(cert) if args.json else render_certificate(cert))
    return EXIT_OK if all(c["status"] == "certified" for c in cert["checkpoints"]) else EXIT_INCIDENT


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.cmd is None:
        parser.print_help()
        return EXIT_ERROR
    try:
        if args.cmd == "agent":
            return _agent(args)
        if args.cmd == "diagnose" and (args.cluster or args.token_file):
            return _diagnose_cluster(args)
        if args.cmd == "diagnose":
            if not args.job:
                raise ScoutError("diagnose needs --job SEL (this host) or --cluster HOST:PORT (every host)")
            return _diagnose(args.job, args.window, as_json=args.json, native=args.native, quiet=args.quiet,
                             ebpf=args.ebpf, topology=args.topology)
        if args.cmd == "demo":
            return _demo(args)
        if args.cmd == "watch" and (args.cluster or args.token_file):
            return _watch_cluster(args)
        if args.cmd == "watch":
            return _watch(args)
        if args.cmd == "doctor":
            return _doctor()
        if args.cmd == "replay":
            return _replay(args)
        if args.cmd == "certify":
            return _certify(args)
    except ScoutError as e:
        print(f"scout-sys: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    parser.error(f"unknown command {args.cmd}")
    return EXIT_ERROR
