"""Which checkpoint files a job's ranks write, seen cheaply from outside (for ``watch``).

Two sources, at a low rate (``CheckpointSpy.scan`` every few seconds):

- the files a rank holds open (``/proc/PID/fd``): a large checkpoint is open while it is written;
- a shallow look at the ranks' working directory, the folders their command line names for
  checkpoints (``--save DIR``, ``--checkpoint-dir=DIR``, ``--job.dump_folder DIR``: see
  :func:`arg_dirs`), the folders the ranks were seen writing in, and folders named like
  ``checkpoint*`` / ``ckpt*`` (two levels at most, a bounded number of entries): a small
  ``torch.save`` is open for milliseconds and is found here by its modification time, wherever the
  watch happened to be busy when it was written (a confirm window reads stacks for seconds).

A checkpoint file is ``*.pt``, ``*.pth``, ``*.safetensors``, ``*.distcp``, ``.metadata`` or any file
under a folder named like ``checkpoint*`` / ``ckpt*``. The unit reported is what ``certify`` takes:
the file, or for a DCP shard or a file of a per-step folder (``step_100/rank0.pt``), its folder.
Nothing here opens a checkpoint; the monitor never imports torch.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence

SUFFIXES = (".pt", ".pth", ".safetensors", ".distcp")
_DIR = re.compile(r"^(checkpoints?|ckpts?)([-_.].*)?$", re.I)
_STEP_DIR = re.compile(r"(?:global_step|step|iter|iteration|ckpt|checkpoint|epoch)[-_]?\d+", re.I)
MAX_ENTRIES = 2000  # per scan and root folder, its subfolders included: a huge folder is looked at in part
MAX_ROOTS = 8  # root folders looked at per scan
MAX_UNSETTLED = 64  # files still being written, looked at again by name
# the options whose folder holds checkpoints: Megatron --save/--load, TorchTitan --job.dump_folder /
# --checkpoint.folder, HF --output_dir, --resume-from, and the --checkpoint-dir / --ckpt_path kind
_ARG = re.compile(r"ckpt|checkpoint|save|output|out[-_]?dir|dump|resume|load", re.I)


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


def arg_dirs(argv: Sequence[str], cwd: str) -> list[str]:
    """The existing folders a rank's command line names for checkpoints: the value of an option
    like ``--save`` / ``--checkpoint-dir`` (``--opt DIR`` or ``--opt=DIR``, relative to ``cwd``), or
    any argument that is a folder named like ``checkpoint*`` / ``ckpt*``."""
    out: list[str] = []
    prev = ""
    for a in argv:
        key, value = prev, a
        if a.startswith("-") and "=" in a:
            key, value = a.split("=", 1)
        elif a.startswith("-"):
            prev = a
            continue
        prev = ""
        if not value or not (key.startswith("-") and _ARG.search(key) or _DIR.match(os.path.basename(value.rstrip("/")))):
            continue
        d = os.path.normpath(os.path.join(cwd, value))
        if d != "/" and os.path.isdir(d) and d not in out:
            out.append(d)
    return out


class CheckpointSpy:
    def __init__(self, pids: Iterable[int], since: float) -> None:
        self.pids = list(pids)
        self.since = since  # files older than this are not news
        self.dirs: set[str] = set()  # folders the ranks were seen writing checkpoints in
        self.seen: dict[str, float] = {}  # unit -> newest mtime seen
        self.cwds: set[str] = set()
        self.unsettled: list[str] = []  # files of units still being written at the last scan
        self.named: dict[int, list[str]] = {}  # pid -> the folders its command line names (arg_dirs)

    def _open_files(self) -> list[str]:
        out = []
        for pid in self.pids:
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
                self.cwds.add(cwd)
                if pid not in self.named:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
                    self.named[pid] = arg_dirs(argv, cwd)
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

        def look(d: str, depth: int, free: bool, budget: list[int]) -> None:
            # free: below a folder the command line names, every subfolder is looked into.
            # A folder's files before its subfolders: a checkpoint beside a crowd of folders is found.
            try:
                with os.scandir(d) as it:
                    entries = []
                    for e in it:
                        if budget[0] <= 0:
                            break
                        budget[0] -= 1
                        entries.append(e)
            except OSError:
                return
            below = []
            for e in entries:
                try:
                    if e.is_file(follow_symlinks=False):
                        if is_checkpoint_file(e.path):
                            out.append(e.path)
                    elif depth > 0 and e.is_dir(follow_symlinks=False) and not e.name.startswith("."):
                        if free or _DIR.match(e.name) or _STEP_DIR.search(e.name) or d in self.dirs:
                            below.append(e.path)
                except OSError:
                    continue
            for sub in below:
                look(sub, depth - 1, free, budget)

        # each root its own budget, the likeliest first: a crowded working directory or /tmp (a
        # scratch checkpoint seen there) must not use up the look at the folder the job names
        named = [d for ds in self.named.values() for d in ds]
        roots = list(dict.fromkeys([*named, *sorted(self.dirs), *sorted(self.cwds)]))[:MAX_ROOTS]
        for d in roots:
            look(d, 2, d in named, [MAX_ENTRIES])
        return out

    def scan(self, settled: float | None = None) -> list[tuple[str, float]]:
        """Checkpoints written (or rewritten) since the last scan: (unit, its newest mtime), oldest first.
        ``settled``: a unit modified after this time may still be being written: reported next time."""
        found: dict[str, float] = {}
        files: dict[str, str] = {}  # unit -> a file of it
        # the files found still being written last time are looked at again by name: a file seen
        # open, closed by the next scan, is found whatever a listing's budget reaches
        for p in [*self._open_files(), *self.unsettled, *self._listed()]:
            try:
                t = os.stat(p).st_mtime
            except OSError:
                continue
            if t <= self.since:
                continue
            u = unit_of(p)
            self.dirs.add(os.path.dirname(u))
            found[u] = max(found.get(u, 0.0), t)
            files.setdefault(u, p)
        fresh = {u: t for u, t in found.items() if t > self.seen.get(u, 0.0)}
        new = [(u, t) for u, t in fresh.items() if settled is None or t <= settled]
        self.unsettled = [files[u] for u in fresh if u not in dict(new)][:MAX_UNSETTLED]
        for u, t in new:
            self.seen[u] = t
        return sorted(new, key=lambda ut: ut[1])
