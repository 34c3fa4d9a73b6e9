"""Which checkpoint files a job's ranks write, seen cheaply from outside (for ``watch``).

Two sources, at a low rate (``CheckpointSpy.scan`` every few seconds):

- the files a rank holds open (``/proc/PID/fd``): a large checkpoint is open while it is written;
- a shallow look at the ranks' working directory, the folders the ranks were seen writing in, and
  folders named like ``checkpoint*`` / ``ckpt*`` (two levels at most, a bounded number of entries):
  a small ``torch.save`` is open for milliseconds and is found here by its modification time.

A checkpoint file is ``*.pt``, ``*.pth``, ``*.safetensors``, ``*.distcp``, ``.metadata`` or any file
under a folder named like ``checkpoint*`` / ``ckpt*``. The unit reported is what ``certify`` takes:
the file, or for a DCP shard or a file of a per-step folder (``step_100/rank0.pt``), its folder.
Nothing here opens a checkpoint; the monitor never imports torch.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

SUFFIXES = (".pt", ".pth", ".safetensors", ".distcp")
_DIR = re.compile(r"^(checkpoints?|ckpts?)([-_.].*)?$", re.I)
_STEP_DIR = re.compile(r"(?:global_step|step|iter|iteration|ckpt|checkpoint|epoch)[-_]?\d+", re.I)
MAX_ENTRIES = 2000  # per scan, over every folder looked at: a huge folder is looked at in part


def is_checkpoint_file(path: str) -> bool:
    name = os.path.basename(path)
    if name.endswith(SUFFIXES) or name == ".metadata":
        return True
    return any(_DIR.match(p) for p in os.path.dirname(path).split(os.sep)[-3:])


def unit_of(path: str) -> str:
    """What certify takes for a written file: the file, or its folder when the folder is the checkpoint."""
    d, name = os.path.split(path)
    if name.endswith(".distcp") or name == ".metadata" or _STEP_DIR.search(os.path.basename(d)):
        return d
    return path


class CheckpointSpy:
    def __init__(self, pids: Iterable[int], since: float) -> None:
        self.pids = list(pids)
        self.since = since  # files older than this are not news
        self.dirs: set[str] = set()  # folders the ranks were seen writing checkpoints in
        self.seen: dict[str, float] = {}  # unit -> newest mtime seen
        self.cwds: set[str] = set()

    def _open_files(self) -> list[str]:
        out = []
        for pid in self.pids:
            try:
                self.cwds.add(os.readlink(f"/proc/{pid}/cwd"))
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds[:MAX_ENTRIES]:
                try:
                    t = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if t.startswith("/") and is_checkpoint_file(t):
                    out.append(t.removesuffix(" (deleted)"))
        return out

    def _listed(self) -> list[str]:
        out: list[str] = []
        budget = [MAX_ENTRIES]

        def look(d: str, depth: int) -> None:
            try:
                it = os.scandir(d)
            except OSError:
                return
            with it:
                for e in it:
                    if budget[0] <= 0:
                        return
                    budget[0] -= 1
                    try:
                        if e.is_file(follow_symlinks=False):
                            if is_checkpoint_file(e.path):
                                out.append(e.path)
                        elif depth > 0 and e.is_dir(follow_symlinks=False) and not e.name.startswith("."):
                            if _DIR.match(e.name) or _STEP_DIR.search(e.name) or d in self.dirs:
                                look(e.path, depth - 1)
                    except OSError:
                        continue

        for d in sorted(self.cwds | self.dirs):
            look(d, 2)
        return out

    def scan(self, settled: float | None = None) -> list[tuple[str, float]]:
        """Checkpoints written (or rewritten) since the last scan: (unit, its newest mtime), oldest first.
        ``settled``: a unit modified after this time may still be being written: reported next time."""
        found: dict[str, float] = {}
        for p in self._open_files() + self._listed():
            try:
                t = os.stat(p).st_mtime
            except OSError:
                continue
            if t <= self.since:
                continue
            u = unit_of(p)
            self.dirs.add(os.path.dirname(u))
            found[u] = max(found.get(u, 0.0), t)
        new = [(u, t) for u, t in found.items() if t > self.seen.get(u, 0.0)
               and (settled is None or t <= settled)]
        for u, t in new:
            self.seen[u] = t
        return sorted(new, key=lambda ut: ut[1])
