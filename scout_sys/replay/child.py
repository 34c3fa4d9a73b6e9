"""What a replay worker's child process does between fork and exec (``runner.WorkerSet._spawn``):
die with the monitor, the rank's CPUs and a lower priority, bounded memory, the rank's mount
namespace (a container) and working directory, then the rank's user. Plain system calls only."""

from __future__ import annotations

import ctypes
import os
import resource
import signal
from collections.abc import Callable

from scout_sys.replay.context import Context

_PR_SET_PDEATHSIG = 1
_CLONE_NEWNS = 0x00020000


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def preexec(ctx: Context, data_limit: int | None, mntns_fd: int | None = None, report: int | None = None,
             what: str = "") -> Callable[[], None]:
    """The child's set-up between fork and exec. ``mntns_fd``: an open ``/proc/PID/ns/mnt`` of the
    rank, entered (``setns``) before the user is dropped (it needs CAP_SYS_ADMIN), then the rank's
    working directory inside it. On failure ``what`` (``...{}...``, the reason goes in the braces) is
    written to the pipe ``report`` and the child fails before exec: Popen then raises SubprocessError,
    which carries no reason of its own."""
    libc = _libc()  # loaded here, before fork: the child only calls into it
    setns = getattr(libc, "setns", None) if mntns_fd is not None else None

    def fail(reason: str) -> None:
        if report is not None:
            try:
                os.write(report, what.format(reason).encode()[:4000])
            except OSError:
                pass
        raise OSError(reason)

    def chdir(path: str) -> bool:
        try:
            os.chdir(path)
            return True
        except OSError:
            return False

    def run() -> None:  # in the child, between fork and exec: plain system calls only
        try:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except Exception:  # noqa: BLE001
            pass
        try:
            os.sched_setaffinity(0, ctx.cpus)
        except OSError:
            pass
        try:
            os.setpriority(os.PRIO_PROCESS, 0, ctx.nice)
        except OSError:
            pass

        if data_limit:
            resource.setrlimit(resource.RLIMIT_DATA, (data_limit, data_limit))
        in_cwd = True
        if mntns_fd is not None:
            # os.setns is Python >= 3.12 only; the monitor runs on 3.9+. The child of fork() has one
            # thread and its own fs struct, as setns(CLONE_NEWNS) requires; it lands at the
            # namespace's root, then goes to the rank's directory (Popen's cwd= was "/" of ours).
            if setns is None:
                fail("this C library has no setns()")
            if setns(mntns_fd, _CLONE_NEWNS) != 0:
                fail(os.strerror(ctypes.get_errno()))
            in_cwd = chdir(ctx.cwd)
        if os.geteuid() == 0 and ctx.uid not in (None, 0):  # run as the rank's user, not as root
            if ctx.gid is not None:
                os.setgroups([])
                os.setgid(ctx.gid)
            os.setuid(ctx.uid)
        if not in_cwd and not chdir(ctx.cwd):  # a folder only the rank's user may enter (root-squashed NFS)
            chdir("/")
    return run
