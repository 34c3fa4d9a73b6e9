"""The dashboard's commands that call into the source beside its polls: ``d`` diagnose now, ``s``
save the report, ``r`` a replay round (tui/app.py mixes them into :class:`~scout_sys.tui.app.ScoutApp`).
The calls run in worker threads under the app's lock (one call into the source at a time) and post
their result back as a message; only the message handlers touch the screen."""

from __future__ import annotations

import threading
from typing import Any

from rich.text import Text
from textual import work
from textual.message import Message

from scout_sys.errors import ScoutError
from scout_sys.model import Diagnosis
from scout_sys.report import render
from scout_sys.tui.source import Source, save_report
from scout_sys.tui.widgets import TextScreen


class Diagnosed(Message):
    def __init__(self, diagnosis: Diagnosis | None, error: BaseException | None) -> None:
        super().__init__()
        self.diagnosis = diagnosis
        self.error = error


class Saved(Message):
    def __init__(self, paths: tuple[str, str] | None, error: BaseException | None) -> None:
        super().__init__()
        self.paths = paths
        self.error = error


class Commands:
    """``d``, ``s`` and ``r``: for an App that has these members (ScoutApp)."""

    source: Source
    save_dir: str | None
    snapshot: Any
    note: str
    last_diagnosis: Diagnosis | None
    last_saved: tuple[str, str] | None
    incidents_seen: set[str]
    _lock: threading.Lock
    _diagnosing: bool

    def action_replay(self) -> None:
        """Start a replay round beside the job (its sdc / straggler findings arrive as incidents)."""
        if not self.source.can_replay:
            self.notify("replay needs a live job", markup=False)
        elif self.source.replay_now():
            self.notify("replay round started: its findings arrive as incidents", markup=False, timeout=5)
        else:
            self.notify("a replay round is already running (or replay is off)", markup=False)

    def action_diagnose(self) -> None:
        if self._diagnosing:
            self.notify("a diagnosis is already running", markup=False)
            return
        self._diagnosing = True
        self.note = "diagnosing…"
        self._diagnose()

    @work(thread=True, group="diagnose", exit_on_error=False)
    def _diagnose(self) -> None:
        try:
            with self._lock:
                d = self.source.diagnose_now(3.0)
            self.post_message(Diagnosed(d, None))
        except Exception as e:  # noqa: BLE001 - reported to the person, the dashboard goes on
            self.post_message(Diagnosed(None, e))

    def on_diagnosed(self, msg: Diagnosed) -> None:
        self._diagnosing = False
        self.note = ""
        if msg.error is not None or msg.diagnosis is None:
            self.notify(f"diagnose failed: {msg.error}", severity="error", markup=False)
            return
        self.last_diagnosis = msg.diagnosis
        for inc in msg.diagnosis.incidents:
            self.incidents_seen.add(inc.id or f"{inc.kind}:{inc.ranks}")
        verdict = "healthy" if msg.diagnosis.healthy else f"{len(msg.diagnosis.incidents)} incident(s)"
        self.push_screen(TextScreen(f"diagnosis: {verdict}", Text(render(msg.diagnosis))))

    def action_save(self) -> None:
        if self.snapshot is None:
            self.notify("nothing to save yet", markup=False)
            return
        self._save(self.snapshot)

    @work(thread=True, group="save", exit_on_error=False)
    def _save(self, snap: Any) -> None:
        try:
            self.post_message(Saved(save_report(snap, self.save_dir), None))
        except (OSError, ScoutError) as e:
            self.post_message(Saved(None, e))

    def on_saved(self, msg: Saved) -> None:
        if msg.paths is None:
            self.notify(f"could not save the report: {msg.error}", severity="error", markup=False)
            return
        self.last_saved = msg.paths
        self.notify(f"report saved: {msg.paths[0]}\n{msg.paths[1]}", markup=False, timeout=8)
