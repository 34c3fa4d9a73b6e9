"""`scout-sys watch`: the live job (headless lines, JSON events, the dashboard) and its sinks."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from scout_sys.errors import ScoutError

_WATCH_EPILOG = """\
examples:
  torchrun --nproc-per-node 8 train.py &                 # start the job and the watch together:
  sudo scout-sys watch --job $! --headless --json >> incidents.jsonl   # waits for the ranks
  sudo scout-sys watch --job 12345                       # the dashboard
  sudo scout-sys watch --job 12345 --headless            # one line per incident event
  sudo scout-sys watch --job 12345 --headless --json     # one JSON object per line
  sudo scout-sys watch --job 12345 --stall-after 30      # a job with long, legitimate pauses
  scout-sys watch --report incident.json                 # reopen a saved report in the dashboard
  sudo scout-sys watch --job env:TORCHELASTIC_RUN_ID --every-job --prometheus 9464   # every job on this node
  scout-sys watch --cluster node0:29450 --token-file T   # every host's ranks through their agents (docs/cluster.md)
  scout-sys watch --cluster node0:29450 --token-file T --headless --json --prometheus 9464

events (--json): {"event": "incident_opened" | "incident_updated" | "incident_closed",
                  "time": <unix s>, "incident": {...same object as diagnose...}, "bundle": <path>}
  and {"event": "checkpoint_written", "time", "path", "written", "coverage", "replay"} (docs/watch.md)
  with --cluster also {"event": "agent_lost" | "agent_back", "time", "node", "host", "ranks", "detail"}
exit status: 0 the job ended without incidents, 1 incidents were opened, 2 could not watch.
SIGINT / SIGTERM stop the watch cleanly (probes detached); SIGHUP never does (it reopens --events).
"""


# ---------------------------------------------------------------- watch: metrics and alerts (exporters/)
_EXPORT_EPILOG = """\

metrics and alerts (docs/metrics.md, examples/):
  sudo scout-sys watch --job 12345 --prometheus 9464 --job-name llama-70b   # /metrics for Prometheus
  sudo scout-sys watch --job 12345 --headless --on-incident examples/on-incident.sh --on-incident-user root
  sudo scout-sys watch --job 12345 --events /var/log/scout-sys/events.jsonl  # the dashboard, and a log
hooks get the event JSON on stdin and SCOUT_SYS_{EVENT,INCIDENT,KIND,STATUS,RANKS,HOSTS,BUNDLE,JOB}; as root
they run as nobody unless --on-incident-user says otherwise. Bundles, reports and --events files are
0600 in 0700 folders (--group G: 0640/0750, group G). SIGHUP reopens the --events file (log rotation) and
never stops the watch, --events or not; --pid-file names the watch to signal:
  postrotate  kill -HUP "$(cat /run/scout-sys/llama-70b.pid)"
"""


def _export_options(w: argparse.ArgumentParser) -> None:
    g = w.add_argument_group("metrics and alerts")
    g.add_argument("--prometheus", metavar="[ADDR:]PORT",
                   help="serve Prometheus metrics on http://ADDR:PORT/metrics (ADDR default: all interfaces)")
    g.add_argument("--job-name", metavar="NAME", help="the metrics' job label (default: the launcher's pid; with --cluster the store's HOST:PORT)")
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
    g.add_argument("--pid-file", metavar="PATH",
                   help="write the watch's pid to PATH at start and remove it at exit (for logrotate's "
                        "kill -HUP \"$(cat PATH)\")")
    g.add_argument("--group", metavar="GROUP",
                   help="make bundles, reports and the --events file readable by GROUP (default: owner only)")
    w.epilog = (w.epilog or "") + _EXPORT_EPILOG


def _export_sinks(args: argparse.Namespace, say: Callable[[str], None]) -> Any:  # exporters.Sinks
    """The sinks the options ask for, started; bad values raise ScoutError before the watch starts."""
    from scout_sys import files
    from scout_sys.exporters import Sinks

    files.share_with_group(args.group)
    sinks: list = []
    reopen: list[Callable[[], None]] = []
    # SIGHUP is log rotation's "reopen your files", never a stop (SIGTERM / SIGINT stop the watch)
    signal.signal(signal.SIGHUP, lambda *_: [f() for f in reopen])
    try:
        if getattr(args, "pid_file", None):
            sinks.append(PidFile(args.pid_file))
        if args.events:
            from scout_sys.exporters.events import EventsFile

            events = EventsFile(args.events, say=say)
            sinks.append(events)
            reopen.append(events.reopen)
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


class PidFile:
    """``--pid-file PATH``: this process's pid, written (atomically) when the watch starts and removed when
    it exits — unless another process has written its own pid there since. A sink that takes nothing."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.pid = os.getpid()
        tmp = f"{self.path}.{self.pid}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)  # /run/scout-sys after a boot
            with open(tmp, "w", encoding="ascii") as f:
                f.write(f"{self.pid}\n")
            os.chmod(tmp, 0o644)  # a pid is no secret: logrotate and monitoring read it
            os.replace(tmp, self.path)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise ScoutError(f"--pid-file {path}: {e.strerror or e}") from None

    def on_event(self, e: Any) -> None:
        pass

    def on_snapshot(self, s: Any, took: float) -> None:
        pass

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            with open(self.path, encoding="ascii") as f:
                if int(f.read().strip() or 0) != self.pid:
                    return
            os.unlink(self.path)


