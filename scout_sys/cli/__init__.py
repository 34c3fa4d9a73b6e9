"""Command line: argument parsing and output only. The work is in job / monitor / consensus.

One module per family of verbs: ``watch.py``, ``cluster.py``, ``replay.py``; ``common.py`` what they share."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import replace

from scout_sys import __version__
from scout_sys.cli.cluster import _agent, _agent_parser, _cluster_options, _diagnose_cluster, _watch_cluster
from scout_sys.cli.common import (
    EXIT_ERROR,
    EXIT_INCIDENT,
    EXIT_OK,
    _job_options,
    _open_output,
    _Parser,
    _save,
)
from scout_sys.cli.replay import _certify, _replay, _replay_parsers
from scout_sys.cli.watch import _WATCH_EPILOG, _export_options, _watch
from scout_sys.errors import ScoutError
from scout_sys.extras import MissingExtra, require

__all__ = ["EXIT_ERROR", "EXIT_INCIDENT", "EXIT_OK", "build_parser", "main"]

_DIAGNOSE_EPILOG = """\
examples:
  sudo scout-sys diagnose --job 12345            # torchrun's pid, or any rank's pid
  sudo scout-sys diagnose --job pgid:12345       # every process of a process group
  sudo scout-sys diagnose --job 101,102,103,104  # explicit rank processes
  sudo scout-sys diagnose --job 12345 --json | jq .incidents
  sudo scout-sys diagnose --job 12345 --output /var/tmp/scout-12345.json   # the verdict, and the evidence saved
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
    d.add_argument("--output", metavar="FILE",
                   help="also save the verdict with every stack as one JSON object (scout-sys/diagnosis/v1) to FILE, "
                        "opened by scout-sys itself (as root under sudo; mode 0600) and written before the verdict is "
                        "printed: evidence that outlives the job; reopen with watch --report FILE")
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
                   help="suspect a hang after this long without progress, then a short stack window decides "
                        "(default: adapts to the job, 2.5x its recent steady progress gap (90th percentile), at "
                        "least 1.5 s; a repeating pause of known length, e.g. checkpoints, waits longer)")
    w.add_argument("--interval", type=float, default=0.5, metavar="SECONDS", help="poll period (default: 0.5)")
    w.add_argument("--headless", action="store_true", help="print events instead of drawing the dashboard")
    w.add_argument("--json", action="store_true", help="with --headless: one JSON object per line per event")
    w.add_argument("--state-dir", default=None, metavar="DIR",
                   help="where evidence bundles go (default: /var/lib/scout-sys as root, else ~/.local/state/scout-sys)")
    w.add_argument("--ebpf", action=argparse.BooleanOptionalAction, default=True,
                   help="attach the eBPF probes in the background (default: on; --no-ebpf leaves them out)")
    w.add_argument("--wait-ranks", type=float, default=None, metavar="SECONDS",
                   help="when the job has no rank yet (watch started with the launcher), wait at most this long "
                        "for its ranks (default: as long as the selected process lives; with env:NAME=VALUE, which a "
                        "Slurm prolog starts before the job step, until ranks with it appear)")
    w.add_argument("--replay", action=argparse.BooleanOptionalAction, default=True,
                   help="replay rounds (docs/replay.md): one after each checkpoint the job's ranks write, so that "
                        "certify can certify the next one (low priority, bounded duty cycle, skipped when the host is "
                        "busy), and one when a straggler is confirmed, to tell a slow device from a slow network or "
                        "input pipeline (default: on; --no-replay turns all of it off)")
    w.add_argument("--replay-every", type=float, default=None, metavar="SECONDS",
                   help="also run a replay round every so many seconds (sdc: silent data corruption; default: off)")
    w.add_argument("--every-job", action="store_true",
                   help="with --job env:NAME: follow every job on this host whose ranks carry NAME, each apart (its "
                        "own incidents, probes and bundles; events and metrics labelled with its job), new ones as "
                        "they start, until stopped: one monitor for the node (docs/deploy.md); implies --headless")
    _export_options(w)
    _cluster_options(w, "watch")

    sub.add_parser("doctor", help="check eBPF, py-spy, ptrace and NVML prerequisites and say how to fix them",
                   description="One line per check: OK, MISSING (needed) or OFF (optional: that signal is off), "
                               "then what was found or the fix. Reads only; changes nothing.",
                   epilog="exit status: 0 everything needed is usable, 1 a needed prerequisite is missing (eBPF "
                          "probes off; diagnose still works from /proc and stacks).")
    _agent_parser(sub)
    _replay_parsers(sub)
    return p


def _diagnose(job_sel: str, window: float, *, as_json: bool, native: bool, quiet: bool, ebpf: bool,
              topology: str | None = None, output: str | None = None) -> int:
    from scout_sys.job import find_job
    from scout_sys.monitor import Monitor, default_probes
    from scout_sys.report import render, to_json

    if window <= 0:
        raise ScoutError("--window must be positive")
    job = find_job(job_sel, topology)
    out = _open_output(output)
    try:
        mon = Monitor(job, extra_probes=default_probes(ebpf))
        mon.start()
        try:
            mon.wait_started()
            if ebpf and not quiet:  # compiling took seconds: say when the window itself begins
                print(f"scout-sys: probes ready; sampling {len(job.ranks)} ranks for {window:g} s", file=sys.stderr)
            d = mon.diagnose(window, native=native)
        finally:
            # the answer must not wait for the kernel: unregistering the collective probe's dozens of
            # uprobes takes ~0.1 s each (5 s here); a short-lived child detaches them after we exit
            mon.close(background=True)
        if not ebpf:
            d = replace(d, probes={**d.probes, "ebpf": "not requested (--ebpf)"})
        _save(out, to_json(d))  # first: the evidence is safe before anything is printed
    finally:
        if out is not None:
            out.close()
    print(to_json(d) if as_json else render(d, verbose=not quiet))
    return EXIT_OK if d.healthy else EXIT_INCIDENT


def _demo(args: argparse.Namespace) -> int:
    require("scout-sys demo", "all", ("torch",))  # its trainer runs with this interpreter
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
        if args.cmd == "agent":
            return _agent(args)
        if args.cmd == "diagnose" and (args.cluster or args.token_file):
            return _diagnose_cluster(args)
        if args.cmd == "diagnose":
            if not args.job:
                raise ScoutError("diagnose needs --job SEL (this host) or --cluster HOST:PORT (every host)")
            return _diagnose(args.job, args.window, as_json=args.json, native=args.native, quiet=args.quiet,
                             ebpf=args.ebpf, topology=args.topology, output=args.output)
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
    except MissingExtra as e:
        print(e, file=sys.stderr)
        return EXIT_ERROR
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

