"""``watch --events FILE``: every event, one JSON line each (exactly what ``--headless --json`` prints),
appended to FILE — beside the dashboard too.

A writer thread appends and fsyncs each line, so a slow or stuck disk never holds up the poll. The file
is created 0600 (``--group``: 0640, see scout_sys/files.py). For log rotation, move the file away and
send the watch SIGHUP (logrotate's ``postrotate``): the next line goes to a fresh FILE, none is lost.
"""

from __future__ import annotations

import json
import os
import queue
import threading
from collections.abc import Callable
from typing import IO

from scout_sys.errors import ScoutError
from scout_sys.files import private_dirs, private_opener
from scout_sys.model import Event, Snapshot

REOPEN_WITHIN = 0.5  # seconds: a SIGHUP reopens FILE this soon even when no event comes
BACKLOG = 10_000  # lines waiting for the disk before new ones are dropped (and counted)
_STOP = object()


class EventsFile:
    """The sink. ``reopen()`` may be called from a signal handler: it only sets a flag."""

    def __init__(self, path: str, *, say: Callable[[str], None] = print) -> None:
        self.path = os.path.abspath(path)
        self.say = say
        self.written = 0
        self.dropped = 0
        self._said_at = -1
        self._reopen = threading.Event()
        try:
            private_dirs(os.path.dirname(self.path))
            self._f: IO[str] = self._open()
        except OSError as e:
            raise ScoutError(f"--events {path}: {e.strerror or e}") from None
        self._q: queue.Queue[object] = queue.Queue(BACKLOG)
        self._thread = threading.Thread(target=self._write_all, name="events-file", daemon=True)
        self._thread.start()

    def _open(self) -> IO[str]:
        return open(self.path, "a", encoding="utf-8", opener=private_opener)

    def on_event(self, e: Event) -> None:
        try:
            self._q.put_nowait(json.dumps(e.to_json()))
        except queue.Full:
            self.dropped += 1

    def on_snapshot(self, s: Snapshot, took: float) -> None:
        pass

    def reopen(self) -> None:
        self._reopen.set()

    def close(self) -> None:
        self._q.put(_STOP)
        self._thread.join()
        if self.dropped:
            self.say(f"scout-sys: {self.dropped} events were not written to {self.path} (the disk was too slow)")

    def _reopen_now(self) -> None:
        try:
            self._reopen.clear()
            self._f.close()
            self._f = self._open()
        except OSError as e:
            self._reopen.set()  # try again with the next line (which says so when it fails too)
            if not self._f.closed or self.written == self._said_at:
                return
            self._said_at = self.written  # once per stretch of failures, not every REOPEN_WITHIN
            self.say(f"scout-sys: cannot reopen {self.path}: {e.strerror or e}")

    def _write_all(self) -> None:
        while True:
            try:
                item = self._q.get(timeout=REOPEN_WITHIN)
            except queue.Empty:  # no event: still honour a SIGHUP now (a fresh FILE where logrotate expects it)
                if self._reopen.is_set():
                    self._reopen_now()
                continue
            if item is _STOP:
                self._f.close()
                return
            try:
                if self._reopen.is_set():
                    self._reopen.clear()
                    self._f.close()
                    self._f = self._open()
                self._f.write(f"{item}\n")
                self._f.flush()
                os.fsync(self._f.fileno())
                self.written += 1
            except (OSError, ValueError) as e:
                self.dropped += 1
                if self._f.closed:  # a reopen failed: try again with the next line
                    self._reopen.set()
                self.say(f"scout-sys: cannot write to {self.path}: {getattr(e, 'strerror', None) or e}")


__all__ = ["EventsFile"]