def _front_ends(args: argparse.Namespace) -> tuple[bool, deque[str], Any]:
    """Dashboard or lines, and the sinks the options ask for (started). While the dashboard owns the
    terminal, the sinks' messages wait in the deque until it closes."""
    dashboard = not args.headless and not args.json and sys.stdout.isatty()
    held: deque[str] = deque(maxlen=50)
    sinks = _export_sinks(args, held.append if dashboard else lambda m: print(m, file=sys.stderr, flush=True))
    return dashboard, held, sinks


def _dashboard(source: Any, stop: threading.Event) -> int | None:
    """The dashboard over a started source until ``q``; None when textual is not installed."""
    try:
        from scout_sys.tui.app import run_dashboard
    except ImportError:
        return None
    try:
        return run_dashboard(source)
    finally:  # the dashboard's loop restored the default handler; keep close() reachable
        signal.signal(signal.SIGTERM, lambda *_: stop.set())


def _emitter(args: argparse.Namespace, *, hosts: bool = False) -> Callable[[Any], None]:
    """Print each event: one JSON object per line (--json), else one line for people (``hosts``: with
    the culprit's host, for a job on many hosts). Agent events (watch --cluster) too."""
    from scout_sys.report import printable
    from scout_sys.text import agent_event

    def emit(e: Any) -> None:
        if args.json:
            print(json.dumps(e.to_json()), flush=True)
            return
        stamp = time.strftime("%H:%M:%S", time.localtime(e.time))
        inc = getattr(e, "incident", None)
        job = f" job {e.job}" if getattr(e, "job", None) else ""  # watch --every-job
        if inc is None:
            print(printable(f"{stamp}{job} {e.event.upper()} {agent_event(e)}"), flush=True)
            return
        line = f"{stamp}{job} {e.event.removeprefix('incident_').upper()} {inc.id} {inc.kind} ({inc.status})"
        if inc.ranks:
            line += f" rank{'s' if len(inc.ranks) > 1 else ''} {','.join(map(str, inc.ranks))}"
            if hosts and inc.hosts:
                line += f" on {','.join(inc.hosts)}"
        print(printable(f"{line}: {inc.summary}"), flush=True)
        if e.bundle:
            print(printable(f"  evidence saved to {e.bundle}"), flush=True)

    return emit


def _watch(args: argparse.Namespace) -> int:
    from scout_sys.model import Job
    from scout_sys.watch import Watcher
    from scout_sys.watch.config import WatchConfig

    config = WatchConfig.from_args(args)  # checks the values first: exit 2 before anything starts
    if bool(args.job) == bool(args.report):
        raise ScoutError("watch needs exactly one of --job SEL (a live job) or --report FILE (a saved report)")
    if args.report:
        from scout_sys.tui.app import run_dashboard
        from scout_sys.tui.source import ReportSource

        return run_dashboard(ReportSource(args.report))
    if getattr(args, "every_job", False):
        return _every_job(args, config)
    dashboard, held, sinks = _front_ends(args)
    watcher = Watcher(args.job, config)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    quit_rc: int | None = None
    try:
        watcher.start()
        if (off := ebpf_off_line(args.ebpf)) is not None:  # once, when the job (or the wait for it) is there
            (held.append if dashboard else lambda m: print(m, file=sys.stderr, flush=True))(off)
        sinks.attach(watcher)
        if dashboard and (rc := _dashboard(watcher, stop)) is not None:
            # the terminal is back: give the prompt back too, and detach the probes behind it
            watcher.close(background=True)
            quit_rc = rc
            return rc

        def on_job(job: Job) -> None:
            if not args.json:
                print(f"watching {job.world_size} ranks ({len(job.ranks)} on {job.host}), launcher {job.launcher} "
                      f"pid {job.launcher_pid}; Ctrl-C to stop", flush=True)
                inside = [r for r in sorted(job.ranks, key=lambda r: r.rank) if r.container_pid is not None]
                if inside:  # ranks in their own PID namespace: the pids their logs print are these
                    print("ranks in a PID namespace (host pid, container pid): " + ", ".join(
                        f"rank {r.rank} {r.pid_text()}" for r in inside), flush=True)

        if watcher.job is None:
            print(f"scout-sys: {watcher.waiting}", file=sys.stderr, flush=True)
        try:
            rc = watcher.run(_emitter(args), stop, on_job=on_job)
        except KeyboardInterrupt:
            rc = 1 if watcher.ever_opened else 0
        if not args.json:
            print("job ended" if watcher.ended else "watch stopped", flush=True)
        return rc
    finally:
        watcher.close(exiting=True)
        sinks.close()
        for m in held:
            print(m, file=sys.stderr)
        if quit_rc is not None:
            _exit_now(quit_rc)


