"""Pure helpers the dashboard's widgets share: rank categories, stack groups, filters, the header's
status, the timing panel's rows, sparklines (the rank grid's own computation: tui/cells.py).

No textual, no I/O: every function here is a plain function of a snapshot's records, so it is
unit-testable on synthetic data at thousands of ranks.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from scout_sys.model import ATTRIBUTED, Incident, Job, RankView, Snapshot
from scout_sys.report import printable
from scout_sys.text import compress, coords_text

# What a cell of the rank grid says, in the order of the legend. "suspect" wins over every state.
CATEGORIES = ("progressing", "waiting", "stalled", "stopped", "exited", "unknown", "suspect")

_STATE_CATEGORY = {
    "running": "progressing",
    "busy": "progressing",
    "waiting": "waiting",
    "idle": "stalled",
    "disk-sleep": "stalled",
    "stopped": "stopped",
    "exited": "exited",
    "unknown": "unknown",
}


def category(view: RankView | None, suspect: bool = False) -> str:
    if suspect:
        return "suspect"
    if view is None:
        return "unknown"
    return _STATE_CATEGORY.get(view.state, "unknown")


def suspects(incidents: Iterable[Incident]) -> frozenset[int]:
    """Ranks named as the origin of an open incident (inconclusive incidents name none)."""
    return frozenset(r for i in incidents if i.status == ATTRIBUTED for r in i.ranks)


def short_host(host: str, width: int = 14) -> str:
    h = printable(host)
    if not h.replace(".", "").isdigit():  # keep IP addresses whole
        h = h.split(".", 1)[0]
    return h if len(h) <= width else h[: width - 1] + "…"


def peer_blocks(job: Job) -> list[tuple[str, tuple[int, ...]]]:
    """The rank grid's blocks by peer group (the job's, learned or given: consensus/peers.py), each
    labelled with the coordinates its ranks share, e.g. ``peers 1 (tp=1)``."""
    by_rank = job.by_rank()
    out = []
    for i, grp in enumerate(job.groups()):
        shared = None
        for r in grp:
            rk = by_rank.get(r)
            c = tuple((d, v) for d, v in rk.coords if d != "dp") if rk is not None and rk.coords else None
            shared = c if shared is None or shared == c else ()
        out.append((f"peers {i}" + (f" ({coords_text(shared)})" if shared else ""), tuple(grp)))
    return out


def peers_title(job: Job | None) -> str:
    """The grid's title when laid out by peer group: where the groups came from."""
    if job is None or not job.peer_groups:
        return "ranks by peer group (layout unknown: the whole job)"
    return f"ranks by peer group ({job.layout_from})"


# --------------------------------------------------------------------------- stacks

_FRAME = re.compile(r"^(?P<file>.*):(?P<line>\d+) (?P<function>.*)$")


def pyspy_frame(where: str) -> str:
    """``"train.py:42 step"`` → ``"step (train.py:42)"``, as ``py-spy dump`` prints frames."""
    m = _FRAME.match(where)
    if not m:
        return printable(where)
    return printable(f"{m['function']} ({m['file']}:{m['line']})")


@dataclass(frozen=True)
class StackGroup:
    stack: tuple[str, ...]  # innermost first
    ranks: tuple[int, ...]
    majority: bool  # the largest group, and larger than every other
    suspect: bool  # holds a rank named in an open incident
    differs: int  # how many innermost frames differ from the majority's stack (0 for the majority)

    @property
    def key(self) -> tuple[str, ...]:
        return self.stack


def _differs(stack: Sequence[str], ref: Sequence[str]) -> int:
    """Frames of ``stack`` (innermost first) not shared with ``ref``'s outermost common part."""
    common = 0
    for a, b in zip(reversed(stack), reversed(ref)):
        if a != b:
            break
        common += 1
    return len(stack) - common


