"""The rank grid widget (tui/grid.py) in a bare app, driven by Pilot (no job, no source): the lines
it paints and their styles, its cache, the cursor (keys, clicks) and the messages it posts, and the
scroll that keeps the selected cell in view."""

from __future__ import annotations

import asyncio
import functools
import os
from typing import Any

from textual.app import App, ComposeResult
from textual.containers import VerticalScroll

import scout_sys.tui
from scout_sys.tui.cells import GLYPH, WIDE_MAX, Cell
from scout_sys.tui.grid import RankGrid

HOSTS = [("a", [Cell(0, "waiting"), Cell(1, "waiting"), Cell(2, "waiting")]), ("b", [Cell(3, "suspect")])]
WAITING_BG, SUSPECT_BG = "#5f9ed1", "#e01010"  # scout.tcss


def sync(fn: Any) -> Any:
    """Run an async Pilot test on its own event loop (no pytest-asyncio here)."""

    @functools.wraps(fn)
    def wrapper(*a: Any, **kw: Any) -> None:
        asyncio.run(fn(*a, **kw))

    return wrapper


class GridApp(App[None]):
    """The grid alone, in a scroll as the dashboard holds it, styled by the dashboard's stylesheet."""

    CSS_PATH = os.path.join(os.path.dirname(scout_sys.tui.__file__), "scout.tcss")

    def __init__(self, hosts: list[tuple[str, list[Cell]]], height: int = 20) -> None:
        super().__init__()
        self.hosts, self.height, self.picked = hosts, height, []

    def compose(self) -> ComposeResult:
        scroll = VerticalScroll(id="scroll")
        scroll.styles.height = self.height
        with scroll:
            yield RankGrid(id="grid")

    def on_mount(self) -> None:
        self.query_one(RankGrid).set_cells(self.hosts)
        self.query_one(RankGrid).focus()

    def on_rank_grid_selected(self, msg: RankGrid.Selected) -> None:
        self.picked.append((msg.rank, msg.open_details))


def texts(grid: RankGrid) -> list[str]:
    return [grid.render_line(y).text.rstrip() for y in range(grid.size.height)]


def style_of(grid: RankGrid, y: int, text: str) -> Any:
    (seg,) = [s for s in grid.render_line(y) if s.text == text]
    return seg.style


@sync
async def test_wide_lines_a_host_line_then_its_cells_in_their_colours() -> None:
    app = GridApp(HOSTS)
    async with app.run_test(size=(40, 24)) as pilot:
        await pilot.pause()
        grid = app.query_one(RankGrid)
        assert grid.ranks == [0, 1, 2, 3]
        assert grid.size.height == 4
        assert texts(grid) == ["a 0-2", " 0   1   2", "b 3", " 3"]
        assert style_of(grid, 1, " 0 ").bgcolor.name == WAITING_BG
        assert style_of(grid, 3, " 3 ").bgcolor.name == SUSPECT_BG
        # a host holding a suspect has its name in the suspect's colour
        b, a = style_of(grid, 2, "b "), style_of(grid, 0, "a ")
        assert (b.color.name, b.bold, b.reverse) == (SUSPECT_BG, True, True)
        assert (a.bold, a.reverse) == (True, None)
        # cells of one style are painted as one segment: the gap between two cells is its own
        assert [s.text for s in grid.render_line(1) if s.text.strip()] == [" 0 ", " 1 ", " 2 "]


@sync
async def test_same_cells_keep_the_cache_and_a_note_redraws() -> None:
    app = GridApp(HOSTS)
    async with app.run_test(size=(40, 24)) as pilot:
        await pilot.pause()
        grid = app.query_one(RankGrid)
        first = grid.render_line(0)
        grid.set_cells([(h, list(cs)) for h, cs in HOSTS])  # equal, not the same lists
        assert grid.render_line(0) is first
        grid.set_cells(HOSTS, notes={"b": "agent lost"})
        await pilot.pause()
        assert texts(grid) == ["a 0-2", " 0   1   2", "b 3  agent lost", " 3"]


@sync
async def test_the_selected_cell_is_bracketed_and_keeps_its_colour() -> None:
    app = GridApp(HOSTS)
    async with app.run_test(size=(40, 24)) as pilot:
        await pilot.pause()
        grid = app.query_one(RankGrid)
        grid.selected = 1
        await pilot.pause()
        assert texts(grid)[1] == " 0  [1]  2"
        st = style_of(grid, 1, "[1]")
        assert (st.bgcolor.name, st.bold, st.underline) == (WAITING_BG, True, True)
        assert (style_of(grid, 1, " 0 ").bold, style_of(grid, 1, " 0 ").underline) == (None, None)
        assert app.picked == []  # setting ``selected`` moves the cursor only; select() tells the app


