"""Rules over replay results: silent data corruption (digests) and slow devices (times).

Every device of the job ran the same seeded kernels (``scout_sys/replay``). Peers are devices of
the same kind (same CPU or GPU model, same torch build): they must agree bit for bit.

- **sdc**: per kernel, EXACT C3 on the digests. A device outside a strict majority on any kernel is
  attributed; a kernel with no strict majority (two devices that differ, a 2-2 split) makes the
  round inconclusive, naming the kernels. A device whose own repetitions disagree is a signature
  of its own (``unstable``): a healthy device repeats itself bit for bit.
- **straggler**: statistical C3 on each device's total kernel time. A device is slow in a round
  when its time exceeds the peers' median by ``K_MAD`` robust deviations, by ``MIN_RATIO`` and by
  ``FLOOR`` seconds; C3 needs a strict majority of devices that are not slow. Confirmed when the
  same device is slow in ``CONFIRM`` rounds in a row.
- **a live straggler's device** (:func:`explain_straggler`): the watch's straggler from the job's own
  signals (procfs / eBPF), told by the same times whether its device is slow (drain the node) or as
  fast as its peers' (the host, its input or its code). Not a registry rule (consensus/rules.py):
  it reads replay rounds, which are not observations, and it annotates another rule's incident.

Pure: no I/O, no clocks.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from scout_sys.consensus import c3
from scout_sys.model import ATTRIBUTED, INCONCLUSIVE, SDC, STRAGGLER, DeviceRound, Evidence, Incident, Job

K_MAD = 4.0
MIN_RATIO = 1.2  # slower than the peers' median by at least this factor...
FLOOR = 0.005  # ...and by at least this many seconds
CONFIRM = 2


def peer_sets(results: Sequence[DeviceRound]) -> dict[str, list[DeviceRound]]:
    """Devices that must agree: same kind and model, same torch build. Failed devices are left out."""
    out: dict[str, list[DeviceRound]] = {}
    for d in results:
        if d.error is None:
            out.setdefault(d.peer_kind, []).append(d)
    return out


def _sig(d: DeviceRound, kernel: str) -> object:
    k = d.kernels.get(kernel)
    if k is None:
        return None
    return k.digest if k.stable else ("unstable", k.digest)


@dataclass(frozen=True)
class DigestVerdict:
    """One round's digest vote: who disagrees on what."""

    divergent: dict[str, tuple[str, ...]] = field(default_factory=dict)  # device -> kernels outside the majority
    inconclusive: tuple[str, ...] = ()  # kernels with no strict majority
    majority: dict[str, str] = field(default_factory=dict)  # kernel -> majority digest
    compared: int = 0  # devices compared (largest peer set)
    notes: tuple[str, ...] = ()

    @property
    def clean(self) -> bool:
        return not self.divergent and not self.inconclusive and self.compared >= 2


def vote_digests(results: Sequence[DeviceRound]) -> DigestVerdict:
    divergent: dict[str, list[str]] = {}
    inconclusive: list[str] = []
    majority: dict[str, str] = {}
    notes: list[str] = []
    compared = 0
    for kind, devs in sorted(peer_sets(results).items()):
        compared = max(compared, len(devs))
        if len(devs) < 2:
            notes.append(f"only one device of kind {kind}: nothing to compare it with")
            continue
        kernels = sorted({k for d in devs for k in d.kernels})
        for kernel in kernels:
            v = c3.vote({i: _sig(d, kernel) for i, d in enumerate(devs)})
            if v.status == c3.AGREE:
                majority[kernel] = str(v.signature)
            elif v.attributed:
                majority[kernel] = str(v.signature)
                for i in v.minority:
                    divergent.setdefault(devs[i].device, []).append(kernel)
            else:
                inconclusive.append(kernel if len(peer_sets(results)) == 1 else f"{kernel} ({kind})")
    return DigestVerdict({d: tuple(ks) for d, ks in divergent.items()}, tuple(inconclusive), majority,
                         compared, tuple(notes))


@dataclass(frozen=True)
class SlowVerdict:
    """One round's times: the slow devices (possibly none), or a disagreement with no majority."""

    seconds: dict[str, float] = field(default_factory=dict)  # device -> total kernel time
    slow: tuple[str, ...] = ()
    inconclusive: tuple[str, ...] = ()  # devices flagged slow without a strict majority of fast peers
    median: float = 0.0
    threshold: float = 0.0