def group_stacks(stacks: Mapping[int, Sequence[str]], *, suspect: frozenset[int] = frozenset(),
                 ranks: Iterable[int] | None = None) -> list[StackGroup]:
    """Ranks grouped by identical main-thread stacks, largest group first (ties: lowest rank)."""
    wanted = None if ranks is None else set(ranks)
    by_stack: dict[tuple[str, ...], list[int]] = {}
    for r, st in stacks.items():
        if wanted is not None and r not in wanted:
            continue
        by_stack.setdefault(tuple(st), []).append(r)
    order = sorted(by_stack.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
    if not order:
        return []
    top = order[0]
    has_majority = len(order) == 1 or len(top[1]) > len(order[1][1])
    out = []
    for i, (st, rs) in enumerate(order):
        maj = i == 0 and has_majority
        out.append(StackGroup(stack=st, ranks=tuple(sorted(rs)), majority=maj,
                              suspect=bool(suspect.intersection(rs)),
                              differs=0 if maj or not has_majority else _differs(st, top[0])))
    return out


# --------------------------------------------------------------------------- filter

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_filter(expr: str) -> Callable[[int, str, str], bool] | None:
    """A filter for ``(rank, host, category)``: comma/space separated terms, any of which matches.

    ``3``, ``0-15``: ranks; a category (``waiting``, ``suspect``, ...) or a state; ``host:NAME`` or
    any other word: hosts containing it. Empty: no filter (``None``).
    """
    terms = [t for t in re.split(r"[,\s]+", expr.strip()) if t]
    if not terms:
        return None
    ranks: list[tuple[int, int]] = []
    cats: set[str] = set()
    hosts: list[str] = []
    for t in terms:
        m = _RANGE.match(t)
        if m:
            lo = int(m[1])
            ranks.append((lo, int(m[2]) if m[2] else lo))
        elif t.lower() in CATEGORIES:
            cats.add(t.lower())
        elif t.lower() in _STATE_CATEGORY:
            cats.add(_STATE_CATEGORY[t.lower()])
        else:
            hosts.append(t[5:] if t.lower().startswith("host:") else t)

    def match(rank: int, host: str, cat: str) -> bool:
        return (any(lo <= rank <= hi for lo, hi in ranks) or cat in cats
                or any(h and h in host for h in hosts))

    return match


# --------------------------------------------------------------------------- header and timing

TIMING_ROWS = 8  # rows of the timing panel, the job's median row included


def overall(s: Snapshot | None, error: str | None = None) -> tuple[str, str]:
    """The header's status word and its style: the poll's error, the first open incident, the job's
    end, or healthy."""
    if error:
        return f"ERROR {error}", "bold white on dark_orange3"
    if s is None:
        return "STARTING", "bold"
    if s.incidents:
        first = s.incidents[0]
        what = f"INCIDENT {first.kind}"
        if first.ranks:
            what += f" rank{'s' if len(first.ranks) != 1 else ''} {compress(first.ranks)}"
        else:
            what += f" ({first.status})"
        if len(s.incidents) > 1:
            what += f" +{len(s.incidents) - 1} more"
        return what, "bold white on red"
    if s.ended:
        return "JOB ENDED", "bold white on grey35"
    return "HEALTHY", "bold black on green"


def timing_rows(step_times: Mapping[int, Sequence[float]], suspect: frozenset[int], visible: Iterable[int],
                selected: int | None, limit: int = TIMING_ROWS) -> list[int]:
    """The timing panel's ranks: the suspects, the selected rank, then the slowest of the visible
    ranks by their last step, up to ``limit - 1`` (the last row is the job's median)."""
    rows: list[int] = sorted(suspect)
    if selected is not None and selected not in rows:
        rows.append(selected)
    vis = set(visible)
    slow = sorted((r for r, v in step_times.items() if v and r in vis), key=lambda r: -step_times[r][-1])
    for r in slow:
        if len(rows) >= limit - 1:
            break
        if r not in rows:
            rows.append(r)
    return rows


def median_series(series: Iterable[Sequence[float | None]], width: int = 16) -> tuple[float, ...]:
    """The newest ``width`` positions, each the median over ranks (sequences aligned at their end)."""
    tails = [tuple(s[-width:]) for s in series if s]
    if not tails:
        return ()
    n = max(len(t) for t in tails)
    if any(len(t) != n for t in tails):
        tails = [(None,) * (n - len(t)) + t for t in tails]
    return tuple(statistics.median(v for v in col if v is not None) for col in zip(*tails))


# --------------------------------------------------------------------------- sparklines

_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 16, *, top: float | None = None) -> str:
    """The last ``width`` values as bars scaled to ``top`` (default: their maximum), left-padded."""
    vals = [v for v in values[-width:] if v is not None]
    if not vals:
        return " " * width
    hi = top if top and top > 0 else max(vals)
    bars = []
    for v in vals:
        frac = 0.0 if hi <= 0 else min(1.0, max(0.0, v / hi))
        bars.append(_BARS[min(len(_BARS) - 1, int(frac * (len(_BARS) - 1) + 0.5))])
    return " " * (width - len(bars)) + "".join(bars)


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1:
        return f"{s * 1000:.0f}ms"
    if s < 100:
        return f"{s:.1f}s"
    return f"{s:.0f}s"


def fmt_elapsed(s: float) -> str:
    s = max(0, int(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h:d}:{m:02d}:{sec:02d}"
