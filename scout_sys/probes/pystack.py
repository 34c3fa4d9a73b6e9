"""Python stacks via py-spy: ``py-spy dump --nonblocking --json``, every thread, all ranks in parallel.

``--nonblocking`` reads the target's memory without pausing it: blocking sampling slows a PyTorch
process with many threads by 5-15x and has left processes stopped. A native dump (``--native``,
which must pause the target) is taken only when asked for, i.e. once a hang is confirmed, since
pausing a hung rank costs nothing. Each dump has a timeout so one wedged rank cannot wedge us.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from scout_sys.errors import SUDO_HINT, PermissionDenied
from scout_sys.model import Frame, Job, StackSample, ThreadStack


def find_py_spy() -> str | None:
    """py-spy next to our interpreter (the venv), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("py-spy")


def parse_dump(text: str) -> tuple[ThreadStack, ...]:
    """Parse ``py-spy dump --json`` output (a list of threads, frames innermost first)."""
    threads = []
    for t in json.loads(text):
        frames = tuple(
            Frame(function=str(f.get("name", "?")), file=str(f.get("filename", "?")), line=int(f.get("line") or 0))
            for f in t.get("frames", [])
        )
        threads.append(
            ThreadStack(
                tid=int(t.get("os_thread_id") or t.get("thread_id") or 0),
                name=str(t.get("thread_name") or ""),
                active=bool(t.get("active")),
                frames=frames,
            )
        )
    return tuple(threads)


DENIALS = ("ermission", "EPERM", "ptrace")  # py-spy's words for "may not read this process"


def _is_denial(error: str) -> bool:
    """py-spy's message says it may not read the process (rather than: it is gone, or unreadable)."""
    return any(w in error for w in DENIALS)


def check_access(obs: Sequence[object]) -> None:
    """No stack of any rank could be read for lack of permission: raise PermissionDenied (one line, exit
    2) instead of deciding from nothing."""
    stacks = [o for o in obs if isinstance(o, StackSample)]
    if stacks and all(s.denied for s in stacks):
        raise PermissionDenied(f"py-spy may not read the ranks' memory ({stacks[0].error}): {SUDO_HINT}")


def dump(pid: int, *, native: bool = False, timeout: float = 2.0, py_spy: str | None = None) -> StackSample:
    """One stack dump of one process. Errors are returned in the sample, never raised."""
    exe = py_spy or find_py_spy()
    now = time.time()
    if exe is None:
        return StackSample(time=now, rank=-1, pid=pid, error="py-spy not found")
    cmd = [exe, "dump", "--pid", str(pid), "--json"]
    cmd += ["--native"] if native else ["--nonblocking"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return StackSample(time=now, rank=-1, pid=pid, error=f"py-spy timed out after {timeout:g}s")
    except OSError as e:
        return StackSample(time=now, rank=-1, pid=pid, error=f"py-spy failed: {e}")
    if out.returncode != 0:
        msg = (out.stderr or out.stdout).strip().splitlines()
        error = (msg[-1] if msg else f"exit {out.returncode}")[:300]
        return StackSample(time=now, rank=-1, pid=pid, error=error, denied=_is_denial(error))
    try:
        threads = parse_dump(out.stdout)
    except (ValueError, TypeError, AttributeError) as e:
        return StackSample(time=now, rank=-1, pid=pid, error=f"unreadable py-spy output: {e}")
    return StackSample(time=now, rank=-1, pid=pid, threads=threads, native=native)


class StackDumper:
    """Python stacks of the ranks' threads, on demand (``py-spy dump --nonblocking``: never pauses the
    job; ``native=True`` does pause it for a moment, used only for ranks already hung)."""

    name = "stack"

    def __init__(self, *, timeout: float = 2.0, max_workers: int = 16) -> None:
        self.timeout = timeout
        self.max_workers = max_workers
        self._ranks: list[tuple[int, int]] = []
        self._exe = find_py_spy()
        self._pool: ThreadPoolExecutor | None = None

    def check(self) -> str | None:
        if self._exe is None:
            return "py-spy not found (make installs it into .venv; or pip install py-spy)"
        return None

    def start(self, job: Job) -> None:
        self._ranks = [(r.rank, r.pid) for r in job.ranks]
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(self.max_workers, len(self._ranks))),
                                        thread_name_prefix="py-spy")

    def dump(self, ranks: set[int] | None = None, *, native: bool = False) -> list[StackSample]:
        """One dump of each of ``ranks`` (default: every rank), in parallel."""
        if self._pool is None or self._exe is None:
            return []
        todo = [(r, p) for r, p in self._ranks if ranks is None or r in ranks]
        timeout = self.timeout * (3 if native else 1)
        futs = [(r, self._pool.submit(dump, p, native=native, timeout=timeout, py_spy=self._exe)) for r, p in todo]
        return [replace(f.result(), rank=r) for r, f in futs]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