@sync
async def test_keys_move_the_cursor_clamp_and_skip_host_lines() -> None:
    app = GridApp(HOSTS)
    async with app.run_test(size=(40, 24)) as pilot:
        await pilot.pause()
        grid = app.query_one(RankGrid)
        await pilot.press("right")  # nothing selected yet: the first rank
        assert grid.selected == 0
        await pilot.press("right", "right", "right", "right")  # clamped at the last rank
        assert grid.selected == 3
        await pilot.press("up")  # over "b 3" (no cell) to the nearest cell of the line above
        assert grid.selected == 0
        await pilot.press("right", "down")  # rank 1 (x 4): down to rank 3 (x 0), the only cell there
        assert grid.selected == 3
        await pilot.press("down")  # no line below: stays
        assert grid.selected == 3
        await pilot.press("home")
        assert grid.selected == 0
        await pilot.press("left")
        assert grid.selected == 0
        await pilot.press("end", "enter")
        assert app.picked == [(0, False), (1, False), (2, False), (3, False), (3, False), (0, False),
                              (1, False), (3, False), (0, False), (0, False), (3, False), (3, True)]


@sync
async def test_a_click_selects_the_cell_under_it_and_a_double_click_opens_it() -> None:
    app = GridApp(HOSTS)
    async with app.run_test(size=(40, 24)) as pilot:
        await pilot.pause()
        grid = app.query_one(RankGrid)
        assert [grid.rank_at(x, 1) for x in range(12)] == [0, 0, 0, None, 1, 1, 1, None, 2, 2, 2, None]
        assert grid.rank_at(0, 0) is None and grid.rank_at(0, 3) == 3 and grid.rank_at(0, 4) is None
        assert grid.rank_at(0, -1) is None
        await pilot.click(RankGrid, offset=(5, 1))
        assert grid.selected == 1 and app.picked == [(1, False)]
        await pilot.click(RankGrid, offset=(0, 0))  # the host line: no cell, nothing happens
        assert grid.selected == 1 and app.picked == [(1, False)]
        await pilot.click(RankGrid, offset=(9, 1), times=2)
        assert grid.selected == 2 and app.picked[-1] == (2, True)


@sync
async def test_enter_and_keys_on_an_empty_grid_do_nothing_and_it_says_no_ranks() -> None:
    app = GridApp([])
    async with app.run_test(size=(40, 24)) as pilot:
        await pilot.pause()
        grid = app.query_one(RankGrid)
        assert grid.ranks == [] and grid.size.height == 1
        assert texts(grid) == ["no ranks"]
        assert style_of(grid, 0, "no ranks").dim is True
        await pilot.press("enter", "right", "down", "home", "end")
        assert grid.selected is None and app.picked == []


@sync
async def test_beyond_wide_max_one_glyph_per_rank_and_the_cursor_inverts_it() -> None:
    n = WIDE_MAX + 4
    hosts = [("a", [Cell(r, "suspect" if r == 7 else "waiting") for r in range(n)])]
    app = GridApp(hosts)
    async with app.run_test(size=(40, 24)) as pilot:
        await pilot.pause()
        grid = app.query_one(RankGrid)
        lines = texts(grid)
        # 40 columns: label "a" and a space, then 38 glyphs per line; 260 ranks are 7 lines
        assert lines[0] == "a " + GLYPH * 7 + "!" + GLYPH * 30
        assert lines[1:] == ["  " + GLYPH * 38] * 5 + ["  " + GLYPH * 32]
        # compact: the category's colour on the glyph, the suspect keeps its background
        assert style_of(grid, 0, "!").bgcolor.name == SUSPECT_BG
        assert [s.style.color.name for s in grid.render_line(0) if s.text == GLYPH * 7] == [WAITING_BG]
        grid.selected = 8
        await pilot.pause()
        st = style_of(grid, 0, GLYPH)  # rank 8, alone in its segment
        assert (st.color.name, st.bgcolor.name, st.bold) == ("white", WAITING_BG, True)


@sync
async def test_selecting_a_rank_out_of_view_scrolls_its_line_into_view() -> None:
    hosts = [(f"h{i}", [Cell(i, "waiting")]) for i in range(20)]  # 40 lines
    app = GridApp(hosts, height=6)
    async with app.run_test(size=(40, 24)) as pilot:
        await pilot.pause()
        scroll, grid = app.query_one(VerticalScroll), app.query_one(RankGrid)
        assert scroll.scroll_y == 0
        grid.select(15)  # its cell is on line 31
        await pilot.pause()
        assert scroll.scroll_y == 31 - 6 + 1
        grid.select(0)  # line 1
        await pilot.pause()
        assert scroll.scroll_y == 1
        assert [r for r, _ in app.picked] == [15, 0]
