"""`scout-sys replay` and `scout-sys certify` (scout_sys/replay)."""

from __future__ import annotations

import argparse
import json
import os

from scout_sys.cli.common import EXIT_ERROR, EXIT_INCIDENT, EXIT_OK, _job_options
from scout_sys.errors import ScoutError
from scout_sys.extras import require

# --------------------------------------------------------------------------- replay and certify

_REPLAY_EPILOG = """\
examples:
  sudo scout-sys replay --job 12345                     # 2 rounds of kernels beside every device of the job
  sudo scout-sys replay --job 12345 --rounds 3 --json   # one JSON object (scout-sys/diagnosis/v1)
  sudo scout-sys replay --job 12345 --checkpoint ckpt/step_1000/model.pt   # GEMMs on the model's own weights

incidents: sdc (a device computes other bits than the strict majority of its peers), straggler (a
device runs the same kernels slower, in 2 rounds in a row); inconclusive without a strict majority.
Each round is appended to <state dir>/replay/ledger.jsonl, which certify reads.
exit status: 0 every device agrees, 1 incident reported, 2 could not replay (no device gave a
result). The job keeps running; every worker is gone when the command ends (SIGINT / SIGTERM
included). A rank in a container (another mount namespace) gets its worker inside that namespace,
with the rank's own interpreter and torch. See docs/replay.md.
"""

_CERTIFY_EPILOG = """\
examples:
  scout-sys certify ckpt/step_1000                       # a DCP folder, or a folder of per-rank files
  scout-sys certify ckpt/step_900 ckpt/step_1000 --json  # which one to restart from: "recommended"
  scout-sys certify model.safetensors optimizer.pt

  sudo scout-sys certify --job 12345 ckpt/step_1000      # name the running job that wrote it

certified: content clean and a complete clean replay round of the job that wrote it (found in the
ledger: the job a watch saw write it or write in its folder, or whose working directory holds it, while
that job ran; or --job) between the previous checkpoint and this one;
rejected: unreadable, truncated, code-carrying pickle (never executed), NaN/Inf, a divergent replica,
sdc/inconclusive replay of that job in that interval, or an sdc on one of its GPUs (any job, before);
unverified: clean content, no covering round of its job, or no known job wrote it.
Rounds of other jobs never certify or reject a checkpoint. "next:" says what to do.
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
    c.add_argument("--job", default=None, metavar="SEL",
                   help="the running job that wrote them (as replay --job); default: the job of the ledger whose "
                        "checkpoint or working directory holds each path")
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
                     state_dir=args.state_dir or default_state_dir(), covers=args.checkpoint)
    d = res.diagnosis
    if args.json:
        out = d.to_json()
        out["replay"] = {"rounds": [[x.to_json() for x in rnd] for rnd in res.rounds]}
        print(json.dumps(out))
    else:
        print(render_replay(res, verbose=not args.quiet))
    if res.rounds and res.rounds[-1] and all(x.error for x in res.rounds[-1]):
        return EXIT_ERROR  # no device gave a result (each one's error is in the notes): nothing was replayed
    return EXIT_OK if d.healthy else EXIT_INCIDENT


def _certify(args: argparse.Namespace) -> int:
    require("scout-sys certify", "replay", ("torch",))  # safetensors: when a .safetensors file is read
    from scout_sys.replay.certify import certify, render_certificate
    from scout_sys.watch.bundle import default_state_dir

    ident = None
    if args.job:
        from scout_sys.job import find_job
        from scout_sys.replay.ledger import identity

        ident = identity(find_job(args.job))
    cert = certify(args.paths, state_dir=args.state_dir or default_state_dir(), job=ident)
    print(json.dumps(cert) if args.json else render_certificate(cert))
    return EXIT_OK if all(c["status"] == "certified" for c in cert["checkpoints"]) else EXIT_INCIDENT
