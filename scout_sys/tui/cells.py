"""The rank grid's computation, as pure functions: which rank goes in which block and cell, and what
each cell says in which style, from a snapshot.

No textual: :class:`~scout_sys.tui.grid.RankGrid` only paints the lines built here and maps clicks
and keys through :func:`hit_map`, so the grid is unit-testable on synthetic snapshots at thousands
of ranks without an app.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

from scout_sys.model import Snapshot
from scout_sys.report import printable
from scout_sys.text import compress
from scout_sys.tui.state import category, peer_blocks, short_host

GLYPH = "■"  # a cell of the compact grid (beyond WIDE_MAX ranks)
WIDE_MAX = 256  # up to this many ranks each cell shows its rank number
HOST, HOST_SUSPECT, DIM, PLAIN = "host", "host-suspect", "dim", ""  # styles besides the categories'
OTHER = "other"  # the peers layout's block for ranks in no peer group

# One piece of a grid line: its text, its style (a category or one of the names above) and the rank
# it shows (None for labels and gaps).
Seg = tuple[str, str, Optional[int]]  # a runtime alias: no ``X | None`` before Python 3.10


@dataclass(frozen=True)
class Cell:
    rank: int
    category: str


@dataclass(frozen=True)
class GridCells:
    """The grid of one snapshot: its blocks (hosts, or peer groups) of cells, in order."""

    blocks: list[tuple[str, list[Cell]]]  # only the ranks the filter keeps
    notes: dict[str, str]  # a word after a host's name (watch --cluster: "agent lost")
    counts: dict[str, int]  # ranks per category, before the filter (the legend)
    visible: list[int]  # the ranks shown, in grid order
    total: int  # every rank the snapshot knows


def grid_cells(s: Snapshot, suspect: frozenset[int], *, by: str = "host",
               match: Callable[[int, str, str], bool] | None = None) -> GridCells:
    """Every rank of ``s`` (found, missing or only seen) in one cell, grouped ``by`` "host" or
    "peers" (the job's peer groups, then the rest as "other"); a missing rank nothing saw is
    *exited*, unless it is a suspect. ``match``: the filter (state.parse_filter)."""
    by_rank = s.job.by_rank()
    everyone = sorted(set(by_rank) | set(s.job.missing) | set(s.views))
    block: dict[int, str] = {}
    if by == "peers":
        blocks = peer_blocks(s.job)
        for label, grp in blocks:
            for r in grp:
                block.setdefault(r, label)
        everyone = list(dict.fromkeys([r for _, grp in blocks for r in grp] + everyone))
    cells: dict[str, list[Cell]] = {}
    counts: dict[str, int] = {}
    visible: list[int] = []
    for r in everyone:
        rk = by_rank.get(r)
        host = rk.host if rk else s.job.host
        cat = category(s.views.get(r), r in suspect)
        if rk is None and r in s.job.missing and r not in s.views:
            cat = "suspect" if r in suspect else "exited"
        counts[cat] = counts.get(cat, 0) + 1
        if match is not None and not match(r, host, cat):
            continue
        visible.append(r)
        cells.setdefault(block.get(r, OTHER) if block else host, []).append(Cell(r, cat))
    notes = {a["host"]: f"agent {a['state']}" for a in s.agents if a["state"] != "up"}
    return GridCells(list(cells.items()), notes, counts, visible, len(everyone))


def host_style(cells: Sequence[Cell]) -> str:
    """A block holding a suspect has its name in the suspect's colour."""
    return HOST_SUSPECT if any(c.category == "suspect" for c in cells) else HOST


def is_compact(blocks: Sequence[tuple[str, Sequence[Cell]]]) -> bool:
    return sum(len(cs) for _, cs in blocks) > WIDE_MAX


def grid_lines(blocks: Sequence[tuple[str, Sequence[Cell]]], notes: Mapping[str, str], width: int) -> list[list[Seg]]:
    """The grid's lines at ``width`` columns: wide (a block's name, then its cells " n " on lines
    below) up to WIDE_MAX ranks, else compact (one glyph per rank, several blocks per line)."""
    width = max(8, width)
    return _compact(blocks, notes, width) if is_compact(blocks) else _wide(blocks, notes, width)


def _wide(blocks: Sequence[tuple[str, Sequence[Cell]]], notes: Mapping[str, str], width: int) -> list[list[Seg]]:
    lines: list[list[Seg]] = []
    digits = max((len(str(c.rank)) for _, cs in blocks for c in cs), default=1)
    per_line = max(1, (width + 1) // (digits + 3))
    for host, cells in blocks:
        head = f"{short_host(host, max(8, width - 12))} "
        line: list[Seg] = [(head, host_style(cells), None), (compress(c.rank for c in cells), DIM, None)]
        if host in notes:
            line.append((f"  {printable(notes[host])}", DIM, None))
        lines.append(line)
        for i in range(0, len(cells), per_line):
            row: list[Seg] = []
            for c in cells[i:i + per_line]:
                row.append((f" {c.rank:>{digits}} ", c.category, c.rank))  # "[n]" when selected
                row.append((" ", PLAIN, None))
            lines.append(row[:-1])
    return lines


def _compact(blocks: Sequence[tuple[str, Sequence[Cell]]], notes: Mapping[str, str], width: int) -> list[list[Seg]]:
    labels = {h: short_host(h, 12) for h, _ in blocks}
    label_w = min(12, max((len(labels[h]) for h, _ in blocks), default=4))
    cap = max(1, width - label_w - 1)
    rows_of: list[list[list[Seg]]] = []
    for host, cells in blocks:
        rows = []
        for i in range(0, max(1, len(cells)), cap):
            label = labels[host].ljust(label_w) if i == 0 else " " * label_w
            row: list[Seg] = [(label + " ", host_style(cells), None)]
            if i == 0 and host in notes:
                row.append(("? ", "unknown", None))  # compact: a mark for "agent lost"
            row += [("!" if c.category == "suspect" else GLYPH, c.category, c.rank) for c in cells[i:i + cap]]
            rows.append(row)
        rows_of.append(rows)
    lines: list[list[Seg]] = []
    cur: list[Seg] = []
    cur_w = 0
    for rows in rows_of:
        if len(rows) > 1:  # a block of several lines starts on its own line
            if cur:
                lines.append(cur)
                cur, cur_w = [], 0
            lines.extend(rows)
            continue
        w = sum(len(t) for t, _, _ in rows[0])
        if cur and cur_w + 2 + w > width:
            lines.append(cur)
            cur, cur_w = [], 0
        if cur:
            cur.append(("  ", PLAIN, None))
            cur_w += 2
        cur += rows[0]
        cur_w += w
    if cur:
        lines.append(cur)
    return lines


def hit_map(lines: Sequence[Sequence[Seg]]) -> tuple[dict[int, tuple[int, int, int]], list[list[tuple[int, int, int]]]]:
    """Where each rank's cell is: ``{rank: (y, x0, x1)}``, and per line ``[(x0, x1, rank)]`` (clicks,
    and the cursor moving up and down to the nearest cell)."""
    hits: dict[int, tuple[int, int, int]] = {}
    rows: list[list[tuple[int, int, int]]] = []
    for y, segs in enumerate(lines):
        x = 0
        row = []
        for text, _, rank in segs:
            if rank is not None:
                hits[rank] = (y, x, x + len(text))
                row.append((x, x + len(text), rank))
            x += len(text)
        rows.append(row)
    return hits, rows
