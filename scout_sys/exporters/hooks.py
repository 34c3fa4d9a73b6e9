"""``watch --on-incident CMD``: run a command for each incident event, off the poll loop.

CMD runs through ``/bin/sh -c`` with the event's JSON (exactly the line ``watch --headless --json``
prints) on stdin and ``SCOUT_SYS_EVENT``, ``SCOUT_SYS_INCIDENT``, ``SCOUT_SYS_KIND``, ``SCOUT_SYS_STATUS``,
``SCOUT_SYS_RANKS``, ``SCOUT_SYS_HOSTS``, ``SCOUT_SYS_BUNDLE`` and ``SCOUT_SYS_JOB`` in its environment, in its own process
group. At most ``workers`` run at once and ``backlog`` wait; beyond that an event's hook is skipped and
said so. A hook still running at its timeout is killed with its whole process group (SIGTERM, then
SIGKILL). Every outcome — exit status, time, the tail of its stderr — goes to ``say``; a failing hook
is reported, never fatal.

Run as root, the watch runs hooks as ``nobody`` unless told which user (``user``): a hook gets the
watch's privileges only when asked for them.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from scout_sys.errors import ScoutError
from scout_sys.model import Event, Snapshot
from scout_sys.report import printable

KILL_GRACE = 2.0  # seconds between SIGTERM and SIGKILL to a hook's process group
STDERR_TAIL = 400  # characters of a hook's stderr kept in its log line


def hook_env(e: Event) -> dict[str, str]:
    inc = e.incident
    return {
        "SCOUT_SYS_EVENT": e.event,
        "SCOUT_SYS_INCIDENT": inc.id,
        "SCOUT_SYS_KIND": inc.kind,
        "SCOUT_SYS_STATUS": inc.status,
        "SCOUT_SYS_RANKS": ",".join(map(str, inc.ranks)),
        "SCOUT_SYS_HOSTS": ",".join(inc.hosts),
        "SCOUT_SYS_BUNDLE": e.bundle or "",
        "SCOUT_SYS_JOB": getattr(e, "job", None) or "",  # watch --every-job: which job (else empty)
    }


def _run_as(user: str | None) -> dict[str, Any]:
    """Popen keywords that run the hook as ``user`` (root's default: nobody); {} to keep our own."""
    if os.geteuid() != 0:
        if user is not None and user != pwd.getpwuid(os.geteuid()).pw_name:
            raise ScoutError(f"--on-incident-user {user}: only root may run hooks as another user")
        return {}
    name = user or "nobody"
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise ScoutError(f"--on-incident-user {name}: no such user") from None
    if pw.pw_uid == 0:
        return {}
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": os.getgrouplist(name, pw.pw_gid),
            "cwd": "/", "home": pw.pw_dir}


class HookRunner:
    """The sink: one hook run per incident event (``incident_opened`` only unless ``all_events``)."""

    def __init__(self, cmd: str, *, timeout: float = 60.0, all_events: bool = False, user: str | None = None,
                 workers: int = 4, backlog: int = 32, say: Callable[[str], None] = print) -> None:
        if timeout <= 0:
            raise ScoutError("--on-incident-timeout must be positive")
        self.cmd = cmd
        self.timeout = timeout
        self.all_events = all_events
        self.say = say
        self._as = _run_as(user)
        self.user = user or ("nobody" if self._as else None)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hook")
        self._slots = threading.BoundedSemaphore(workers + backlog)
        self.ran = 0
        self.failed = 0
        self._lock = threading.Lock()

    def on_event(self, e: Event) -> None:
        if getattr(e, "incident", None) is None:  # watch --cluster's agent events: --events and metrics only
            return
        if e.event != "incident_opened" and not self.all_events:
            return
        if not self._slots.acquire(blocking=False):
            self.say(f"scout-sys: hook for {e.incident.id} {e.event} skipped: too many hooks running or waiting")
            return
        self._pool.submit(self._guarded, e)

    def on_snapshot(self, s: Snapshot, took: float) -> None:
        pass

    def close(self) -> None:
        """Let running and waiting hooks finish (each bounded by its timeout)."""
        self._pool.shutdown(wait=True)

    def _guarded(self, e: Event) -> None:
        try:
            self.say(self._run(e))
        except Exception as x:  # noqa: BLE001 - a hook that cannot even start is reported
            with self._lock:
                self.failed += 1
            self.say(f"scout-sys: hook for {e.incident.id} {e.event} could not run: {x}")
        finally:
            self._slots.release()

    def _run(self, e: Event) -> str:
        env = {**os.environ, **hook_env(e)}
        kw = dict(self._as)
        if "home" in kw:
            env["HOME"] = kw.pop("home")
        t0 = time.monotonic()
        p = subprocess.Popen(["/bin/sh", "-c", self.cmd], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, start_new_session=True, env=env, **kw)
        data = (json.dumps(e.to_json()) + "\n").encode()
        killed = False
        try:
            _out, err = p.communicate(data, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            killed = True
            err = self._kill(p)
        took = time.monotonic() - t0
        with self._lock:
            self.ran += 1
            self.failed += bool(killed or p.returncode)
        head = f"scout-sys: hook for {e.incident.id} {e.event}"
        if killed:
            line = f"{head}: killed at its {self.timeout:g} s timeout"
        elif p.returncode < 0:
            line = f"{head}: killed by signal {-p.returncode} after {took:.1f} s"
        else:
            line = f"{head}: exit {p.returncode} in {took:.1f} s"
        tail = printable((err or b"").decode(errors="replace").strip()[-STDERR_TAIL:].replace("\n", " | "))
        return f"{line}; stderr: {tail}" if tail else line

    def _kill(self, p: subprocess.Popen[bytes]) -> bytes:
        """SIGTERM the hook's process group, SIGKILL it after a grace; what it wrote to stderr."""
        for sig, wait in ((signal.SIGTERM, KILL_GRACE), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                return p.communicate(timeout=wait)[1] or b""
            except subprocess.TimeoutExpired:
                continue
        # something that left the group still holds its stderr open: stop reading
        if p.stderr is not None:
            p.stderr.close()
        p.wait()
        return b""


__all__ = ["HookRunner", "hook_env"]
