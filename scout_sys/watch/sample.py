"""One cheap sample a poll, the same for ``watch`` and the cluster agent: /proc for every rank, the
other started probes (eBPF, NVML), and a few live ranks' stacks in turn
(:class:`~scout_sys.watch.progress.Rotation`), fed to :class:`~scout_sys.watch.progress.Progress`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scout_sys.model import Observation, ProcSample, StackSample

if TYPE_CHECKING:
    from scout_sys.monitor import Monitor
    from scout_sys.watch.progress import Progress, Rotation


def dead(p: ProcSample) -> bool:
    """Stopped or gone. A py-spy dump's momentary pause (ProcSample.stopped) is neither: the watch's
    own native dump for an evidence bundle must not open a process_stall on the ranks it reads."""
    return p.stopped or p.status in ("zombie", "gone")


def cheap_sample(mon: Monitor, progress: Progress, rotation: Rotation,
                 now: float) -> tuple[list[ProcSample], list[Observation], list[StackSample]]:
    """(the /proc samples, everything sampled, the stacks read) of one poll; ``progress`` has seen them.
    Stacks are read 5x less often once eBPF sees every live rank's collectives (Rotation ``slow``)."""
    procs = mon.procfs.sample(now)
    extra = mon.sample_extra(now)
    live = [p.rank for p in procs if p.alive and not dead(p)]
    stacks = mon.stacks.dump(set(rotation.take(live, slow=progress.sees_collectives(live))))
    batch: list[Observation] = [*procs, *extra, *stacks]
    progress.observe(batch, now)
    return procs, batch, stacks