class _Shared:
    """The node's sinks (events file, hooks) fed by every job's watch thread: one event at a time."""

    def __init__(self, sinks: Any, lock: threading.Lock, label: str) -> None:
        self.sinks, self.lock, self.label = sinks, lock, label

    def on_event(self, e: Any) -> None:
        from scout_sys.model import with_job

        with self.lock:
            self.sinks.on_event(with_job(e, self.label))

    def on_snapshot(self, s: Any, took: float) -> None:
        with self.lock:
            self.sinks.on_snapshot(s, took)

    def close(self) -> None:
        pass  # closed once, with the node's watch


def _every_job(args: argparse.Namespace, config: Any) -> int:
    """``watch --every-job``: every job the env: selector covers, each its own watch (watch/node.py)."""
    import dataclasses

    from scout_sys.exporters import Sinks
    from scout_sys.exporters.prometheus import PrometheusExporter
    from scout_sys.watch import Watcher
    from scout_sys.watch.node import NodeWatch

    if not args.job or not args.job.strip().startswith("env:"):
        raise ScoutError("--every-job needs --job env:NAME (or env:NAME=VALUE): the variable every job's ranks "
                         "carry, e.g. env:TORCHELASTIC_RUN_ID for every torchrun job")
    if args.job_name:
        raise ScoutError("--every-job names each job itself (the metrics' job label); leave --job-name out")
    # a job seen once whose ranks never come back must not hold a thread for ever
    config = dataclasses.replace(config, wait_ranks=config.wait_ranks if config.wait_ranks is not None else 60.0)

    def say(m: str) -> None:
        print(f"scout-sys: {m}", file=sys.stderr, flush=True)

    node_sinks = _export_sinks(args, say)
    prom = next((s for s in node_sinks.sinks if isinstance(s, PrometheusExporter)), None)
    others = Sinks([s for s in node_sinks.sinks if s is not prom], say)
    lock = threading.Lock()

    def job_sinks(label: str) -> Any:
        return Sinks([_Shared(others, lock, label), *([prom.job(label)] if prom is not None else [])], say)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    node = NodeWatch(args.job, watcher=lambda key: Watcher(args.job, config, key=key), sinks=job_sinks,
                     emit=_emitter(args), say=say)
    say(f"waiting for jobs whose ranks carry {args.job.strip()[4:]} (every job on this host, each apart); "
        "SIGINT / SIGTERM ends the watch")
    try:
        return node.run(stop)
    except KeyboardInterrupt:
        node.close()
        return 1 if node.ever_opened else 0
    finally:
        node_sinks.close()


def ebpf_off_line(wanted: bool) -> str | None:
    """The one line a watch that wants the eBPF probes (the default) but may not load them says, with
    diagnose's hint; None when they can load, or when --no-ebpf left them out."""
    if not wanted:
        return None
    from scout_sys.errors import SUDO_HINT
    from scout_sys.probes.ebpf._common import EBPF_NEEDS_ROOT, privilege_reason

    if privilege_reason() is None:
        return None
    if os.geteuid() == 0:  # root without the capabilities: a container, or a unit's bounding set
        return ("scout-sys: eBPF probes off: this root lacks CAP_SYS_ADMIN (or CAP_BPF+CAP_PERFMON): add it to "
                "the container (--cap-add) or the unit's CapabilityBoundingSet=")
    return f"scout-sys: eBPF probes off ({EBPF_NEEDS_ROOT}): {SUDO_HINT}; --no-ebpf leaves them out quietly"


def _exit_now(rc: int) -> None:
    """``q``: everything is closed and the probes are handed to their detaching child; skip the
    interpreter's teardown (freeing a 200 MB heap with bcc's LLVM, 0.6-1.2 s on two cores that eight
    spinning ranks keep busy) and give the prompt back now."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
