"""The dashboard's chain view (key ``w``), on a report saved from a real job: ``diagnose --json`` of the
Megatron-Core dp=2 x tp=2 job whose rank 2 blocks on a lock (tests/jobs/megatron_job.py --fault lock, no
layout anywhere; recorded in tests/data/megatron_lock_report.json). Rank 0 waits for rank 2 in the
data-parallel all-reduce, rank 1 for rank 3 in its own, rank 3 for rank 2 in the tensor-parallel one."""

from __future__ import annotations

import asyncio
import json
import os

from scout_sys.tui.app import make_app
from scout_sys.tui.chains import chains, chains_text
from scout_sys.tui.source import ReportSource, load_report
from scout_sys.tui.widgets import RankGrid, TextScreen
from tests.test_tui_snapshots import snap_compare, utc  # noqa: F401 (fixture: local time in UTC)

REPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "megatron_lock_report.json")


def _snapshot():
    with open(REPORT) as f:
        return load_report(json.load(f))


def test_chains_follow_the_edges_to_the_origin():
    s = _snapshot()
    shown = chains(s.incidents, selected=1)
    first = shown[0]
    assert [st.rank for st in first.steps] == [1, 3, 2] and first.origin
    assert [st.group for st in first.steps] == [(1, 3), (2, 3), ()]
    assert first.steps[0].collective.startswith("all_reduce") and first.steps[1].collective.startswith("all_reduce")
    assert first.steps[0].collective != first.steps[1].collective  # data- vs tensor-parallel call site
    assert sorted(tuple(st.rank for st in c.steps) for c in shown) == [(0, 2), (1, 3, 2)]
    assert [tuple(st.rank for st in c.steps) for c in chains(s.incidents, selected=2)] == [(0, 2), (1, 3, 2)]
    text = chains_text(s.incidents, s.views, selected=3).plain
    assert text.startswith("rank 3 → rank 2") and "ORIGIN  idle" in text
    assert "of group {2, 3} for" in text


def test_no_graph_says_so():
    assert chains_text((), {}).plain.startswith("no wait-for chain")


def test_a_chain_that_ends_at_no_origin_says_where_it_ends():
    from dataclasses import replace

    from scout_sys.model import INCONCLUSIVE

    s = _snapshot()
    inc = replace(s.incidents[0], status=INCONCLUSIVE, ranks=())
    views = {**s.views, 2: replace(s.views[3], rank=2, collective="broadcast at t.py:5")}
    text = chains_text([inc], views, selected=0).plain
    assert "ORIGIN" not in text
    assert "└▶ rank 2  waiting in broadcast at t.py:5 (the chain ends here, not at an origin)" in text, text


def test_w_opens_the_chain_of_the_selected_rank():
    async def run() -> str:
        app = make_app(ReportSource(REPORT))
        async with app.run_test(size=(140, 44)) as pilot:
            while app.snapshot is None:
                await pilot.pause(0.05)
            assert app.selected == 2  # the culprit is selected first
            await pilot.press("left")  # rank 1, a witness
            assert app.selected == 1
            await pilot.press("w")
            await pilot.pause()
            assert isinstance(app.screen, TextScreen)
            body = str(app.screen.query_one("#page-body").render())
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, TextScreen)
            return body

    body = asyncio.run(run())
    assert body.startswith("rank 1 → rank 2"), body
    lines = body.splitlines()
    assert "rank 1  waits in all_reduce" in lines[1] and "of group {1, 3} for" in lines[1], lines
    assert "└▶ rank 3  waits in all_reduce" in lines[2] and "of group {2, 3} for" in lines[2], lines
    assert "└▶ rank 2  ORIGIN  idle" in lines[3], lines


def test_chain_view_snapshot():
    async def press_w(pilot) -> None:
        await pilot.press("left", "w")

    snap_compare("wait_for_chains", _snapshot(), run_before=press_w)


def test_g_lays_the_grid_out_by_the_learned_peers():
    async def run() -> tuple[str, list]:
        app = make_app(ReportSource(REPORT))
        async with app.run_test(size=(140, 44)) as pilot:
            while app.snapshot is None:
                await pilot.pause(0.05)
            await pilot.press("g")
            await pilot.pause()
            grid = app.query_one(RankGrid)
            return str(app.query_one("#grid-scroll").border_title), [(h, [c.rank for c in cs]) for h, cs in grid._hosts]

    title, blocks = asyncio.run(run())
    assert title == "ranks by peer group (process groups learned from the ranks' connections)"
    assert blocks == [("peers 0 (tp=0)", [0, 2]), ("peers 1 (tp=1)", [1, 3])]
