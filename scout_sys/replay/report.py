"""Human output of ``replay``: the verdict (as ``diagnose`` prints it), then per device whether its
digests agree with its peers and its time per round."""

from __future__ import annotations

from collections.abc import Callable

from scout_sys.model import DeviceRound
from scout_sys.replay.runner import ReplayResult
from scout_sys.report import printable, render


def render_replay(r: ReplayResult, *, verbose: bool = True) -> str:
    d = r.diagnosis
    lines = render(d, verbose=verbose).splitlines()
    # The rank table of ``diagnose`` says nothing here; a device table does.
    cut = lines.index("ranks:") if "ranks:" in lines else len(lines)
    tail = [ln for ln in lines[cut:] if ln.startswith(("signals off", "note:"))]
    lines = lines[:cut]
    n = len(r.rounds)
    lines.append(f"devices ({n} round{'s' if n != 1 else ''}; seconds per round):")
    lines.append(f"  {'DEVICE':<14} {'RANKS':<8} {'DIGESTS':<40} SECONDS")
    for i, dev in enumerate(r.rounds[-1]):
        secs = []
        for rnd, tv in zip(r.rounds, r.times):
            s = tv.seconds.get(rnd[i].device)
            secs.append("-" if s is None else f"{s:.3f}" + ("*" if rnd[i].device in tv.slow else ""))
        if dev.error:
            agree = f"error: {dev.error}"
        else:
            bad = sorted({k for dv in r.digests for k in dv.divergent.get(dev.device, ())})
            own = _kernel_of(dev)
            unsure = sorted({k for dv in r.digests for k in map(own, dv.inconclusive) if k in dev.kernels})
            agree = ("differs on " + ", ".join(bad)) if bad else \
                ("no majority on " + ", ".join(unsure)) if unsure else f"agree ({len(dev.kernels)} kernels)"
        ranks = ",".join(map(str, dev.ranks))
        lines.append(f"  {dev.device:<14} {ranks:<8} {agree:<40} {' '.join(secs)}")
    if any(tv.slow for tv in r.times):
        lines.append("  * slower than its peers in that round")
    return "\n".join(printable(x) for x in lines + tail)


def _kernel_of(dev: DeviceRound) -> Callable[[str], str]:
    """An inconclusive kernel's name as ``dev`` ran it: with devices of several kinds the vote names
    it "gemm (KIND)" (consensus/replay.py), which is ``dev``'s own only when KIND is its kind."""
    own = f" ({dev.peer_kind})"
    return lambda k: k[:-len(own)] if k.endswith(own) else k
