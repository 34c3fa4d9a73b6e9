"""Signal sources. One module per source, one small contract for all.

A probe observes and never decides. Its contract (:class:`Probe`), which the Monitor types against:

- ``name``: how people and the diagnosis call it (``procfs``, ``ebpf-collectives``, ``nvml``);
- ``check() -> str | None``: ``None`` when it can run here, else a one-line reason (and the fix).
  Side-effect free: it attaches and loads nothing;
- ``start(job)``: attach to the job (may raise ``ProbeUnavailable``);
- ``sample(now) -> list[Observation]``: what it saw since the last call, timestamped, per rank;
- ``health() -> Health``: notes for the diagnosis (a feature it runs without) and events it lost;
- ``close()``: detach everything it attached. Safe to call twice.

A probe that cannot run is reported (``Diagnosis.probes``) and the others go on. Stacks are not a
probe sampled every window but a capability used on demand (:class:`~scout_sys.probes.pystack.StackDumper`):
one py-spy dump costs about 10 ms of a CPU per rank, so the watch decides which ranks, and when.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from scout_sys.model import Job, Observation

# Reasons a probe is off that are no fault to fix: this host or job gives it nothing to observe (no NVIDIA
# driver, no rank on a GPU, no NCCL: a Gloo job). The probes raise with these texts; the exporter leaves
# such probes out of ``scout_sys_probe_up`` so that "a probe is down" alerts mean something to fix.
NO_NVIDIA_DRIVER = "not present ("
NO_CUDA_RANK = "no rank of this job uses a CUDA device"
NO_NCCL = "no NCCL library"
_DOES_NOT_APPLY = {"nvml": (NO_NVIDIA_DRIVER, NO_CUDA_RANK), "ebpf-comms": (NO_NCCL,)}


def does_not_apply(probe: str, reason: str | None) -> bool:
    """Whether ``probe`` is off only because there is nothing here for it to observe."""
    return reason is not None and reason.startswith(_DOES_NOT_APPLY.get(probe, ()))


@dataclass(frozen=True)
class Health:
    notes: tuple[str, ...] = ()
    lost: int = 0  # events or updates dropped (bounded maps full, buffers overrun)


@runtime_checkable
class Probe(Protocol):
    name: str

    def check(self) -> str | None: ...

    def start(self, job: Job) -> None: ...

    def sample(self, now: float) -> list[Observation]: ...

    def health(self) -> Health: ...

    def close(self) -> None: ...
