"""The dashboard's rank grid: one cell per rank, coloured by category, laid out by host (or by the
learned peers). It renders the cells it is handed (tui/cells.py computes them); it never probes or
blocks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

from scout_sys.tui.cells import DIM, HOST, HOST_SUSPECT, PLAIN, Cell, Seg, grid_lines, hit_map, is_compact
from scout_sys.tui.state import CATEGORIES

__all__ = ["Cell", "RankGrid"]


class RankGrid(Widget, can_focus=True):
    """One cell per rank, coloured by category, laid out by host. Up to ``cells.WIDE_MAX`` ranks each
    cell shows its rank number; beyond, one glyph per rank, several hosts per line. The lines come
    from tui/cells.py; this widget paints them, caches them and moves its cursor over them."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {f"rankgrid--{c}" for c in CATEGORIES} | {
        f"rankgrid--{HOST}", f"rankgrid--{HOST_SUSPECT}", "rankgrid--cursor"}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left", "move(-1, 0)", "prev", show=False),
        Binding("right", "move(1, 0)", "next", show=False),
        Binding("up", "move(0, -1)", "up", show=False),
        Binding("down", "move(0, 1)", "down", show=False),
        Binding("home", "edge(0)", "first", show=False),
        Binding("end", "edge(1)", "last", show=False),
        Binding("enter", "details", "details"),
    ]

    selected: reactive[int | None] = reactive(None)

    class Selected(Message):
        def __init__(self, rank: int, open_details: bool = False) -> None:
            super().__init__()
            self.rank = rank
            self.open_details = open_details

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._hosts: list[tuple[str, list[Cell]]] = []
        self._version = 0
        self._cache: tuple[int, int, list[list[Seg]]] | None = None
        self._hits: dict[int, tuple[int, int, int]] = {}  # rank -> (y, x0, x1)
        self._rows: list[list[tuple[int, int, int]]] = []  # y -> [(x0, x1, rank)]
        self._order: list[int] = []
        self._compact = False
        self._notes: dict[str, str] = {}
        self._strip_key: object = None
        self._strips: dict[int, Strip] = {}
        self._style_map: dict[str, Style] = {}

    # ---- data
    def set_cells(self, hosts: Sequence[tuple[str, list[Cell]]], notes: Mapping[str, str] | None = None) -> None:
        """``notes``: a word after a host's name (watch --cluster: "agent lost"). A host holding a
        suspect has its name in the suspect's colour."""
        hosts = [(h, list(cs)) for h, cs in hosts]
        notes = dict(notes or {})
        if hosts == self._hosts and notes == self._notes:
            return
        self._hosts, self._notes = hosts, notes
        self._version += 1
        self._cache = None
        self._order = [c.rank for _, cs in self._hosts for c in cs]
        self.refresh(layout=True)

    @property
    def ranks(self) -> list[int]:
        return list(self._order)

    # ---- layout
    def _layout(self, width: int) -> list[list[Seg]]:
        """The lines at ``width`` (tui/cells.py), cached until the cells or the width change."""
        width = max(8, width)
        if self._cache and self._cache[0] == width and self._cache[1] == self._version:
            return self._cache[2]
        self._compact = is_compact(self._hosts)
        lines = grid_lines(self._hosts, self._notes, width)
        self._cache = (width, self._version, lines)
        self._hits, self._rows = hit_map(lines)
        return lines

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return max(1, len(self._layout(width)))

    def _styles(self) -> dict[str, Style]:
        base = self.rich_style
        styles = {c: self.get_component_rich_style(f"rankgrid--{c}") for c in CATEGORIES}
        if self._compact:  # one glyph per rank: the category's colour on the glyph, not behind it
            for c in CATEGORIES:
                if c != "suspect":
                    styles[c] = Style(color=styles[c].bgcolor)
        styles[HOST] = self.get_component_rich_style(f"rankgrid--{HOST}")
        styles[HOST_SUSPECT] = self.get_component_rich_style(f"rankgrid--{HOST_SUSPECT}")
        styles[DIM] = Style(dim=True)
        styles[PLAIN] = Style()
        return {k: base + v for k, v in styles.items()}

    def render_line(self, y: int) -> Strip:
        """Line API: one strip per grid line, built from segments and cached until the data, the
        width or the selection changes (a 1,024-rank grid is ~40 strips, not one 1,024-span text)."""
        width = self.size.width
        lines = self._layout(width)
        key = (self._version, width, self.selected, self.app.current_theme.name)
        if key != self._strip_key:
            self._strip_key = key
            self._strips = {}
            self._style_map = self._styles()
        strip = self._strips.get(y)
        if strip is None:
            strip = self._strips[y] = self._build_strip(lines[y] if y < len(lines) else [], width)
        return strip

    def _build_strip(self, segs: list[Seg], width: int) -> Strip:
        styles = self._style_map
        cursor = self.get_component_rich_style("rankgrid--cursor")
        out: list[Segment] = []
        run_text, run_style = "", None
        for text, cat, rank in segs:
            st = styles.get(cat, styles[PLAIN])
            if rank is not None and rank == self.selected:
                if self._compact:
                    st = st + Style(color="white", bgcolor=st.color or st.bgcolor, bold=True)
                else:  # only the cursor's text style: the cell keeps its state's colours
                    st = st + Style(bold=cursor.bold, underline=cursor.underline, italic=cursor.italic)
                    text = f"[{text[1:-1]}]"
            if st == run_style:
                run_text += text
            else:
                if run_text:
                    out.append(Segment(run_text, run_style))
                run_text, run_style = text, st
        if run_text:
            out.append(Segment(run_text, run_style))
        if not segs and not self._hosts and not self._strips:
            out.append(Segment("no ranks", styles[DIM]))
        return Strip(out).crop_extend(0, width, self.rich_style)

    # ---- interaction
    def watch_selected(self, old: int | None, new: int | None) -> None:
        self.refresh()
        if new is None:
            return
        self._layout(self.size.width or 80)
        hit = self._hits.get(new)
        if hit and self.parent is not None and isinstance(self.parent, VerticalScroll):
            y, x0, x1 = hit
            vr = self.virtual_region
            self.parent.scroll_to_region(Region(vr.x + x0, vr.y + y, x1 - x0, 1), animate=False)

    def select(self, rank: int, open_details: bool = False) -> None:
        self.selected = rank
        self.post_message(self.Selected(rank, open_details))

    def action_edge(self, last: int) -> None:
        if self._order:
            self.select(self._order[-1] if last else self._order[0])

    def action_move(self, dx: int, dy: int) -> None:
        if not self._order:
            return
        if self.selected not in self._hits:
            self.select(self._order[0])
            return
        if dx:
            i = self._order.index(self.selected) + dx
            self.select(self._order[max(0, min(len(self._order) - 1, i))])
            return
        y, x0, _ = self._hits[self.selected]
        ny = y + dy
        while 0 <= ny < len(self._rows) and not self._rows[ny]:
            ny += dy
        if 0 <= ny < len(self._rows):
            best = min(self._rows[ny], key=lambda seg: abs(seg[0] - x0))
            self.select(best[2])

    def rank_at(self, x: int, y: int) -> int | None:
        if 0 <= y < len(self._rows):
            for x0, x1, rank in self._rows[y]:
                if x0 <= x < x1:
                    return rank
        return None

    def on_click(self, event: events.Click) -> None:
        off = event.get_content_offset(self)
        if off is None:
            return
        rank = self.rank_at(off.x, off.y)
        if rank is not None:
            self.focus()
            self.select(rank, open_details=getattr(event, "chain", 1) >= 2)

    def action_details(self) -> None:
        if self.selected is not None:
            self.post_message(self.Selected(self.selected, open_details=True))
