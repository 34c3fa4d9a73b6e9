"""Hardware rules from GPU telemetry (NVML): uncorrected ECC errors are decisive on their own; a
GPU that slows itself down (thermal, power brake, HW slowdown) while a strict majority of its
peers' GPUs do not is named. Pure: no I/O, no clocks."""

from __future__ import annotations

from collections.abc import Sequence

from scout_sys.consensus import c3
from scout_sys.model import ATTRIBUTED, HARDWARE, DeviceSample, Evidence, Incident, Job, Observation


def latest(obs: Sequence[Observation]) -> dict[int, DeviceSample]:
    out: dict[int, DeviceSample] = {}
    for o in obs:
        if isinstance(o, DeviceSample) and (o.rank not in out or o.time >= out[o.rank].time):
            out[o.rank] = o
    return out


def _incident(job: Job, d: DeviceSample, summary: str, extra: Sequence[Evidence] = ()) -> Incident:
    return Incident(kind=HARDWARE, status=ATTRIBUTED, ranks=(d.rank,), hosts=(job.host_of(d.rank),),
                    since=d.time, summary=summary,
                    evidence=(Evidence("nvml", f"rank {d.rank} GPU {d.index}", rank=d.rank, data=d.to_json()),
                              *extra))


def analyze(job: Job, obs: Sequence[Observation]) -> list[Incident]:
    devs = latest(obs)
    out = [_incident(job, d, f"rank {d.rank}'s GPU {d.index} reports {d.ecc_uncorrected} uncorrected ECC errors")
           for d in devs.values() if d.ecc_uncorrected]
    for group in job.groups():
        g = {r: devs[r] for r in group if r in devs}
        if len(g) < 3:
            continue
        v = c3.vote({r: bool(d.slowdown) for r, d in g.items()})
        if v.attributed and v.signature is False:
            for r in v.minority:
                d = g[r]
                out.append(_incident(job, d, f"rank {r}'s GPU {d.index} is slowing itself down ({d.slowdown}) "
                                             f"while {len(v.majority)} peer GPUs are not"))
    return out
