"""The rank grid's pure computation (tui/cells.py): which rank goes in which block and cell, what each
cell says in which style, and where each cell is, on synthetic snapshots, without an app."""

from __future__ import annotations

from dataclasses import replace

from scout_sys.model import Rank
from scout_sys.tui.cells import (
    DIM,
    GLYPH,
    HOST,
    HOST_SUSPECT,
    OTHER,
    WIDE_MAX,
    Cell,
    grid_cells,
    grid_lines,
    hit_map,
    is_compact,
)
from scout_sys.tui.state import parse_filter, suspects
from scout_sys.tui.synthetic import synthetic_snapshot

HOST0, HOST1 = "node000.cluster.example", "node001.cluster.example"


def _ranks(g) -> list[tuple[str, list[int]]]:
    return [(h, [c.rank for c in cs]) for h, cs in g.blocks]


def test_cells_by_host_with_the_suspect_and_the_counts() -> None:
    s = synthetic_snapshot(8, hung=2)
    g = grid_cells(s, suspects(s.incidents))
    assert _ranks(g) == [(HOST0, [0, 1, 2, 3]), (HOST1, [4, 5, 6, 7])]
    assert g.blocks[0][1][2] == Cell(2, "suspect") and g.blocks[0][1][0] == Cell(0, "waiting")
    assert g.counts == {"waiting": 7, "suspect": 1} and g.visible == list(range(8)) and g.total == 8
    assert g.notes == {}


def test_the_filter_keeps_the_counts_of_every_rank() -> None:
    s = synthetic_snapshot(8, hung=2)
    g = grid_cells(s, suspects(s.incidents), match=parse_filter("suspect 5-6"))
    assert _ranks(g) == [(HOST0, [2]), (HOST1, [5, 6])] and g.visible == [2, 5, 6]
    assert g.counts == {"waiting": 7, "suspect": 1} and g.total == 8
    assert grid_cells(s, suspects(s.incidents), match=parse_filter("nosuchhost")).blocks == []


def test_missing_ranks_are_exited_unless_suspects_and_lost_agents_are_noted() -> None:
    s = synthetic_snapshot(4, hung=None)
    job = replace(s.job, ranks=s.job.ranks[:2], missing=(2, 3))
    views = {r: v for r, v in s.views.items() if r < 3}  # rank 2 still seen, rank 3 not
    s = replace(s, job=job, views=views, agents=({"host": "nodeB", "state": "lost"}, {"host": HOST0, "state": "up"}))
    g = grid_cells(s, frozenset())
    # a rank no Rank names sits on the job's host; rank 2 keeps its view's category
    assert [(c.rank, c.category) for _, cs in g.blocks for c in cs] == [
        (0, "progressing"), (1, "progressing"), (2, "progressing"), (3, "exited")]
    assert g.notes == {"nodeB": "agent lost"}
    assert [c.category for _, cs in grid_cells(s, frozenset({3})).blocks for c in cs][3] == "suspect"


def test_cells_by_peer_group_then_the_rest() -> None:
    s = synthetic_snapshot(4, hung=None)
    ranks = tuple(replace(r, coords=(("dp", r.rank // 2), ("tp", r.rank % 2))) for r in s.job.ranks)
    job = replace(s.job, ranks=ranks, peer_groups=((0, 2), (1,)))
    g = grid_cells(replace(s, job=job), frozenset(), by="peers")
    assert _ranks(g) == [("peers 0 (tp=0)", [0, 2]), ("peers 1 (tp=1)", [1]), (OTHER, [3])]


def test_wide_lines_number_each_cell_and_colour_the_suspects_host() -> None:
    s = synthetic_snapshot(8, hung=2)
    g = grid_cells(s, suspects(s.incidents))
    lines = grid_lines(g.blocks, {HOST1: "agent lost"}, 80)
    assert not is_compact(g.blocks)
    assert lines[0][0] == ("node000 ", HOST_SUSPECT, None) and lines[0][1] == ("0-3", DIM, None)
    assert [seg for seg in lines[1] if seg[2] is not None] == [
        (" 0 ", "waiting", 0), (" 1 ", "waiting", 1), (" 2 ", "suspect", 2), (" 3 ", "waiting", 3)]
    assert lines[2][0][1] == HOST and lines[2][-1] == ("  agent lost", DIM, None)
    # a narrow grid wraps a host's cells: 3 columns per cell plus a gap
    narrow = grid_lines(g.blocks, {}, 8)
    assert [[seg[2] for seg in ln if seg[2] is not None] for ln in narrow[:4]] == [[], [0, 1], [2, 3], []]


def test_compact_lines_beyond_wide_max_one_glyph_per_rank() -> None:
    n = WIDE_MAX + 64
    s = synthetic_snapshot(n, per_host=64, hung=70)
    g = grid_cells(s, suspects(s.incidents))
    assert is_compact(g.blocks)
    lines = grid_lines(g.blocks, {}, 200)
    glyphs = [seg for ln in lines for seg in ln if seg[2] is not None]
    assert [seg[2] for seg in glyphs] == list(range(n))
    assert {seg[0] for seg in glyphs} == {GLYPH, "!"} and glyphs[70] == ("!", "suspect", 70)
    assert len(lines) < n // 64  # several hosts share a line


def test_hit_map_finds_each_cell() -> None:
    s = synthetic_snapshot(8, hung=2)
    lines = grid_lines(grid_cells(s, frozenset()).blocks, {}, 80)
    hits, rows = hit_map(lines)
    assert sorted(hits) == list(range(8))
    y, x0, x1 = hits[5]
    assert "".join(t for t, _, _ in lines[y])[x0:x1] == " 5 "
    assert rows[0] == [] and [r for _, _, r in rows[y]] == [4, 5, 6, 7]


def test_grid_at_ten_thousand_ranks() -> None:
    s = synthetic_snapshot(10_000, per_host=8, hung=4321, closed=False)
    g = grid_cells(s, suspects(s.incidents))
    assert g.total == 10_000 and len(g.blocks) == 1250
    hits, _ = hit_map(grid_lines(g.blocks, {}, 200))
    assert len(hits) == 10_000


def test_each_rank_in_its_own_hosts_block() -> None:
    s = synthetic_snapshot(2, hung=None)
    job = replace(s.job, ranks=(*s.job.ranks, Rank(rank=2, pid=1, host="elsewhere")), world_size=3)
    g = grid_cells(replace(s, job=job), frozenset())
    assert _ranks(g) == [(HOST0, [0, 1]), ("elsewhere", [2])]
