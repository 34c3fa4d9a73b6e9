"""The dashboard's widgets. They render records they are handed; none of them probes or blocks.

Every untrusted string (process and host names, paths, function names, evidence text) reaches the
screen as a rich ``Text`` built from the plain string (after :func:`~scout_sys.report.printable`),
never as markup.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static, Tree
from textual.widgets.tree import TreeNode

from scout_sys.model import Incident
from scout_sys.report import printable
from scout_sys.text import compress
from scout_sys.tui.grid import RankGrid
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
        t.append(r.pid_text())
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
