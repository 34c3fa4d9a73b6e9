"""How a watch follows a job: the settings of ``watch``, built once from the command line.

One frozen value instead of a dozen keyword arguments passed down (and a dozen attributes kept):
``cli/watch.py`` builds it (:meth:`WatchConfig.from_args`, which also checks the values), the
:class:`~scout_sys.watch.Watcher` reads it, and the cluster's watch and agent read the settings they
share with it (stall-after, interval and state folder; eBPF and topology).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from scout_sys.errors import ScoutError

__all__ = ["WatchConfig"]


@dataclass(frozen=True)
class WatchConfig:
    """``interval``: seconds between two polls; ``stall_after``: seconds without progress before a
    hang is suspected (None: learned from the job's own gaps); ``state_dir``: where bundles go (None:
    the default folder, watch/bundle.py); ``ebpf``: attach the eBPF probes; ``topology``: the peer
    layout (topology.py); ``wait_ranks``: how long to wait for the job's ranks to appear;
    ``stack_period``: every rank's stack is read at least this often; ``replay``: a replay round when a
    straggler is confirmed or a checkpoint is written (scout_sys/replay), to tell a slow device from a
    slow network or input; ``replay_every``: also one every so many seconds."""

    interval: float = 0.5
    stall_after: float | None = None
    state_dir: str | None = None
    ebpf: bool = True
    topology: str | None = None
    wait_ranks: float | None = None
    stack_period: float = 4.0
    replay: bool = True
    replay_every: float | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> WatchConfig:
        """The settings ``watch`` was given (options it does not have keep their defaults). Raises
        ScoutError (one line, exit 2) for a value that is not positive."""
        if args.interval <= 0 or any(v is not None and v <= 0 for v in (
                args.stall_after, getattr(args, "wait_ranks", None), getattr(args, "replay_every", None))):
            raise ScoutError("--interval, --stall-after, --wait-ranks and --replay-every must be positive")
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})