def vote_times(results: Sequence[DeviceRound]) -> SlowVerdict:
    """Within the largest peer set (times of different device models are not comparable)."""
    sets = peer_sets(results)
    if not sets:
        return SlowVerdict()
    devs = max(sets.values(), key=len)
    secs = {d.device: sum(k.seconds for k in d.kernels.values()) for d in devs}
    if len(secs) < 2:
        return SlowVerdict(secs)
    med = statistics.median(secs.values())
    if len(secs) < 3:  # no spread to speak of: measure against the faster one (the vote stays 1-1)
        med = min(secs.values())
        threshold = max(med * MIN_RATIO, med + FLOOR)
    else:
        mad = statistics.median(abs(v - med) for v in secs.values())
        threshold = max(med + K_MAD * 1.4826 * mad, med * MIN_RATIO, med + FLOOR)
    flags = {i: secs[d.device] > threshold for i, d in enumerate(devs)}
    v = c3.vote(flags)
    if v.attributed and v.signature is False:
        return SlowVerdict(secs, tuple(devs[i].device for i in v.minority), (), med, threshold)
    if v.status == c3.INCONCLUSIVE:
        return SlowVerdict(secs, (), tuple(devs[i].device for i, f in flags.items() if f), med, threshold)
    return SlowVerdict(secs, (), (), med, threshold)


# --------------------------------------------------------------------------- incidents


def _ranks(results: Sequence[DeviceRound], devices: Sequence[str]) -> tuple[int, ...]:
    want = set(devices)
    return tuple(sorted({r for d in results if d.device in want for r in d.ranks}))


def _who(devices: Sequence[str], results: Sequence[DeviceRound]) -> str:
    by = {d.device: d for d in results}
    parts = []
    for dev in devices:
        rs = by[dev].ranks if dev in by else ()
        parts.append(f"{dev} (rank{'s' if len(rs) != 1 else ''} {','.join(map(str, rs))})")
    return ", ".join(parts)


def sdc_incidents(job: Job, results: Sequence[DeviceRound], verdict: DigestVerdict, since: float
                  ) -> list[Incident]:
    out = []
    by = {d.device: d for d in results}
    if verdict.divergent:
        devs = sorted(verdict.divergent)
        ev = []
        for dev in devs:
            d = by[dev]
            kernels = verdict.divergent[dev]
            ev.append(Evidence("replay", f"{dev} differs from the majority of its peers on {', '.join(kernels)}",
                               rank=d.ranks[0] if len(d.ranks) == 1 else None,
                               data={"device": dev, "ranks": list(d.ranks), "kernels": {
                                   k: {"digest": _sig_text(d, k), "majority": verdict.majority.get(k)}
                                   for k in kernels}, **({"context": d.info} if d.info else {})}))
        ranks = _ranks(results, devs)
        n = verdict.compared
        out.append(Incident(SDC, ATTRIBUTED, ranks, tuple(sorted({job.host_of(r) for r in ranks})), since,
                            f"silent data corruption: {_who(devs, results)} computed different bits than the "
                            f"strict majority of {n} devices on {len({k for ks in verdict.divergent.values() for k in ks})}"
                            f" kernel(s)", tuple(ev)))
    if verdict.inconclusive:
        ks = ", ".join(verdict.inconclusive)
        per = {d.device: {k: _sig_text(d, k) for k in verdict.inconclusive if k in d.kernels} for d in results
               if d.error is None}
        out.append(Incident(SDC, INCONCLUSIVE, (), (job.host,), since,
                            f"devices disagree on {ks} with no strict majority: cannot tell which device is wrong",
                            (Evidence("replay", f"digests of {ks} per device", data={"digests": per}),)))
    return out


def _sig_text(d: DeviceRound, kernel: str) -> str | None:
    k = d.kernels.get(kernel)
    if k is None:
        return None
    return k.digest if k.stable else f"{k.digest} (unstable: its repetitions differ)"


def confirm_slow(job: Job, results: Sequence[DeviceRound], history: Sequence[SlowVerdict], since: float,
                 k: int = CONFIRM) -> Incident | None:
    """A straggler incident when the last ``k`` rounds name the same slow device(s); an inconclusive
    one when each of them flagged slow devices without a strict majority."""
    if len(history) < k:
        return None
    last = history[-k:]
    common = set(last[0].slow)
    for h in last[1:]:
        common &= set(h.slow)
    w = last[-1]
    if common:
        devs = sorted(common)
        ranks = _ranks(results, devs)
        ev = [Evidence("replay", f"{dev}: {', '.join(f'{h.seconds.get(dev, 0.0):.3f}' for h in last)} s per round, "
                                 f"peers' median {w.median:.3f} s (threshold {w.threshold:.3f} s)",
                       data={"device": dev, "seconds": [round(h.seconds.get(dev, 0.0), 6) for h in last],
                             "peer_median": round(w.median, 6), "threshold": round(w.threshold, 6)})
              for dev in devs]
        ev.append(Evidence("replay", f"{len(w.seconds)} devices: seconds per device in the last round",
                           data={"per_device": {d: round(s, 6) for d, s in sorted(w.seconds.items())}}))
        worst = max(w.seconds.get(d, 0.0) for d in devs)
        return Incident(STRAGGLER, ATTRIBUTED, ranks, tuple(sorted({job.host_of(r) for r in ranks})), since,
                        f"slow device: {_who(devs, results)} ran the same kernels {worst / max(w.median, 1e-9):.1f}x "
                        f"slower than the median of its peers, in {k} rounds in a row", tuple(ev))
    if all(h.inconclusive for h in last):
        devs = sorted(set().union(*(h.inconclusive for h in last)))
        return Incident(STRAGGLER, INCONCLUSIVE, (), (job.host,), since,
                        f"{_who(devs, results)} ran slower than the others, but there is no strict majority of "
                        "fast devices to compare with",
                        (Evidence("replay", "seconds per device in the last round",
                                  data={"per_device": {d: round(s, 6) for d, s in sorted(w.seconds.items())}}),))
    return None


