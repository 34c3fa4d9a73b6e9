"""Dashboard behaviour, driven by Pilot on scripted sources (no job): culprit highlighted, keys,
mouse, literal untrusted text, polls that never overlap, reports that reopen."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import threading
import time
from typing import Any

import pytest

from scout_sys.tui.app import make_app
from scout_sys.tui.source import ReportSource, report_json
from scout_sys.tui.synthetic import ScriptedSource, opened, synthetic_snapshot
from scout_sys.tui.widgets import HeaderBar, IncidentTree, RankGrid, StackTree, TextScreen

SIZE = (140, 44)


def sync(fn: Any) -> Any:
    """Run an async Pilot test on its own event loop (no pytest-asyncio here)."""

    @functools.wraps(fn)
    def wrapper(*a: Any, **kw: Any) -> None:
        asyncio.run(fn(*a, **kw))

    return wrapper


async def until(pilot: Any, cond: Any, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        await pilot.pause(0.02)


def drawn(app: Any, polls: int) -> bool:
    """``polls`` polls done and their snapshot on screen (snapshots are drawn after the next refresh)."""
    return app.polls >= polls and not app._apply_armed


def plain(widget: Any) -> str:
    return str(widget.render())


def grid_cells(app: Any) -> dict[int, str]:
    grid = app.query_one(RankGrid)
    return {c.rank: c.category for _, cs in grid._hosts for c in cs}


def hung_script() -> ScriptedSource:
    healthy = synthetic_snapshot(8, hung=None, closed=False, elapsed=10)
    hung = synthetic_snapshot(8, hung=2, closed=False, elapsed=22)
    return ScriptedSource([(healthy, []), (healthy, []), (hung, opened(hung))], interval=0.4)


@sync
async def test_hang_appears_culprit_highlighted() -> None:
    src = hung_script()
    app = make_app(src)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: drawn(app, 1))
        assert "HEALTHY" in plain(app.query_one(HeaderBar))
        assert set(grid_cells(app).values()) == {"progressing"}
        await until(pilot, lambda: drawn(app, 3) and app.snapshot.incidents)
        await pilot.pause()
        header = plain(app.query_one(HeaderBar))
        assert "INCIDENT hang rank 2" in header
        cells = grid_cells(app)
        assert cells[2] == "suspect"
        assert {c for r, c in cells.items() if r != 2} == {"waiting"}
        assert app.selected == 2 and app.query_one(RankGrid).selected == 2
        # the culprit's stack beside the majority's, both expanded
        groups = [n for n in app.query_one(StackTree).root.children]
        assert [n.data[2] for n in groups] == [(0, 1, 3, 4, 5, 6, 7), (2,)]
        assert all(n.is_expanded for n in groups)
        assert "suspect" in str(groups[1].label) and "slow_data_loader" in str(groups[1].children[0].label)
        inc = app.query_one(IncidentTree).root.children[0]
        assert "OPEN hang" in str(inc.label) and inc.is_expanded
        await pilot.press("q")
    assert app.return_value == 1


@sync
async def test_healthy_exit_status_zero() -> None:
    src = ScriptedSource([(synthetic_snapshot(4, hung=None, closed=False), [])])
    app = make_app(src)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: drawn(app, 2))
        await pilot.press("q")
    assert app.return_value == 0


@sync
async def test_keys_diagnose_save_filter_help_details(tmp_path: Any) -> None:
    src = ScriptedSource([(synthetic_snapshot(8, hung=2), [])])
    app = make_app(src, save_dir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: drawn(app, 1))
        await pilot.pause()
        # d: diagnose now, in a worker; the verdict opens in a page
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, TextScreen))
        assert src.diagnoses == 1 and app.last_diagnosis is not None
        assert "incident" in app.screen._title
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, TextScreen))
        # s: JSON + Markdown into the save dir
        await pilot.press("s")
        await until(pilot, lambda: app.last_saved is not None)
        js, md = app.last_saved
        assert os.path.dirname(js) == str(tmp_path) and js.endswith(".json") and md.endswith(".md")
        doc = json.load(open(js))
        assert doc["schema"] == "scout-sys/diagnosis/v1" and doc["incidents"][0]["ranks"] == [2]
        text = open(md).read()
        assert "INCIDENT hang (attributed): rank 2" in text and "slow_data_loader (/work/demo/train.py:97)" in text
        # /: filter ranks, live as typed; enter applies; escape clears
        await pilot.press("slash")
        await pilot.press(*"0-2")
        await pilot.press("enter")
        assert app.filter_text == "0-2"
        assert sorted(grid_cells(app)) == [0, 1, 2]
        assert app.focused is app.query_one(RankGrid)
        await pilot.press("escape")
        assert sorted(grid_cells(app)) == list(range(8))
        await pilot.press("slash", *"suspect", "enter")
        assert sorted(grid_cells(app)) == [2]
        await pilot.press("escape")
        # ?: help
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, TextScreen))
        assert app.screen._title == "help" and "ebpf" in str(app.screen._body) and "needs root" in str(app.screen._body)
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, TextScreen))
        # enter on the grid: details of the selected rank (the suspect, selected on its own)
        await pilot.press("right", "left")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, TextScreen))
        body = str(app.screen._body)
        assert app.screen._title == "rank 2" and "SUSPECT" in body and "slow_data_loader (/work/demo/train.py:97)" in body
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, TextScreen))
        # enter on an incident: its evidence
        await pilot.pause()
        app.query_one(IncidentTree).focus()
        await pilot.pause()
        assert app.focused is app.query_one(IncidentTree)
        await pilot.press("home", "enter")
        await until(pilot, lambda: isinstance(app.screen, TextScreen))
        assert app.screen._title == "incident hang" and "7 of 8 ranks wait" in str(app.screen._body)
        await pilot.press("escape")
        await pilot.press("q")
    assert app.return_value == 1


@sync
async def test_arrow_keys_move_through_the_grid() -> None:
    src = ScriptedSource([(synthetic_snapshot(8, hung=None, closed=False), [])])
    app = make_app(src)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: drawn(app, 1))
        await pilot.pause()
        grid = app.query_one(RankGrid)
        assert app.focused is grid
        await pilot.press("right")
        assert grid.selected == 0
        await pilot.press("right", "right")
        assert grid.selected == 2 and app.selected == 2
        await pilot.press("down")  # next host's row, same column
        assert grid.selected == 6
        await pilot.press("end")
        assert grid.selected == 7


@sync
async def test_mouse_click_selects_and_double_click_opens() -> None:
    src = ScriptedSource([(synthetic_snapshot(8, hung=2), [])])
    app = make_app(src)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: drawn(app, 1))
        await pilot.pause()
        grid = app.query_one(RankGrid)
        y, x0, _ = grid._hits[5]
        await pilot.click(RankGrid, offset=(x0 + 1, y))
        assert grid.selected == 5 and app.selected == 5
        assert not isinstance(app.screen, TextScreen)
        await pilot.double_click(RankGrid, offset=(x0 + 1, y))
        await until(pilot, lambda: isinstance(app.screen, TextScreen))
        assert app.screen._title == "rank 5"
        await pilot.press("escape")
        # a click on an incident opens its evidence
        await pilot.pause()
        await pilot.click(IncidentTree, offset=(8, 1))
        await until(pilot, lambda: isinstance(app.screen, TextScreen))
        assert app.screen._title == "incident hang"


@sync
async def test_untrusted_strings_are_shown_literally() -> None:
    snap = synthetic_snapshot(4, hung=2, evil=True)
    app = make_app(ScriptedSource([(snap, [])]))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: drawn(app, 1))
        await pilot.pause()
        suspect = app.query_one(StackTree).root.children[1]
        frame = str(suspect.children[0].label)
        assert "[link=http://e]click[/link]?[31m (/tmp/[bold red]x[/].py:1)" in frame, frame
        inc = str(app.query_one(IncidentTree).root.children[0].label)
        assert "[red]slow_data_loader" in inc
        screen = app.export_screenshot()
        assert "\x1b" not in screen
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, TextScreen))
        assert "[bold red]x[/]" in str(app.screen._body)


class GatedSource(ScriptedSource):
    """Polls after the first block until the test opens the gate: a poll in flight for as long as
    the test needs, at any load."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.gate = threading.Event()

    def poll(self) -> list[Any]:
        if self.polls >= 1:
            self.in_poll += 1
            self.max_in_poll = max(self.max_in_poll, self.in_poll)
            try:
                self.gate.wait(120)
            finally:
                self.in_poll -= 1
        return super().poll()


