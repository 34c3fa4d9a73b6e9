"""The dashboard's widgets. They render records they are handed; none of them probes or blocks.

Every untrusted string (process and host names, paths, function names, evidence text) reaches the
screen as a rich ``Text`` built from the plain string (after :func:`~scout_sys.report.printable`),
never as markup.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.screen import ModalScreen
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Static, Tree
from textual.widgets.tree import TreeNode

from scout_sys.model import Incident
from scout_sys.report import printable
from scout_sys.text import compress
from scout_sys.tui.state import (
    CATEGORIES,
    StackGroup,
    fmt_elapsed,
    fmt_seconds,
    pyspy_frame,
    short_host,
    sparkline,
)


def lit(text: object, style: str | Style = "") -> Text:
    """Untrusted text, shown literally."""
    return Text(printable(str(text)), style=style, no_wrap=False)


# --------------------------------------------------------------------------- text panels


class TextPanel(Static):
    """A Static that repaints only when its text changed, and re-lays out the screen only when its
    number of lines changed (most refreshes change a number, not a size)."""

    _shown: Text | None = None

    def set_text(self, t: Text) -> None:
        old = self._shown
        if old is not None and old == t:
            return
        self._shown = t
        self.update(t, layout=old is None or old.plain.count("\n") != t.plain.count("\n"))


# --------------------------------------------------------------------------- header


class HeaderBar(TextPanel):
    """Job, elapsed time, overall status and which probes are on."""

    DEFAULT_CLASSES = "header"

    def show(self, s: Any, *, status: str, status_style: str, live: bool, note: str = "") -> None:
        job = s.job
        hosts = sorted({r.host for r in job.ranks} or {job.host})
        launcher = f"{job.launcher} pid {job.launcher_pid}" if job.launcher_pid else job.launcher
        t = Text()
        t.append(" scout-sys ", style="bold reverse")
        t.append(" job ")
        t.append(printable(launcher), style="bold")
        t.append(f" · {job.world_size} ranks on {len(hosts)} host{'s' if len(hosts) != 1 else ''} (")
        shown = ", ".join(short_host(h) for h in hosts[:3]) + (f", +{len(hosts) - 3}" if len(hosts) > 3 else "")
        t.append(printable(shown))
        t.append(")")
        t.append(f" · elapsed {fmt_elapsed(s.time - s.started)}")
        if s.stall_after:
            t.append(f" · stall after {fmt_seconds(s.stall_after)}")
        if not live:
            t.append(" · replay", style="bold magenta")
        t.append("\n ")
        t.append(f" {status} ", style=status_style)
        if note:
            t.append("  ")
            t.append(printable(note), style="italic")
        t.append("  probes:")
        for name, reason in sorted(s.probes.items()):
            t.append(" ")
            t.append(printable(name), style="green" if reason is None else "dim strike")
            t.append("✓" if reason is None else "✗", style="green" if reason is None else "red")
        self.set_text(t)


# --------------------------------------------------------------------------- rank grid

_GLYPH = "■"


@dataclass(frozen=True)
class Cell:
    rank: int
    category: str


class RankGrid(Widget, can_focus=True):
    """One cell per rank, coloured by category, laid out by host. Up to ~256 ranks each cell shows
    its rank number; beyond, one glyph per rank, several hosts per line."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {f"rankgrid--{c}" for c in CATEGORIES} | {
        "rankgrid--host", "rankgrid--host-suspect", "rankgrid--cursor"}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left", "move(-1, 0)", "prev", show=False),
        Binding("right", "move(1, 0)", "next", show=False),
        Binding("up", "move(0, -1)", "up", show=False),
        Binding("down", "move(0, 1)", "down", show=False),
        Binding("home", "edge(0)", "first", show=False),
        Binding("end", "edge(1)", "last", show=False),
        Binding("enter", "details", "details"),
    ]
    WIDE_MAX = 256

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
        self._cache: tuple[int, int, list[list[tuple[str, str, int | None]]]] | None = None
        self._hits: dict[int, tuple[int, int, int]] = {}  # rank -> (y, x0, x1)
        self._rows: list[list[tuple[int, int, int]]] = []  # y -> [(x0, x1, rank)]
        self._order: list[int] = []
        self._compact = False
        self._labels: dict[str, str] = {}
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
        self._labels = {h: short_host(h, 12) for h, _ in hosts}
        self._version += 1
        self._cache = None
        self._order = [c.rank for _, cs in self._hosts for c in cs]
        self.refresh(layout=True)

    @property
    def ranks(self) -> list[int]:
        return list(self._order)

    # ---- layout
    def _layout(self, width: int) -> list[list[tuple[str, str, int | None]]]:
        width = max(8, width)
        if self._cache and self._cache[0] == width and self._cache[1] == self._version:
            return self._cache[2]
        total = sum(len(cs) for _, cs in self._hosts)
        self._compact = total > self.WIDE_MAX
        lines = self._layout_compact(width) if self._compact else self._layout_wide(width)
        self._cache = (width, self._version, lines)
        self._hits.clear()
        self._rows = []
        for y, segs in enumerate(lines):
            x = 0
            row = []
            for text, _, rank in segs:
                if rank is not None:
                    self._hits[rank] = (y, x, x + len(text))
                    row.append((x, x + len(text), rank))
                x += len(text)
            self._rows.append(row)
        return lines

    def _layout_wide(self, width: int) -> list[list[tuple[str, str, int | None]]]:
        lines: list[list[tuple[str, str, int | None]]] = []
        digits = max((len(str(c.rank)) for _, cs in self._hosts for c in cs), default=1)
        per_line = max(1, (width + 1) // (digits + 3))
        for host, cells in self._hosts:
            head = f"{short_host(host, max(8, width - 12))} "
            line = [(head, self._host_style(cells), None), (compress(c.rank for c in cells), "dim", None)]
            if host in self._notes:
                line.append((f"  {printable(self._notes[host])}", "dim", None))
            lines.append(line)
            for i in range(0, len(cells), per_line):
                row: list[tuple[str, str, int | None]] = []
                for c in cells[i:i + per_line]:
                    row.append((f" {c.rank:>{digits}} ", c.category, c.rank))  # "[n]" when selected
                    row.append((" ", "", None))
                lines.append(row[:-1])
        return lines

    def _layout_compact(self, width: int) -> list[list[tuple[str, str, int | None]]]:
        label_w = min(12, max((len(self._labels[h]) for h, _ in self._hosts), default=4))
        cap = max(1, width - label_w - 1)
        blocks: list[list[list[tuple[str, str, int | None]]]] = []
        for host, cells in self._hosts:
            rows = []
            for i in range(0, max(1, len(cells)), cap):
                label = self._labels[host].ljust(label_w) if i == 0 else " " * label_w
                row: list[tuple[str, str, int | None]] = [(label + " ", self._host_style(cells), None)]
                if i == 0 and host in self._notes:
                    row.append(("? ", "unknown", None))  # compact: a mark for "agent lost"
                row += [("!" if c.category == "suspect" else _GLYPH, c.category, c.rank)
                        for c in cells[i:i + cap]]
                rows.append(row)
            blocks.append(rows)
        lines: list[list[tuple[str, str, int | None]]] = []
        cur: list[tuple[str, str, int | None]] = []
        cur_w = 0
        for rows in blocks:
            if len(rows) > 1:
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
                cur.append(("  ", "", None))
                cur_w += 2
            cur += rows[0]
            cur_w += w
        if cur:
            lines.append(cur)
        return lines

    @staticmethod
    def _host_style(cells: Sequence[Cell]) -> str:
        return "host-suspect" if any(c.category == "suspect" for c in cells) else "host"

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return max(1, len(self._layout(width)))

    def _styles(self) -> dict[str, Style]:
        base = self.rich_style
        styles = {c: self.get_component_rich_style(f"rankgrid--{c}") for c in CATEGORIES}
        if self._compact:  # one glyph per rank: the category's colour on the glyph, not behind it
            for c in CATEGORIES:
                if c != "suspect":
                    styles[c] = Style(color=styles[c].bgcolor)
        styles["host"] = self.get_component_rich_style("rankgrid--host")
        styles["host-suspect"] = self.get_component_rich_style("rankgrid--host-suspect")
        styles["dim"] = Style(dim=True)
        styles[""] = Style()
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

    def _build_strip(self, segs: list[tuple[str, str, int | None]], width: int) -> Strip:
        styles = self._style_map
        cursor = self.get_component_rich_style("rankgrid--cursor")
        out: list[Segment] = []
        run_text, run_style = "", None
        for text, cat, rank in segs:
            st = styles.get(cat, styles[""])
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
            out.append(Segment("no ranks", styles["dim"]))
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


class Legend(TextPanel):
    """Colour key with counts per category (what a 1,024-rank grid needs to be read)."""

    COMPONENT_CLASSES: ClassVar[set[str]] = RankGrid.COMPONENT_CLASSES

    def show(self, counts: Mapping[str, int], shown: int, total: int) -> None:
        t = Text()
        for c in CATEGORIES:
            t.append(" ")
            t.append(f" {counts.get(c, 0)} ", self.get_component_rich_style(f"rankgrid--{c}"))
            t.append(f" {c}")
        if shown != total:
            t.append(f"   filter: {shown}/{total} ranks", "bold")
        self.set_text(t)


# --------------------------------------------------------------------------- trees


class LiteralTree(Tree[Any]):
    """A Tree whose string labels are text, never markup."""

    def process_label(self, label: str | Text) -> Text:  # type: ignore[override]
        return super().process_label(lit(label) if isinstance(label, str) else label)


def _expanded_keys(node: TreeNode[Any]) -> set[object]:
    out: set[object] = set()
    for child in node.children:
        if child.is_expanded and isinstance(child.data, tuple) and child.data:
            out.add(child.data[1])
        out |= _expanded_keys(child)
    return out


class StackTree(LiteralTree):
    """Ranks grouped by identical main-thread stacks: the majority first, outliers after;
    each group expands into its frames, innermost first, like ``py-spy dump``."""

    MAX_GROUPS = 64

    def __init__(self, **kw: Any) -> None:
        super().__init__("stacks", **kw)
        self.show_root = False
        self._sig: object = None
        self._known: set[tuple[str, ...]] = set()  # groups shown before: their expansion is the user's

    def show_groups(self, groups: Sequence[StackGroup]) -> None:
        sig = tuple((g.stack, g.ranks, g.suspect) for g in groups[: self.MAX_GROUPS])
        if sig == self._sig:
            return
        self._sig = sig
        keep = _expanded_keys(self.root)
        cursor = self.cursor_line
        self.clear()
        if not groups:
            self.root.add_leaf(Text("no stacks yet (py-spy reads them every few polls)", style="dim"))
            return
        for i, g in enumerate(groups[: self.MAX_GROUPS]):
            n = len(g.ranks)
            label = Text()
            tag, style = (("majority", "bold green") if g.majority else
                          ("suspect", "bold red") if g.suspect else ("outlier", "bold yellow"))
            label.append(f"{tag} ", style)
            label.append(f"{n} rank{'s' if n != 1 else ''} ")
            label.append(compress(g.ranks), "bold")
            if g.stack:
                label.append("  ")
                label.append(pyspy_frame(g.stack[0]), "dim")
            expand = (g.stack in keep) if g.stack in self._known else (i < 2 or g.suspect)
            self._known.add(g.stack)
            node = self.root.add(label, data=("group", g.stack, g.ranks), expand=expand)
            if not g.stack:
                node.add_leaf(Text("(no Python frames)", style="dim"))
            for j, frame in enumerate(g.stack):
                fl = Text("  ")
                fl.append(pyspy_frame(frame), "bold" if j < g.differs else "")
                node.add_leaf(fl, data=("frame", frame))
        if len(groups) > self.MAX_GROUPS:
            rest = groups[self.MAX_GROUPS:]
            self.root.add_leaf(Text(f"… {len(rest)} more groups ({sum(len(g.ranks) for g in rest)} ranks)",
                                    style="dim"))
        self.cursor_line = min(cursor, max(0, self.last_line))


def _incident_label(inc: Incident, now: float, *, open_: bool) -> Text:
    t = Text()
    t.append("● OPEN " if open_ else "○ closed ", "bold red" if open_ else "dim")
    t.append(printable(inc.kind), "bold")
    t.append(f" ({printable(inc.status)})")
    if inc.ranks:
        t.append(f" rank{'s' if len(inc.ranks) != 1 else ''} ")
        t.append(compress(inc.ranks), "bold")
    t.append(f" · since {time.strftime('%H:%M:%S', time.localtime(inc.since))} · ", "dim")
    t.append(printable(inc.summary))
    return t


def incident_key(inc: Incident) -> str:
    return inc.id or f"{inc.kind}:{inc.status}:{compress(inc.ranks)}:{inc.since:.3f}"


class IncidentTree(LiteralTree):
    """Open incidents (expanded: evidence, stacks) and recently closed ones."""

    def __init__(self, **kw: Any) -> None:
        super().__init__("incidents", **kw)
        self.show_root = False
        self.auto_expand = False
        self._sig: object = None

    def show_incidents(self, open_: Sequence[Incident], closed: Sequence[Incident], now: float) -> None:
        sig = (tuple((incident_key(i), i.summary, len(i.evidence), i.status) for i in open_),
               tuple(incident_key(i) for i in closed))
        if sig == self._sig:
            return
        first = self._sig is None
        keep = _expanded_keys(self.root)
        known = {k for k, *_ in (self._sig[0] if isinstance(self._sig, tuple) else ())}
        self._sig = sig
        cursor = self.cursor_line
        self.clear()
        if not open_ and not closed:
            self.root.add_leaf(Text("no incidents", style="green"))
            return
        for inc, is_open in [(i, True) for i in open_] + [(i, False) for i in reversed(closed)]:
            key = incident_key(inc)
            expand = key in keep or (is_open and (first or key not in known))
            node = self.root.add(_incident_label(inc, now, open_=is_open), data=("incident", key, inc),
                                 expand=expand)
            for e in inc.evidence:
                et = Text()
                et.append(f"[{printable(e.source)}] ", "cyan")
                et.append(printable(e.text))
                stack = e.data.get("stack") if isinstance(e.data, dict) else None
                if stack:
                    en = node.add(et, data=("evidence", f"{key}/{id(e)}", inc), expand=False)
                    for fr in stack:
                        en.add_leaf(Text("  " + pyspy_frame(str(fr))), data=("frame", fr))
                else:
                    node.add_leaf(et, data=("evidence", None, inc))
        self.cursor_line = min(cursor, max(0, self.last_line))


# --------------------------------------------------------------------------- timing and devices


class TimingPanel(TextPanel):
    """Step time and collective-wait sparklines for the ranks that matter: suspects, the selected
    rank, the slowest few, and the median of all."""

    def show(self, step_times: Mapping[int, Sequence[float]], waits: Mapping[int, Sequence[float]],
             ranks: Sequence[int], *, suspect: Iterable[int] = ()) -> None:
        t = Text(no_wrap=True, overflow="ellipsis")
        if not step_times and not waits:
            t.append("no step timings yet (they need the eBPF collective probe)", "dim")
            self.set_text(t)
            return
        top_s = max((max(v) for v in step_times.values() if v), default=0.0)
        t.append(f"{'rank':>6}  {'step time':<16} {'last':>6}  {'collective wait':<16} {'last':>5}", "bold")
        sus = set(suspect)
        for r in ranks:
            st = list(step_times.get(r, ()))
            wf = list(waits.get(r, ()))
            t.append("\n")
            label = f"{r:>6}" if r >= 0 else f"{'median':>6}"
            t.append(label, "bold red" if r in sus else "")
            t.append("  ")
            t.append(sparkline(st, top=top_s), "red" if r in sus else "cyan")
            t.append(f" {fmt_seconds(st[-1]) if st else '-':>6}  ")
            t.append(sparkline(wf, top=1.0), "yellow")
            t.append(f" {f'{wf[-1] * 100:.0f}%' if wf else '-':>5}")
        self.set_text(t)


class DevicePanel(TextPanel):
    """NVML per rank (``model.DeviceSample.to_json``): GPU, utilisation, memory, temperature, power,
    uncorrected ECC errors and self-imposed slowdowns (hidden without NVML)."""

    def show(self, devices: Mapping[int, Mapping[str, object]], ranks: Sequence[int],
             *, suspect: Iterable[int] = ()) -> None:
        sus = set(suspect)
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(f"{'rank':>6} {'gpu':>3}  {'util':>4}  {'memory GiB':>11}  {'temp':>4}  {'power':>5}  ecc  slowdown",
                 "bold")
        for r in ranks:
            d = devices.get(r)
            if not d:
                continue
            t.append("\n")
            t.append(f"{r:>6}", "bold red" if r in sus else "")
            t.append(f" {_na(d.get('index')):>3}")
            util = d.get("util_percent", d.get("util"))
            t.append(f"  {_na(util, '%'):>4}")
            mu, mt = d.get("mem_used"), d.get("mem_total")
            t.append(f"  {f'{_gib(mu)}/{_gib(mt)}' if mu is not None and mt is not None else '-':>11}")
            t.append(f"  {_na(d.get('temperature_c', d.get('temp')), 'C'):>4}")
            power = d.get("power_w")
            t.append(f"  {f'{power:.0f}W' if isinstance(power, (int, float)) else '-':>5}")
            ecc = d.get("ecc_uncorrected", d.get("errors"))
            t.append(f"  {_na(ecc):>3}", "bold red" if ecc else "")
            slow = d.get("slowdown")
            t.append(f"  {printable(str(slow)) if slow else ''}", "bold yellow" if slow else "")
        self.set_text(t)


def _na(v: object, unit: str = "") -> str:
    return "-" if v is None else f"{printable(str(v))}{unit}"


def _gib(v: object) -> str:
    try:
        return f"{float(v) / 2**30:.1f}"  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "?"


# --------------------------------------------------------------------------- modal screens


class TextScreen(ModalScreen[None]):
    """A scrollable page of text (details, help, a fresh diagnosis); escape, q or enter closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,enter", "dismiss", "close"),
    ]

    def __init__(self, title: str, body: Text, **kw: Any) -> None:
        super().__init__(**kw)
        self._title = title
        self._body = body

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="page") as v:
            v.border_title = printable(self._title)
            v.border_subtitle = "escape: close"
            yield Static(self._body, id="page-body")

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)


HELP = """\
keys
  d        diagnose now (samples the job for a few seconds, shows the verdict)
  r        replay now: the same kernels beside every device (sdc, slow devices; docs/replay.md)
  s        save a report: JSON (scout-sys/diagnosis/v1, reopens in the dashboard) and Markdown
  /        filter ranks: 3  0-15  waiting  suspect  host:node7  (any term matches; empty: all)
  enter    details of the selected rank (grid) or incident
  g        lay the rank grid out by host or by peer group (equivalent ranks)
  w        wait-for chains: from the selected waiting rank to the origin, group and collective each step
  arrows   move in the rank grid; tab moves between panels
  space    expand / collapse a stack group or evidence
  ?        this help
  q        quit (exit status 1 if any incident was seen)

mouse: click a rank to select it, double-click for details; click groups and incidents.

colours
  progressing  running or computing          waiting  inside a collective (a witness)
  stalled      idle, or in uninterruptible sleep  stopped  SIGSTOP / traced
  exited       the process is gone           suspect  named as origin of an open incident
"""


def help_text() -> Text:
    return Text(HELP)


def rank_details(s: Any, rank: int) -> Text:
    """Everything the snapshot knows about one rank."""
    t = Text()
    r = s.job.by_rank().get(rank)
    v = s.views.get(rank)
    t.append(f"rank {rank}\n", "bold")
    if r:
        t.append("  pid ")
        t.append(str(r.pid))
        t.append("  host ")
        t.append(printable(r.host))
        t.append(f"  local rank {r.local_rank}  device ")
        t.append(printable(r.device))
        if r.name:
            t.append("  process ")
            t.append(printable(r.name))
        t.append("\n")
    elif rank in s.job.missing:
        t.append("  not found: exited before scout-sys looked\n")
    if v:
        t.append(f"  state {v.state}")
        if v.cpu_percent is not None:
            t.append(f"  cpu {v.cpu_percent:.0f}%")
        t.append("\n")
        if v.collective:
            t.append("  in collective ")
            t.append(printable(v.collective))
            t.append("\n")
        if v.where:
            t.append("  where ")
            t.append(printable(v.where))
            t.append("\n")
    for inc in s.incidents:
        if rank in inc.ranks:
            t.append("  SUSPECT: ", "bold red")
            t.append(printable(f"{inc.kind} ({inc.status}): {inc.summary}"))
            t.append("\n")
            for e in inc.evidence:
                if e.rank in (None, rank):
                    t.append(f"    [{printable(e.source)}] ")
                    t.append(printable(e.text))
                    t.append("\n")
    st = s.step_times.get(rank)
    if st:
        t.append(f"  step times {sparkline(st, 24)} last {fmt_seconds(st[-1])}\n")
    wf = s.wait_fractions.get(rank)
    if wf:
        t.append(f"  collective wait {sparkline(wf, 24, top=1.0)} last {wf[-1] * 100:.0f}%\n")
    d = s.devices.get(rank)
    if d:
        t.append("  device ")
        t.append(printable(", ".join(f"{k}={val}" for k, val in d.items())))
        t.append("\n")
    stack = s.stacks.get(rank) or (v.stack if v else ())
    t.append("\n  main thread, innermost first:\n", "bold")
    if not stack:
        t.append("    (no stack read yet)\n", "dim")
    for fr in stack:
        t.append("    ")
        t.append(pyspy_frame(fr))
        t.append("\n")
    return t


def incident_details(inc: Incident, now: float) -> Text:
    t = Text()
    t.append(printable(f"{inc.kind} ({inc.status})"), "bold")
    if inc.ranks:
        t.append(f"  ranks {compress(inc.ranks)} on ")
        t.append(printable(", ".join(inc.hosts)))
    t.append("\n  ")
    t.append(printable(inc.summary))
    clock = time.strftime("%H:%M:%S", time.localtime(inc.since))
    t.append(f"\n  since {clock} ({fmt_seconds(max(0.0, now - inc.since))} ago)")
    if inc.id:
        t.append("  id ")
        t.append(printable(inc.id))
    t.append("\n\nevidence\n", "bold")
    for e in inc.evidence:
        t.append(f"  [{printable(e.source)}] ", "cyan")
        t.append(printable(e.text))
        t.append("\n")
        for k, val in e.data.items():
            if k == "stack" and isinstance(val, list):
                for fr in val:
                    t.append("      ")
                    t.append(pyspy_frame(str(fr)))
                    t.append("\n")
            else:
                t.append(f"      {printable(str(k))}: ", "dim")
                t.append(printable(str(val)))
                t.append("\n")
    return t
