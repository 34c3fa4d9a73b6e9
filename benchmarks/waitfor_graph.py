"""The wait-for graph and its analysis at 65,536 synthetic ranks (target: under a second).

dp x tp x pp = 2048 x 8 x 4 in Megatron order (tp fastest, then dp, then pp): every rank is in one
tp, one dp and one pp group. One rank is stuck outside every collective; its tp partners wait in
the tp all-reduce, every other rank of its pp stage in the dp all-reduce, the other stages in the
pipeline's send/recv with their neighbour stage."""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scout_sys.consensus.waitfor import Wait, analyze  # noqa: E402

TP, PP = 8, 4


def synthetic(world: int) -> tuple[dict[int, Wait], list[tuple[int, ...]], int]:
    dp = world // (TP * PP)
    groups: list[tuple[int, ...]] = []
    tp_of, dp_of, pp_of = {}, {}, {}
    for p in range(PP):
        for d in range(dp):
            base = p * dp * TP + d * TP
            tp_of.update((r, len(groups)) for r in range(base, base + TP))
            groups.append(tuple(range(base, base + TP)))
        for t in range(TP):
            members = tuple(p * dp * TP + d * TP + t for d in range(dp))
            dp_of.update((r, len(groups)) for r in members)
            groups.append(members)
    for d in range(dp):
        for t in range(TP):
            members = tuple(p * dp * TP + d * TP + t for p in range(PP))
            pp_of.update((r, len(groups)) for r in members)
            groups.append(members)
    stuck = TP + 3  # stage 0, dp=1, tp=3
    waits: dict[int, Wait] = {}
    for r in range(world):
        stage = r // (dp * TP)
        if r == stuck:
            waits[r] = Wait(r, "idle")
        elif stage == 0 and r // TP == stuck // TP:
            waits[r] = Wait(r, "waiting", tp_of[r], "all_reduce at mappings.py:9")
        elif stage == 0:
            waits[r] = Wait(r, "waiting", dp_of[r], "all_reduce at distributed.py:40")
        else:
            waits[r] = Wait(r, "waiting", pp_of[r], "recv at p2p_communication.py:12")
    return waits, groups, stuck


def main() -> None:
    world = 65536
    t0 = time.perf_counter()
    waits, groups, stuck = synthetic(world)
    t1 = time.perf_counter()
    g = analyze(waits, groups)
    t2 = time.perf_counter()
    assert g.status == "attributed" and g.origins == (stuck,), (g.status, g.origins, g.reason)
    print(f"waitfor_graph: {world} ranks, {len(groups)} groups, {len(g.edges)} edge bundles: "
          f"analysis {1000 * (t2 - t1):.0f} ms (target < 1000 ms; building the synthetic job {1000 * (t1 - t0):.0f} ms)")


if __name__ == "__main__":
    main()
