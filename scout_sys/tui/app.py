"""``scout-sys watch``'s dashboard: the whole job at a glance, the culprit highlighted, the evidence
one key away.

The app renders :class:`~scout_sys.tui.source.Source` snapshots. Polling runs in a worker thread that
never touches widgets: it posts :class:`Polled` back, and the next poll is armed (``set_timer``) only
after that message was handled, so polls never overlap; snapshots that arrive faster than the screen
refreshes are merged (only the newest is drawn). The source is called from one thread at a time
(polls and ``diagnose now`` share a lock).
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Footer, Input, Tree

from scout_sys.errors import NoRanks, ScoutError, TargetGone
from scout_sys.model import Diagnosis, Event, Incident, Snapshot
from scout_sys.report import printable
from scout_sys.text import agent_event, compress
from scout_sys.tui.cells import grid_cells
from scout_sys.tui.chains import chains_text
from scout_sys.tui.commands import Commands
from scout_sys.tui.grid import RankGrid
from scout_sys.tui.source import Source, check_source
from scout_sys.tui.state import (
    TIMING_ROWS,
    group_stacks,
    median_series,
    overall,
    parse_filter,
    peers_title,
    suspects,
    timing_rows,
)
from scout_sys.tui.widgets import (
    DevicePanel,
    HeaderBar,
    IncidentTree,
    Legend,
    StackTree,
    TextScreen,
    TimingPanel,
    help_text,
    incident_details,
    rank_details,
)

EXIT_OK, EXIT_INCIDENT = 0, 1


class Polled(Message):
    """A poll finished (in the worker): the new snapshot and events, or the error."""

    def __init__(self, snapshot: Any, events: Sequence[Any], error: BaseException | None, took: float) -> None:
        super().__init__()
        self.snapshot = snapshot
        self.events = events
        self.error = error
        self.took = took


class ScoutApp(Commands, App[int]):
    CSS_PATH = "scout.tcss"
    TITLE = "scout-sys"
    AUTO_FOCUS = "RankGrid"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("d", "diagnose", "diagnose now"),
        Binding("s", "save", "save report"),
        Binding("r", "replay", "replay now", show=False),
        Binding("slash", "filter", "filter"),
        Binding("enter", "details", "details"),
        Binding("g", "group", "hosts/peers"),
        Binding("w", "chains", "wait-for"),
        Binding("question_mark", "help", "help"),
        Binding("q", "quit", "quit"),
        Binding("escape", "clear_filter", "clear filter", show=False),
    ]

    snapshot: reactive[Any] = reactive(None, always_update=True, init=False)
    filter_text: reactive[str] = reactive("", init=False)
    selected: reactive[int | None] = reactive(None, init=False)
    note: reactive[str] = reactive("", init=False)
    group_by: reactive[str] = reactive("host", init=False)  # rank grid laid out by "host" or "peers"

    def __init__(self, source: Source, *, interval: float | None = None, save_dir: str | None = None,
                 handle_sigterm: bool = False) -> None:
        super().__init__()
        self.handle_sigterm = handle_sigterm
        self.source = source
        check_source(source)  # a source lacking a member fails here, not later with a guessed default
        self.live = source.live
        self.interval = float(interval if interval is not None else source.interval or 0.5)
        self.save_dir = save_dir or source.state_dir
        self._lock = threading.Lock()  # one call into the source at a time
        self._pending: Any = None
        self._apply_armed = False
        self._polling = False
        self._diagnosing = False
        self._error: str | None = None
        self._user_selected = False
        self.incidents_seen: set[str] = set()
        self.last_diagnosis: Diagnosis | None = None
        self.last_saved: tuple[str, str] | None = None
        self.polls = 0
        self.fatal: ScoutError | None = None  # the watch could not start: run_dashboard raises it
        self._visible: list[int] = []

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield HeaderBar(id="header")
        with Horizontal(id="body"):
            with Vertical(id="left"):
                with VerticalScroll(id="grid-scroll") as g:
                    g.border_title = "ranks by host"
                    g.can_focus = False
                    yield RankGrid(id="grid")
                yield Legend(id="legend")
                t = TimingPanel(id="timing")
                t.border_title = "timing"
                yield t
                dv = DevicePanel(id="devices", classes="-empty")
                dv.border_title = "devices (NVML)"
                yield dv
            with Vertical(id="right"):
                it = IncidentTree(id="incidents")
                it.border_title = "incidents"
                yield it
                st = StackTree(id="stacks")
                st.border_title = "stacks (main thread, innermost first)"
                yield st
        yield Input(placeholder="filter: 3  0-15  waiting  suspect  host:NAME   (enter: apply, escape: clear)",
                    id="filter")
        yield Footer()

    def on_mount(self) -> None:
        if self.handle_sigterm:  # `watch` ends cleanly on SIGTERM, dashboard or not
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self._on_sigterm)
        first = self.source.snapshot
        if first is not None:
            self.snapshot = first
        else:
            waiting = self.source.waiting or "waiting for the first poll…"
            self.query_one(HeaderBar).update(Text(f" scout-sys  {waiting}"))
        if self.live:
            self._arm_poll(0.0)

    # ------------------------------------------------------------------ polling (worker thread)
    def _arm_poll(self, delay: float) -> None:
        self.set_timer(max(0.01, delay), self._start_poll)

    def _start_poll(self) -> None:
        if self._polling:
            return
        self._polling = True
        self._poll()

    @work(thread=True, group="poll", exit_on_error=False)
    def _poll(self) -> None:
        t0 = time.monotonic()
        try:
            with self._lock:
                events = list(self.source.poll())
                snap = self.source.snapshot
            self.post_message(Polled(snap, events, None, time.monotonic() - t0))
        except Exception as e:  # noqa: BLE001 - shown in the header; polling goes on
            self.post_message(Polled(None, [], e, time.monotonic() - t0))

    def on_polled(self, msg: Polled) -> None:
        self._polling = False
        self.polls += 1
        ended = False
        if msg.error is not None:
            self._error = f"{type(msg.error).__name__}: {msg.error}"
            ended = isinstance(msg.error, TargetGone)
            if isinstance(msg.error, (NoRanks, TargetGone)) and self.source.snapshot is None:
                self.fatal = msg.error  # the selected job ended before it had ranks: nothing to show
                self.exit(2)
                return
        else:
            self._error = None
            for ev in msg.events:
                self._on_event(ev)
            waiting = self.source.waiting
            if msg.snapshot is None and waiting:
                self.query_one(HeaderBar).update(Text(f" scout-sys  {waiting}"))
            if msg.snapshot is not None:
                self.push_snapshot(msg.snapshot)
                ended = msg.snapshot.ended
        if ended:
            self.note = "job ended"
            self._refresh_header()
            return
        delay = self.interval - msg.took if msg.error is None else max(self.interval, 2.0)
        self._arm_poll(delay)

    def _on_event(self, ev: Any) -> None:
        if not isinstance(ev, Event):  # the monitor's own news (watch --cluster: an agent lost, or back)
            self.notify(printable(agent_event(ev)), severity="warning" if ev.event == "agent_lost" else "information",
                        markup=False, timeout=8)
            return
        inc = ev.incident
        self.incidents_seen.add(inc.id or inc.kind)
        what = f"{inc.kind} ({inc.status})" + (f" ranks {compress(inc.ranks)}" if inc.ranks else "")
        bundle = ev.bundle
        if ev.event == "incident_opened":
            self.bell()
            lines = [f"incident opened: {what}", inc.summary] + ([f"evidence saved to {bundle}"] if bundle else [])
            self.notify("\n".join(printable(x) for x in lines), severity="error", markup=False, timeout=8)
        elif ev.event == "incident_closed":
            self.notify(printable(f"incident closed: {what}"), markup=False, timeout=5)

    def push_snapshot(self, snap: Any) -> None:
        """Show ``snap``; bursts are merged: only the newest snapshot of a refresh is drawn."""
        self._pending = snap
        if not self._apply_armed:
            self._apply_armed = True
            self.call_after_refresh(self._apply_pending)

    def _apply_pending(self) -> None:
        self._apply_armed = False
        snap, self._pending = self._pending, None
        if snap is not None:
            self.snapshot = snap

    # ------------------------------------------------------------------ rendering
    def watch_snapshot(self, s: Any) -> None:
        if s is None:
            return
        for inc in (*s.incidents, *s.closed):
            self.incidents_seen.add(inc.id or f"{inc.kind}:{inc.ranks}")
        sus = suspects(s.incidents)
        if not self._user_selected and sus and self.selected not in sus:
            self.selected = min(sus)
            self.query_one(RankGrid).selected = self.selected
        self._render_all(s)

    def watch_group_by(self, _: str) -> None:
        self._grid_title()
        if self.snapshot is not None:
            self._render_all(self.snapshot)

    def _grid_title(self) -> None:
        self.query_one("#grid-scroll").border_title = "ranks by host" if self.group_by == "host" else \
            peers_title(self.snapshot.job if self.snapshot is not None else None)

    def action_group(self) -> None:
        self.group_by = "peers" if self.group_by == "host" else "host"

    def watch_filter_text(self, _: str) -> None:
        if self.snapshot is not None:
            self._render_all(self.snapshot)

    def watch_selected(self, _: int | None) -> None:
        if self.snapshot is not None:
            self._render_timing(self.snapshot, suspects(self.snapshot.incidents), self._visible)

    def watch_note(self, _: str) -> None:
        self._refresh_header()

    def _render_all(self, s: Snapshot) -> None:
        sus = suspects(s.incidents)
        match = parse_filter(self.filter_text)
        if self.group_by == "peers":
            self._grid_title()
        grid = grid_cells(s, sus, by=self.group_by, match=match)
        visible = self._visible = grid.visible
        self.query_one(RankGrid).set_cells(grid.blocks, notes=grid.notes)
        self.query_one(Legend).show(grid.counts, len(visible), grid.total)
        self.query_one(IncidentTree).show_incidents(s.incidents, s.closed, s.time)
        stacks = s.stacks or {r: v.stack for r, v in s.views.items() if v.stack}
        self.query_one(StackTree).show_groups(group_stacks(stacks, suspect=sus,
                                                           ranks=visible if match is not None else None))
        self._render_timing(s, sus, visible)
        self._refresh_header()

    def _render_timing(self, s: Snapshot, sus: frozenset[int], visible: Sequence[int]) -> None:
        rows = timing_rows(s.step_times, sus, visible, self.selected)
        steps = dict(s.step_times)
        waits = dict(s.wait_fractions)
        if steps:
            steps[-1] = median_series(s.step_times.values())
            waits[-1] = median_series(s.wait_fractions.values())
            rows.append(-1)
        self.query_one(TimingPanel).show(steps, waits, rows, suspect=sus)
        dev = self.query_one(DevicePanel)
        dev.set_class(not s.devices, "-empty")
        if s.devices:
            drows = [r for r in rows if r >= 0] or sorted(s.devices)[:TIMING_ROWS]
            dev.show(s.devices, drows, suspect=sus)

    def overall(self) -> tuple[str, str]:
        return overall(self.snapshot, self._error)

    def _refresh_header(self) -> None:
        s = self.snapshot
        if s is None:
            return
        status, style = self.overall()
        note = self.note
        if s.bundle:
            note = (note + " · " if note else "") + f"evidence bundle {s.bundle}"
        if not self.live and self.source.path:
            note = (note + " · " if note else "") + f"report {self.source.path}"
        self.query_one(HeaderBar).show(s, status=status, status_style=style, live=self.live, note=note)

    # ------------------------------------------------------------------ interaction
    def on_rank_grid_selected(self, msg: RankGrid.Selected) -> None:
        self._user_selected = True
        self.selected = msg.rank
        if msg.open_details:
            self._rank_details(msg.rank)

    def _rank_details(self, rank: int) -> None:
        if self.snapshot is not None:
            self.push_screen(TextScreen(f"rank {rank}", rank_details(self.snapshot, rank)))

    def on_tree_node_selected(self, msg: Tree.NodeSelected[Any]) -> None:
        data = msg.node.data
        if isinstance(data, tuple) and data and data[0] in ("incident", "evidence") and self.snapshot is not None:
            inc: Incident = data[2]
            self.push_screen(TextScreen(f"incident {inc.kind}", incident_details(inc, self.snapshot.time)))

    def action_details(self) -> None:
        focused = self.focused
        if isinstance(focused, Tree):
            focused.action_select_cursor()
            return
        rank = self.selected
        if rank is None and self.snapshot is not None:
            sus = suspects(self.snapshot.incidents)
            rank = min(sus) if sus else (self._visible[0] if self._visible else None)
        if rank is not None:
            self._rank_details(rank)

    def action_chains(self) -> None:
        """Who waits for whom: from the selected rank (or each chain of the open incidents) to its origin."""
        s = self.snapshot
        if s is not None:
            self.push_screen(TextScreen("wait-for chains", chains_text(s.incidents, s.views, self.selected)))

    def action_help(self) -> None:
        t = help_text()
        s = self.snapshot
        if s is not None and s.probes:
            t.append("\nprobes\n", "bold")
            for name, reason in sorted(s.probes.items()):
                t.append(f"  {printable(name):<12} ")
                t.append("on" if reason is None else f"off: {printable(reason)}", "green" if reason is None else "red")
                t.append("\n")
        self.push_screen(TextScreen("help", t))

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("-visible")
        box.value = self.filter_text
        box.focus()

    def on_input_changed(self, msg: Input.Changed) -> None:
        if msg.input.id == "filter":
            self.filter_text = msg.value

    def on_input_submitted(self, msg: Input.Submitted) -> None:
        if msg.input.id == "filter":
            self.filter_text = msg.value
            msg.input.remove_class("-visible")
            self.query_one(RankGrid).focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = ""
        box.remove_class("-visible")
        self.filter_text = ""
        self.query_one(RankGrid).focus()

    async def action_quit(self) -> None:
        self.exit(self.exit_status())

    def exit_status(self) -> int:
        seen = self.incidents_seen or self.source.ever_opened
        return EXIT_INCIDENT if seen else EXIT_OK

    def _on_sigterm(self) -> None:
        self.exit(self.exit_status())

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """After the app exited: wait until no call into the source is in flight (then it may be closed)."""
        if self._lock.acquire(timeout=timeout):
            self._lock.release()
            return True
        return False


def make_app(source: Source, *, interval: float | None = None, save_dir: str | None = None,
             handle_sigterm: bool = False) -> ScoutApp:
    """The dashboard over ``source`` (a started Watcher, a ReportSource, or any Source)."""
    return ScoutApp(source, interval=interval, save_dir=save_dir, handle_sigterm=handle_sigterm)


def run_dashboard(source: Source, *, save_dir: str | None = None) -> int:
    """Run the dashboard in this terminal until ``q``; 0 if no incident was seen, 1 otherwise.

    ``source`` must be started (``Watcher.start()``); closing it stays with the caller, which may do
    so as soon as this returns (no poll is in flight any more). SIGTERM quits like ``q``. The
    dashboard stays open after the job ended, so that its evidence can still be read and saved.
    Once the terminal is back, ``source.interrupt()`` comes before waiting for a poll in flight (the
    live watch's: a stack window in progress stops at once instead of running to its end).
    """
    app = make_app(source, save_dir=save_dir, handle_sigterm=True)
    rc = app.run()
    source.interrupt()
    app.wait_idle()
    if app.fatal is not None:
        raise app.fatal
    return rc if isinstance(rc, int) else app.exit_status()


__all__ = ["EXIT_INCIDENT", "EXIT_OK", "ScoutApp", "make_app", "printable", "run_dashboard"]
