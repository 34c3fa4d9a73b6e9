"""Optional dependencies, named by the extra that installs them.

The base package is the monitor (diagnose, watch, doctor, the dashboard, the exporters): it never
imports torch. What needs more says so in one line that names the install command, before it starts:

    [cluster]  torch: the c10d store client (``agent``, ``diagnose --cluster``, ``watch --cluster``)
    [replay]   torch, safetensors: reading checkpoints in this process (``certify``); ``demo``'s trainer
    [all]      both

``replay`` itself needs none of them here: its workers run with each rank's own interpreter.
"""

from __future__ import annotations

import importlib.util
import sys

from scout_sys.errors import ScoutError

EXTRAS: dict[str, tuple[str, ...]] = {"cluster": ("torch",), "replay": ("torch", "safetensors"),
                                     "all": ("torch", "safetensors")}
TORCH_PYTHON = (3, 10)  # the oldest Python torch 2.13 (the extras' pin) has wheels for; the monitor runs on 3.9


class MissingExtra(ScoutError):
    """An optional dependency is not installed. ``str(e)`` is the whole line to print."""


def install_hint(extra: str) -> str:
    hint = f"pip install 'scout-sys[{extra}]'"
    if sys.version_info < TORCH_PYTHON:  # pip would find no torch 2.13 here: say which Python to install with
        return f"{hint} under Python 3.10 or newer (this is Python {sys.version_info[0]}.{sys.version_info[1]})"
    return hint


def missing(module: str) -> bool:
    """Whether ``module`` cannot be imported here (looked up, not imported: torch takes seconds)."""
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def require(what: str, extra: str, modules: tuple[str, ...] | None = None) -> None:
    """Raise MissingExtra naming ``pip install 'scout-sys[extra]'`` when a module of it is missing.
    ``what``: who needs it, e.g. ``scout-sys agent``."""
    for m in modules or EXTRAS[extra]:
        if missing(m):
            raise MissingExtra(f"{what} needs {m}: {install_hint(extra)}")
