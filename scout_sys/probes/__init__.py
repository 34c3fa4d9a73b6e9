"""Signal sources. One module per source, one small contract for all.

A probe observes and never decides. Its contract (see :class:`Probe`):

- ``available() -> str | None``: ``None`` when it can run here, else a one-line reason (and fix);
- ``start(job)``: attach to the job (may raise ``ProbeUnavailable``);
- ``sample() -> list[Observation]``: what it saw since the last call, timestamped, per rank;
- ``close()``: detach everything it attached. Must be safe to call twice.

A probe that cannot run is reported (``Diagnosis.probes``) and the others go on.
"""

from __future__ import annotations

from typing import Protocol

from scout_sys.model import Job, Observation


class Probe(Protocol):
    name: str

    def available(self) -> str | None: ...

    def start(self, job: Job) -> None: ...

    def sample(self) -> list[Observation]: ...

    def close(self) -> None: ...