@sync
async def test_polls_never_overlap_and_ui_stays_responsive() -> None:
    snap = synthetic_snapshot(8, hung=2)
    src = GatedSource([(snap, [])], interval=0.0)
    app = make_app(src, interval=0.01)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: drawn(app, 1))
        # a poll is in flight (blocked): keys still answer, before that poll ends
        await until(pilot, lambda: src.in_poll == 1)
        polls = src.polls
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, TextScreen), timeout=60)
        assert (src.in_poll, src.polls) == (1, polls)
        await pilot.press("escape")
        src.gate.set()
        await until(pilot, lambda: drawn(app, 3), timeout=60)
        assert src.max_in_poll == 1
        # diagnose shares the source's lock with polls: still one call at a time
        await pilot.press("d")
        await until(pilot, lambda: app.last_diagnosis is not None, timeout=60)
        assert src.max_in_poll == 1


@sync
async def test_bursts_are_merged() -> None:
    snaps = [synthetic_snapshot(8, hung=2, elapsed=10 + i) for i in range(50)]
    app = make_app(ScriptedSource([(snaps[0], [])], interval=60))
    shown: list[float] = []
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: drawn(app, 1))
        app.watch_snapshot = lambda s: shown.append(s.time)  # type: ignore[method-assign]
        for s in snaps:
            app.push_snapshot(s)
        await pilot.pause()
        await pilot.pause()
    assert shown and shown[-1] == snaps[-1].time and len(shown) < 5


