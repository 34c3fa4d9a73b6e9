"""Finding the job's rank processes while the job lives: at start-up and across restarts.

``watch`` is often started in the same second as the job (``torchrun ... & scout-sys watch --job $!``),
before the launcher has forked a single rank. :class:`RankFinder` then waits — cheaply, one look
every ``look_every`` seconds — for as long as the selected process lives (or ``wait_ranks`` seconds),
and hands over the job once every rank expected on this host is there (as the launcher's own
environment says: scout_sys/launchers.py), or ``grace`` seconds after the first one appeared. The same rule follows an
elastic restart: new pids for the same ranks.

An ``env:NAME=VALUE`` selector names no process to outlive: a Slurm prolog or batch script starts the
watch before any process of the job step exists. The watch then waits until ranks with that variable
appear, without bound unless ``wait_ranks`` says otherwise; SIGINT / SIGTERM (the epilog) end it.

The finder is a part of the watch loop: ``now`` in, a decision out; finding processes and asking
whether one lives are passed in, so it is tested on a fake clock.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from scout_sys.errors import NoRanks, ScoutError, TargetGone
from scout_sys.model import Job

GRACE = 10.0  # seconds to wait for every rank once the first one appeared
LOOK_EVERY = 0.5

WAITING, FOUND, SAME, ENDED = "waiting", "found", "same", "ended"


@dataclass(frozen=True)
class Found:
    status: str  # WAITING | FOUND (job) | SAME (the ranks we follow) | ENDED (nothing left)
    job: Job | None = None
    note: str = ""


def alive(pid: int) -> bool:
    """The process exists and has not exited (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def env_pids(selector: str) -> list[int]:
    """``env:NAME=VALUE``: every process (ranks, their launcher, the batch script) whose environment
    holds NAME=VALUE (``env:NAME``: NAME with any value); unreadable ones are skipped."""
    name, eq, value = selector.strip()[4:].partition("=")
    needle, prefix = f"{name}={value}".encode(), f"{name}=".encode()
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    items = f.read().split(b"\0")
                if needle in items if eq else any(v.startswith(prefix) for v in items):
                    out.append(int(entry))
            except OSError:
                continue
    return out


def selector_pids(selector: str) -> list[int]:
    """The processes the selector names: the selected pid, a process group's members, or (``env:``) the
    processes whose environment holds the variable."""
    sel = selector.strip()
    if sel.startswith("env:"):
        return env_pids(sel)
    if sel.startswith("pgid:"):
        from scout_sys.job import group_members

        try:
            return [p.pid for p in group_members(int(sel[5:]))]
        except ValueError:
            return []
    try:
        return [int(p) for p in sel.split(",") if p.strip()]
    except ValueError:
        return []


def _lives(selector: str) -> bool:
    """Whether the wait for ranks goes on: as long as a selected process lives; always for ``env:``
    (nothing of the job may exist yet: see the module's docstring)."""
    if selector.strip().startswith("env:"):
        return True
    return any(alive(p) for p in selector_pids(selector))


class RankFinder:
    def __init__(self, selector: str, find: Callable[[str], Job], *, wait_ranks: float | None = None,
                 grace: float = GRACE, look_every: float = LOOK_EVERY,
                 lives: Callable[[str], bool] | None = None) -> None:
        self.selector = selector
        self.find = find
        self.wait_ranks = wait_ranks
        self.grace = grace
        self.look_every = look_every
        self.lives = lives or _lives
        self.launcher_pid: int | None = None
        self._started: float | None = None
        self._first_seen: float | None = None
        self._last_look: float | None = None
        self._seen: int | None = None  # how many ranks the last look found (start-up)

    # ------------------------------------------------------------------ start-up
    def first(self, now: float) -> Found:
        """Look for the job's ranks. Raises :class:`TargetGone` / :class:`BadSelector` when the
        selector names nothing, :class:`NoRanks` when it ended, or the wait ran out, with no rank."""
        if self._started is None:
            self._started = now
        if self._last_look is not None and now - self._last_look < self.look_every:
            return Found(WAITING)
        self._last_look = now
        try:
            job = self.find(self.selector)
        except NoRanks as e:
            if not self.lives(self.selector):
                raise NoRanks(f"--job {self.selector} ended without ever starting a rank process") from e
            if self.wait_ranks is not None and now - self._started >= self.wait_ranks:
                raise NoRanks(f"no rank processes appeared under --job {self.selector} within "
                              f"{self.wait_ranks:g} s (--wait-ranks)") from e
            if self.selector.strip().startswith("env:"):
                return Found(WAITING, note=f"none yet with {self.selector.strip()[4:]}; SIGINT / SIGTERM ends the watch")
            return Found(WAITING)
        except TargetGone:
            if self._first_seen is None and now > self._started:
                raise NoRanks(f"--job {self.selector} ended without ever starting a rank process") from None
            raise
        return self._complete(job, now)

    def _complete(self, job: Job, now: float) -> Found:
        """Hand over ``job`` once all its expected ranks are there, or after the grace period."""
        self._first_seen = self._first_seen or now
        if (job.missing or job.unplaced) and now - self._first_seen < self.grace:
            n = len(job.ranks) + len(job.missing) + job.unplaced
            return Found(WAITING, note=f"{len(job.ranks)} of {n} ranks started")
        # ranks of the job not seen here, and nothing says they live elsewhere: hand over once two looks
        # agree on the ranks found (a launcher that starts its ranks one by one has finished forking)
        seen, self._seen = self._seen, len(job.ranks)
        if job.remote and not job.missing and seen != len(job.ranks) and now - self._first_seen < self.grace:
            return Found(WAITING, note=f"{len(job.ranks)} ranks started so far")
        self._first_seen, self._seen = None, None
        if job.launcher_pid:
            self.launcher_pid = job.launcher_pid
        return Found(FOUND, job)

    # ------------------------------------------------------------------ restarts
    def follow(self, job: Job, now: float) -> Found:
        """Some of ``job``'s ranks are gone: has the job restarted (new pids), ended, or are the same
        processes still the ones to judge?"""
        if self._last_look is not None and now - self._last_look < 1.0:
            return Found(SAME)
        self._last_look = now
        old = {r.pid for r in job.ranks}
        for sel in dict.fromkeys(s for s in (self.selector, str(self.launcher_pid or "")) if s):
            try:
                new = self.find(sel)
            except ScoutError:
                continue
            if {r.pid for r in new.ranks} - old:
                found = self._complete(new, now)
                if found.status == FOUND:
                    return Found(FOUND, found.job, f"job restarted: following {len(new.ranks)} new rank processes")
                return found
            self._first_seen = None
            return Found(SAME)
        if self.launcher_pid and alive(self.launcher_pid):
            return Found(SAME)  # the launcher lives on (between two elastic restarts): judge what is there
        return Found(ENDED)
