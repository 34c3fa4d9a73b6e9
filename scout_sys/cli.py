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

events (--json): {"event": "incident_opened" | "incident_updated" | "incident_closed",
                  "time": <unix s>, "incident": {...same object as diagnose...}, "bundle": <path>}
exit status: 0 the job ended without incidents, 1 incidents were opened, 2 could not watch.
SIGINT / SIGTERM stop the watch cleanly (probes detached).
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse's own convention too)
        self.print_usage(sys.stderr)
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


def _job_options(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("--job", required=required, metavar="SEL",
                   help="PID of the launcher or of any rank, pgid:N, or PID,PID,... of rank processes")
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
    _job_options(d)
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
    _export_options(w)

    sub.add_parser("doctor", help="check eBPF, py-spy, ptrace and NVML prerequisites and say how to fix them")
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

    if args.interval <= 0 or any(v is not None and v <= 0 for v in (args.stall_after, args.wait_ranks)):
        raise ScoutError("--interval, --stall-after and --wait-ranks must be positive")
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
                      ebpf=args.ebpf, topology=args.topology, wait_ranks=args.wait_ranks)
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
                    return run_dashboard(watcher)
                finally:  # the dashboard's loop restored the default handler; keep close() reachable
                    signal.signal(signal.SIGTERM, lambda *_: stop.set())

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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.cmd is None:
        parser.print_help()
        return EXIT_ERROR
    try:
        if args.cmd == "diagnose":
            return _diagnose(args.job, args.window, as_json=args.json, native=args.native, quiet=args.quiet,
                             ebpf=args.ebpf, topology=args.topology)
        if args.cmd == "demo":
            return _demo(args)
        if args.cmd == "watch":
            return _watch(args)
        if args.cmd == "doctor":
            return _doctor()
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