@sync
async def test_saved_report_reopens_through_the_same_path(tmp_path: Any) -> None:
    snap = synthetic_snapshot(8, hung=2, devices=True)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report_json(snap)))
    src = ReportSource(str(path))
    back = src.snapshot
    assert back.incidents == snap.incidents and back.closed == snap.closed
    assert back.stacks == snap.stacks and back.step_times == snap.step_times and back.devices == snap.devices
    assert {r: v.state for r, v in back.views.items()} == {r: v.state for r, v in snap.views.items()}
    assert back.job.ranks == tuple(r.__class__(**{**r.__dict__, "name": ""}) for r in snap.job.ranks)
    app = make_app(src)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert grid_cells(app)[2] == "suspect"
        header = plain(app.query_one(HeaderBar))
        assert "replay" in header and "r.json" in header and "INCIDENT hang rank 2" in header
        await pilot.press("d")  # a replay re-shows the saved verdict, no probing
        await until(pilot, lambda: isinstance(app.screen, TextScreen))
        await pilot.press("escape", "q")
    assert app.polls == 0 and app.return_value == 1


def test_plain_diagnose_json_reopens(tmp_path: Any) -> None:
    from scout_sys.tui.source import diagnosis_of

    snap = synthetic_snapshot(4, hung=2)
    doc = diagnosis_of(snap).to_json()  # what `diagnose --json` prints: no "watch" part
    src = ReportSource(doc)
    assert src.snapshot.incidents == snap.incidents and src.snapshot.stacks == {}
    with pytest.raises(Exception, match="not a scout-sys report"):
        ReportSource({"schema": "other"})


@sync
async def test_poll_errors_are_shown_and_polling_goes_on() -> None:
    class Flaky(ScriptedSource):
        def poll(self) -> list[Any]:
            if self.polls == 0:
                self.polls += 1
                raise RuntimeError("py-spy crashed [boom]")
            return super().poll()

    src = Flaky([(synthetic_snapshot(4, hung=None), [])], interval=0.01)
    app = make_app(src)
    app.interval = 0.01
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: drawn(app, 1))
        assert app._error and "[boom]" in app._error
        await until(pilot, lambda: app.snapshot is not None, timeout=6)
        assert app._error is None


def test_run_dashboard_signature() -> None:
    import inspect

    from scout_sys.tui.app import run_dashboard

    sig = inspect.signature(run_dashboard)
    assert list(sig.parameters)[0] == "source" and sig.return_annotation in (int, "int")


@sync
async def test_grid_by_peer_group() -> None:
    from dataclasses import replace

    snap = synthetic_snapshot(8, per_host=4, hung=2)
    snap = replace(snap, job=replace(snap.job, peer_groups=((0, 2, 4, 6), (1, 3, 5, 7))))
    app = make_app(ScriptedSource([(snap, [])]))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: drawn(app, 1))
        grid = app.query_one(RankGrid)
        assert [h for h, _ in grid._hosts] == ["node000.cluster.example", "node001.cluster.example"]
        await pilot.press("g")
        assert [(h, [c.rank for c in cs]) for h, cs in grid._hosts] == [
            ("peers 0", [0, 2, 4, 6]), ("peers 1", [1, 3, 5, 7])]
        assert grid_cells(app)[2] == "suspect"
        await pilot.press("g")
        assert [h for h, _ in grid._hosts][0] == "node000.cluster.example"
