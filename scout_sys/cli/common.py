"""What every verb shares: exit statuses, the parser that errs in one line, the job options."""

from __future__ import annotations

import argparse
import os
import sys
from typing import IO

from scout_sys.errors import ScoutError

EXIT_OK, EXIT_INCIDENT, EXIT_ERROR = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse's own convention too)
        self.print_usage(sys.stderr)
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


def _job_options(p: argparse.ArgumentParser, *, required: bool = True, topology: bool = True) -> None:
    p.add_argument("--job", required=required, metavar="SEL",
                   help="PID of the launcher or of any rank, pgid:N, env:NAME=VALUE (ranks whose environment holds it, "
                        "e.g. env:SLURM_JOB_ID=1234), env:NAME (ranks that have NAME at all, e.g. env:TORCHELASTIC_RUN_ID: "
                        "whatever torchrun job runs on this host), or PID,PID,... of rank processes")
    if not topology:
        return
    p.add_argument("--topology", default=None, metavar="LAYOUT",
                   help="the parallel layout, e.g. dp=4,pp=2 or dp=2,tp=2,pp=2,order=megatron (orders: mesh "
                        "(default: as written, last fastest), megatron, deepspeed, torchtitan; see "
                        "docs/layouts.md). Default: read from Megatron-Core / DeepSpeed / TorchTitan command "
                        "lines, else read from the process groups learned from the ranks (their TCP connections; "
                        "NCCL communicator creation, eBPF, when watched from the start), else guessed from the ranks' activity")


def _open_output(path: str | None) -> IO[str] | None:
    """``--output FILE``, opened before the window so that a bad path costs no sampling (exit 2)."""
    if path is None:
        return None
    from scout_sys.files import private_dirs, private_opener

    try:
        private_dirs(os.path.dirname(os.path.abspath(path)))
        return open(path, "w", encoding="utf-8", opener=private_opener)
    except OSError as e:
        raise ScoutError(f"--output {path}: {e.strerror or e}") from None


def _save(out: IO[str] | None, text: str) -> None:
    """Write the report to ``--output``'s file, on disk before the verdict is printed."""
    if out is None:
        return
    out.write(text + "\n")
    out.flush()
    os.fsync(out.fileno())
    print(f"scout-sys: saved to {out.name} (reopen: scout-sys watch --report {out.name})", file=sys.stderr)
