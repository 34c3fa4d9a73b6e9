"""Shared phrasing: how ranks, signals, frames and coordinates are written, in one place.

Every room that talks to a person (consensus summaries, evidence, the CLI, the dashboard) formats
these through here, so a 1,024-rank list reads the same everywhere and stays short.
Pure: no I/O.
"""

from __future__ import annotations

import re
import signal as _signal
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

MAX_SEGMENTS = 8  # rank-list segments ("3", "5-7") written out before the rest is elided


def compress(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 5, 7, 8]`` → ``"0-3,5,7-8"``."""
    return ",".join(_segments(ranks))


def _segments(ranks: Iterable[int]) -> list[str]:
    out: list[str] = []
    rs = sorted(set(ranks))
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return out


def ranks_text(ranks: Iterable[int], *, limit: int = MAX_SEGMENTS) -> str:
    """``rank 3``, ``ranks 0, 2, 5``, ``ranks 4-7``, ``1024 ranks (0-511, 513-1024)``,
    ``600 ranks (0, 2, 4, 6, 8, 10, ...)``: never longer than ``limit`` segments."""
    rs = sorted(set(ranks))
    if len(rs) == 1:
        return f"rank {rs[0]}"
    segs = _segments(rs)
    if len(segs) <= limit:
        body = ", ".join(segs)
        return f"ranks {body}" if len(rs) <= limit else f"{len(rs)} ranks ({body})"
    return f"{len(rs)} ranks ({', '.join(segs[:limit - 2])}, ...)"


def agent_event(e: Any) -> str:
    """A ``watch --cluster`` agent event (cluster/watch.py ``AgentEvent``) for people:
    ``agent node 1 (node7) lost, ranks 2-3: no heartbeat for 5 s: its ranks are not observed``.
    Other news of the monitor that carries its own text (``checkpoint_written``) says it itself."""
    if hasattr(e, "text"):
        return str(e.text())
    what = "lost" if e.event == "agent_lost" else "back" if e.event == "agent_back" else e.event
    text = f"agent node {e.node} ({e.host}) {what}" + (f", {ranks_text(e.ranks)}" if e.ranks else "")
    return text + (f": {e.detail}" if e.detail else "")


def plural(n: int, word: str, words: str | None = None) -> str:
    """``1 rank``, ``3 ranks``."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


def signal_name(sig: int) -> str:
    """``SIGKILL``, or ``signal 42`` for numbers this platform has no name for."""
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def short_path(path: str) -> str:
    """A path as a person wants to read it: from the package down (like py-spy's short names)."""
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def frame_text(f: Any) -> str:
    """One frame (anything with ``file``, ``line``, ``function``): ``train.py:78 load_batch``."""
    return f"{short_path(f.file)}:{f.line} {f.function}"


_STDLIB = re.compile(r"/lib/python3\.\d+/(?!site-packages/|dist-packages/)|^<frozen ")
_LIBRARY = re.compile(r"/(site|dist)-packages/")


def own_frame(frames: Sequence[Any]) -> Any | None:
    """The job's own innermost frame: not the standard library, not an installed package (a
    framework's wrapper or a deprecation shim such as typing_extensions), else the innermost
    non-standard-library frame, else the innermost one."""
    if not frames:
        return None
    for keep in (lambda f: not _STDLIB.search(f.file) and not _LIBRARY.search(f.file),
                 lambda f: not _STDLIB.search(f.file)):
        own = next((f for f in frames if keep(f)), None)
        if own is not None:
            return own
    return frames[0]


def where_text(frames: Sequence[Any]) -> str:
    """Where a stack (innermost first) is, as the job's author reads it: their own frame, followed by
    the innermost frame when that one differs, e.g. ``train.py:78 load (in threading.py:331 Condition.wait)``."""
    own = own_frame(frames)
    if own is None:
        return ""
    text = frame_text(own)
    if own is not frames[0]:
        text += f" (in {frame_text(frames[0])})"
    return text


def coords_text(coords: Mapping[str, int] | Iterable[tuple[str, int]]) -> str:
    """Parallel coordinates: ``dp=1,pp=0``."""
    items = coords.items() if isinstance(coords, Mapping) else coords
    return ",".join(f"{d}={c}" for d, c in items)
