"""An agent's answer to a window request: its one codec, used by the agent that writes it and every reader.

The agent builds an :class:`Answer` and :func:`encode` gives the body it seals (cluster/wire.py); the
client unseals a body and :func:`decode` gives the Answer back, decoded once at the boundary, as the
merge (cluster/merge.py) and the evidence bundles (cluster/source.py) take it. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scout_sys.cluster import wire
from scout_sys.model import Activity, Job, Observation
from scout_sys.model_job import WIRE, job_from_json, job_to_json

__all__ = ["Answer", "decode", "encode"]


@dataclass(frozen=True)
class Answer:
    """One agent's window (``error`` set when it could not look at its ranks)."""

    node: int
    host: str
    job: Job | None
    acts: Mapping[int, Activity] = field(default_factory=dict, hash=False, compare=False)
    records: tuple[Observation, ...] = ()
    probes: Mapping[str, str | None] = field(default_factory=dict, hash=False, compare=False)
    notes: tuple[str, ...] = ()
    window: tuple[float, float] = (0.0, 0.0)
    error: str | None = None


def encode(a: Answer) -> dict[str, Any]:
    """The body the agent seals: ``{"node", "host", "error"}`` when it could not look at its ranks, else
    its window, job (profile ``WIRE``), activities (:func:`~scout_sys.cluster.wire.activities_to_json`),
    records and probes. (``notes`` stay on the agent's host.)"""
    base: dict[str, Any] = {"node": a.node, "host": a.host}
    if a.error is not None or a.job is None:
        return {**base, "error": a.error or "no ranks found yet"}
    return {**base, "window": list(a.window), "job": job_to_json(a.job, WIRE),
            "acts": wire.activities_to_json(a.acts.values()),
            "records": [wire.record_to_json(o) for o in a.records], "probes": dict(a.probes)}


def decode(body: Mapping[str, Any], node: int) -> Answer:
    """A verified answer body for ``node`` as an Answer. Raises :class:`~scout_sys.cluster.wire.Forged`
    when it claims another node (an answer moved to another node's slot)."""
    if int(body.get("node", -1)) != node:
        raise wire.Forged(f"answer for node {node} claims node {body.get('node')}")
    host = str(body.get("host", "?"))
    if body.get("error"):
        return Answer(node=node, host=host, job=None, error=str(body["error"]))
    acts = wire.activities_from_json(body.get("acts", {}))
    records = tuple(r for r in (wire.record_from_json(d) for d in body.get("records", ())) if r is not None)
    w = body.get("window") or [0.0, 0.0]
    return Answer(node=node, host=host, job=job_from_json(body["job"], WIRE), acts=acts, records=records,
                  probes=dict(body.get("probes", {})), window=(float(w[0]), float(w[1])))