# --------------------------------------------------------------------------- a live straggler's device

# The data key of the evidence explain_straggler adds: True a slow device, False not the device
# (examples/on-incident.sh drains on True). Replay's own findings never carry it.
DEVICE_SLOW = "device_slow"
_SAID = "; replay: "  # where explain_straggler's words begin in a summary


def from_replay(inc: Incident) -> bool:
    """Is this replay's own finding (its evidence is replay's), not one replay only explained?"""
    return any(e.source == "replay" and DEVICE_SLOW not in e.data for e in inc.evidence)


def explain_straggler(inc: Incident, rounds: Sequence[Sequence[DeviceRound]], k: int = CONFIRM) -> Incident:
    """A straggler found in the job's own signals, with what the recent replay ``rounds`` (oldest
    first) say of the device(s) of its ranks, judged in the rounds whose time vote compared them
    with peers (:func:`vote_times`):

    - slow in the last ``k`` of those rounds (as :func:`confirm_slow` asks): a slow device, and the
      summary says so;
    - not slow in the last one (within the threshold, no vote without majority): not the device;
    - else (never compared, or slow in fewer than ``k`` rounds in a row): nothing about it.

    Its earlier replay words are replaced, so it can be applied each round to the same incident.
    Another kind, an inconclusive straggler or replay's own comes back as it came."""
    if inc.kind != STRAGGLER or inc.status != ATTRIBUTED or not inc.ranks or from_replay(inc):
        return inc
    verdicts = [vote_times(r) for r in rounds]
    by = {d.device: d for r in rounds for d in r}
    slow: list[tuple[str, float]] = []
    ev: list[Evidence] = []
    for dev in sorted(d for d, x in by.items() if set(x.ranks) & set(inc.ranks)):
        judged = [v for v in verdicts if dev in v.seconds and len(v.seconds) >= 2]
        if not judged:
            continue
        w, ranks = judged[-1], by[dev].ranks
        rank = ranks[0] if len(ranks) == 1 else None
        if len(judged) >= k and all(dev in v.slow for v in judged[-k:]):
            ratio = w.seconds[dev] / max(w.median, 1e-9)
            slow.append((dev, ratio))
            ev.append(Evidence("replay", f"replay: its device {dev} ran the same kernels {ratio:.1f}x slower than "
                                         "its peers' — a slow device", rank=rank,
                               data={DEVICE_SLOW: True, "device": dev, "ratio": round(ratio, 2),
                                     "seconds": [round(v.seconds[dev], 6) for v in judged[-k:]],
                                     "peer_median": round(w.median, 6), "threshold": round(w.threshold, 6)}))
        elif dev not in w.slow and dev not in w.inconclusive and w.seconds[dev] <= w.threshold:
            ev.append(Evidence("replay", f"replay: its device {dev} runs the same kernels as fast as its peers' "
                                         f"({w.seconds[dev]:.3f} s vs median {w.median:.3f} s): not the device — "
                                         "the host, its input or its code", rank=rank,
                               data={DEVICE_SLOW: False, "device": dev, "seconds": [round(w.seconds[dev], 6)],
                                     "median": round(w.median, 6), "threshold": round(w.threshold, 6)}))
    base = tuple(e for e in inc.evidence if DEVICE_SLOW not in e.data)
    summary = inc.summary.split(_SAID)[0]
    if slow:
        dev, ratio = max(slow, key=lambda x: x[1])
        summary += f"{_SAID}a slow device ({dev} ran the same kernels {ratio:.1f}x slower than its peers')"
    elif ev:
        summary += f"{_SAID}not the device (it runs the same kernels as fast as its peers')"
    return replace(inc, summary=summary, evidence=base + tuple(ev))
