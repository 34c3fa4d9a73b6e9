"""The small exception tree of scout-sys (after psutil's Error → NoSuchProcess / AccessDenied).

The library raises; only ``scout_sys.cli`` turns an error into a message and an exit status.
"""

from __future__ import annotations


class ScoutError(Exception):
    """Base of every error scout-sys raises on purpose. ``str(e)`` is one line for a person."""

    def __init__(self, msg: str, *, pid: int | None = None, rank: int | None = None) -> None:
        super().__init__(msg)
        self.pid = pid
        self.rank = rank


class BadSelector(ScoutError):
    """The job selector could not be parsed."""


class TargetGone(ScoutError):
    """A process named by the user does not exist (or is already gone)."""


class NoRanks(ScoutError):
    """The selector names processes, but none of them is a rank of a distributed job."""


class PermissionDenied(ScoutError):
    """We may not read what we need. The message says how to fix it."""


class ProbeUnavailable(ScoutError):
    """A probe cannot run here (missing tool, kernel feature or permission)."""


SUDO_HINT = "run as root: sudo scout-sys ...; in a container add --cap-add SYS_PTRACE"


class BadToken(ScoutError):
    """The cluster token is missing, unreadable, or not the one the store's run was signed with."""


class StoreUnreachable(ScoutError):
    """The cluster's c10d store (hosted by the agent of node rank 0) cannot be reached in time."""
