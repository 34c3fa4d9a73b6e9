"""What scout-sys writes is not for everyone: evidence bundles hold kernel and native stacks and process
details of other users' jobs. Every directory it creates is 0700 and every file 0600 — or, after
``share_with_group(NAME)`` (``watch --group NAME``), 0750 / 0640 owned by that group, so that an on-call
group can read them without root.

The policy is process-wide, like a umask, and set once by the command line before anything is written.
Directories that already exist are left as they are (a bundle's own folder is always new, so its
contents are protected even under an old, world-readable state directory).
"""

from __future__ import annotations

import grp
import os

from scout_sys.errors import ScoutError

_gid: int | None = None


def share_with_group(name: str | None) -> None:
    """Make what is written from now on readable by group ``name`` (None: owner only)."""
    global _gid
    if name is None:
        _gid = None
        return
    try:
        _gid = int(name) if name.isdigit() else grp.getgrnam(name).gr_gid
    except KeyError:
        raise ScoutError(f"--group {name}: no such group") from None


def dir_mode() -> int:
    return 0o700 if _gid is None else 0o750


def file_mode() -> int:
    return 0o600 if _gid is None else 0o640


def _own(fd_or_path: int | str) -> None:
    if _gid is not None:
        os.chown(fd_or_path, -1, _gid)


def private_dirs(path: str) -> str:
    """``mkdir -p`` where every directory created gets :func:`dir_mode` (and the group). Returns ``path``."""
    path = os.path.abspath(path)
    missing = []
    p = path
    while not os.path.isdir(p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, dir_mode())
        except FileExistsError:
            continue  # made meanwhile by someone else: theirs to keep as it is
        os.chmod(d, dir_mode())  # mkdir's mode passes through the umask
        _own(d)
    return path


def private_opener(path: str, flags: int) -> int:
    """An ``opener`` for :func:`open`: the file gets :func:`file_mode` (and the group), even if it existed."""
    fd = os.open(path, flags, file_mode())
    try:
        os.fchmod(fd, file_mode())
        _own(fd)
    except OSError:
        os.close(fd)
        raise
    return fd
