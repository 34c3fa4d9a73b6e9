"""Replay rules (consensus/replay.py) on synthetic device results: pure, no processes."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from scout_sys.consensus import replay as rules
from scout_sys.model import ATTRIBUTED, STRAGGLER, DeviceRound, Evidence, Incident, Job, KernelResult, Rank
from scout_sys.replay import ledger
from scout_sys.replay.context import Device, devices_of

KERNELS = ("gemm", "softmax", "block")


def job(n: int) -> Job:
    return Job(ranks=tuple(Rank(rank=r, pid=1000 + r, host="h") for r in range(n)), world_size=n,
               launcher="torchrun", launcher_pid=1, host="h")


def dev(i: int, digests: dict[str, str] | None = None, secs: float = 1.0, kind: str = "cpu:x torch 2",
        stable: bool = True, error: str | None = None) -> DeviceRound:
    ds = {k: "d-" + k for k in KERNELS}
    ds.update(digests or {})
    ks = {} if error else {k: KernelResult(v, secs / len(ds), stable) for k, v in ds.items()}
    return DeviceRound(f"cpu/rank{i}", (i,), kind, ks, error)


def test_agreement_is_clean():
    v = rules.vote_digests([dev(i) for i in range(4)])
    assert v.clean and v.divergent == {} and v.inconclusive == ()
    assert rules.sdc_incidents(job(4), [dev(i) for i in range(4)], v, 0.0) == []


def test_one_device_with_other_bits_is_attributed_with_its_kernels():
    res = [dev(0), dev(1), dev(2, {"softmax": "bad", "block": "bad2"}), dev(3)]
    v = rules.vote_digests(res)
    assert v.divergent == {"cpu/rank2": ("block", "softmax")}
    (inc,) = rules.sdc_incidents(job(4), res, v, 0.0)
    assert (inc.kind, inc.status, inc.ranks) == ("sdc", "attributed", (2,))
    ev = inc.evidence[0].to_json()
    assert ev["source"] == "replay" and ev["kernels"]["softmax"] == {"digest": "bad", "majority": "d-softmax"}


def test_two_devices_that_differ_are_inconclusive():
    res = [dev(0), dev(1, {"gemm": "other"})]
    v = rules.vote_digests(res)
    assert v.divergent == {} and v.inconclusive == ("gemm",) and not v.clean
    (inc,) = rules.sdc_incidents(job(2), res, v, 0.0)
    assert (inc.kind, inc.status, inc.ranks) == ("sdc", "inconclusive", ())
    assert "gemm" in inc.summary


def test_a_split_with_no_strict_majority_is_inconclusive():
    res = [dev(0), dev(1), dev(2, {"gemm": "x"}), dev(3, {"gemm": "x"})]
    v = rules.vote_digests(res)
    assert v.divergent == {} and v.inconclusive == ("gemm",)


def test_a_device_that_does_not_repeat_itself_is_outside_the_majority():
    res = [dev(0), dev(1), dev(2, stable=False), dev(3)]
    v = rules.vote_digests(res)
    assert set(v.divergent) == {"cpu/rank2"}
    (inc,) = rules.sdc_incidents(job(4), res, v, 0.0)
    assert "unstable" in str(inc.evidence[0].to_json()["kernels"])


def test_devices_of_other_kinds_are_not_compared():
    res = [dev(0), dev(1), dev(2, {"gemm": "other"}, kind="cpu:y torch 2")]
    v = rules.vote_digests(res)
    assert v.divergent == {} and v.inconclusive == ()
    assert any("only one device of kind cpu:y" in n for n in v.notes)


def test_failed_devices_are_left_out_of_the_vote():
    res = [dev(0), dev(1), dev(2), dev(3, error="worker exited with 3")]
    assert rules.vote_digests(res).clean


def test_ten_thousand_devices():
    res = [dev(i, {"gemm": "flip"} if i == 7777 else None) for i in range(10_000)]
    t = time.perf_counter()
    v = rules.vote_digests(res)
    assert v.divergent == {"cpu/rank7777": ("gemm",)}
    assert time.perf_counter() - t < 5


# --------------------------------------------------------------------------- times


def test_a_slow_device_is_confirmed_over_two_rounds_only():
    res = [dev(0), dev(1, secs=3.0), dev(2), dev(3)]
    one = rules.vote_times(res)
    assert one.slow == ("cpu/rank1",)
    assert rules.confirm_slow(job(4), res, [one], 0.0) is None
    inc = rules.confirm_slow(job(4), res, [one, rules.vote_times(res)], 0.0)
    assert inc is not None and (inc.kind, inc.status, inc.ranks) == ("straggler", "attributed", (1,))
    assert "3.0x slower" in inc.summary


def test_slow_in_different_rounds_on_different_devices_is_not_confirmed():
    a = rules.vote_times([dev(0), dev(1, secs=3.0), dev(2), dev(3)])
    b = rules.vote_times([dev(0), dev(1), dev(2, secs=3.0), dev(3)])
    assert rules.confirm_slow(job(4), [dev(i) for i in range(4)], [a, b], 0.0) is None


@pytest.mark.parametrize("secs", [1.1, 1.0 + 0.004])  # under the ratio / under the absolute floor
def test_small_differences_are_not_slow(secs):
    base = 1.0 if secs > 1.05 else 0.001
    res = [dev(0, secs=base), dev(1, secs=base * secs if secs > 1.05 else base + 0.004), dev(2, secs=base),
           dev(3, secs=base)]
    assert rules.vote_times(res).slow == ()


def test_two_devices_one_slower_is_inconclusive():
    res = [dev(0), dev(1, secs=5.0)]
    hist = [rules.vote_times(res), rules.vote_times(res)]
    assert hist[0].inconclusive == ("cpu/rank1",)
    inc = rules.confirm_slow(job(2), res, hist, 0.0)
    assert inc is not None and (inc.kind, inc.status, inc.ranks) == ("straggler", "inconclusive", ())


# --------------------------------------------------------------------------- a live straggler's device


def live_straggler(rank: int = 2) -> Incident:
    """The watch's straggler from the job's signals (consensus/straggler.py), with its cause."""
    return Incident(STRAGGLER, ATTRIBUTED, (rank,), ("h",), 0.0,
                    f"rank {rank} is a straggler: busy 95% of the time; cause: compute: it runs more",
                    (Evidence("procfs", f"rank {rank}'s main thread is on a CPU 95% of the time", rank=rank,
                              data={"metric": "busy"}),
                     Evidence("procfs", "cause: compute: it runs more", rank=rank, data={"cause": "compute"})))


def replays(*slow_per_round: int | None) -> list[list[DeviceRound]]:
    """One round per argument: four devices, the one of that rank 3x slower (None: all alike)."""
    return [[dev(i, secs=3.0 if i == s else 1.0) for i in range(4)] for s in slow_per_round]


def replay_evidence(inc: Incident) -> list[Evidence]:
    return [e for e in inc.evidence if e.source == "replay"]


def test_replay_confirms_the_live_stragglers_device_is_slow():
    inc = rules.explain_straggler(live_straggler(), replays(None, 2, 2))
    (ev,) = replay_evidence(inc)
    assert ev.text == "replay: its device cpu/rank2 ran the same kernels 3.0x slower than its peers' — a slow device"
    assert ev.rank == 2 and ev.data[rules.DEVICE_SLOW] is True and ev.data["seconds"] == [3.0, 3.0]
    assert ev.data["peer_median"] == 1.0
    # the cause says so; what the host saw stays
    assert inc.summary.endswith("; cause: compute: it runs more; replay: a slow device (cpu/rank2 ran the same "
                                "kernels 3.0x slower than its peers')"), inc.summary
    assert inc.evidence[:2] == live_straggler().evidence and inc.key() == live_straggler().key()
    assert not rules.from_replay(inc)  # explained by replay, still the job's own straggler


def test_replay_clears_the_device_when_it_runs_as_fast_as_its_peers():
    # slow once before, at its peers' pace in the last round that compared it: not the device
    inc = rules.explain_straggler(live_straggler(), replays(2, None))
    (ev,) = replay_evidence(inc)
    assert ev.text == ("replay: its device cpu/rank2 runs the same kernels as fast as its peers' (1.000 s vs median "
                       "1.000 s): not the device — the host, its input or its code")
    assert ev.data[rules.DEVICE_SLOW] is False and "peer_median" not in ev.data  # the drain hook keys on both
    assert inc.summary.endswith("; replay: not the device (it runs the same kernels as fast as its peers')")


def test_no_replay_round_covering_its_device_adds_nothing():
    live = live_straggler()
    others = [[dev(i) for i in (0, 1, 3)]] * 2  # rank 2's device not replayed
    failed = [[dev(0), dev(1), dev(2, error="worker died"), dev(3)]] * 2
    alone = [[dev(0), dev(1), dev(2, kind="cuda:other"), dev(3)]] * 2  # no peer of its kind
    for rounds in ([], others, failed, alone):
        assert rules.explain_straggler(live, rounds) == live


def test_slow_in_too_few_rounds_or_without_a_majority_says_nothing():
    live = live_straggler()
    assert rules.explain_straggler(live, replays(2)) == live  # one round: not confirmed yet, not cleared
    assert rules.explain_straggler(live, replays(1, 2)) == live  # slow in the last round only
    two = [[dev(1), dev(2, secs=5.0)]] * 2  # 1-1: no strict majority of fast devices
    assert rules.explain_straggler(live_straggler(), two) == live


def test_explaining_again_replaces_its_own_words():
    once = rules.explain_straggler(live_straggler(), replays(2, 2))
    again = rules.explain_straggler(once, replays(None))
    assert again == rules.explain_straggler(live_straggler(), replays(None))
    assert again.summary.count("; replay: ") == 1


def test_replays_own_straggler_and_other_kinds_are_left_as_they_are():
    res = replays(2, 2)
    own = rules.confirm_slow(job(4), res[-1], [rules.vote_times(r) for r in res], 0.0)
    assert own is not None and rules.from_replay(own)
    assert rules.explain_straggler(own, res) is own
    hang = replace(live_straggler(), kind="hang")
    assert rules.explain_straggler(hang, res) is hang


# --------------------------------------------------------------------------- ledger and devices


def test_ledger_results():
    j = job(4)
    clean = [dev(i) for i in range(4)]
    e = ledger.entry(j, 1.0, 2.0, clean, rules.vote_digests(clean), rules.vote_times(clean))
    assert e["result"] == "clean" and e["complete"]
    bad = [dev(0), dev(1), dev(2, {"gemm": "x"}), dev(3)]
    e = ledger.entry(j, 1.0, 2.0, bad, rules.vote_digests(bad), rules.vote_times(bad))
    assert e["result"] == "sdc" and [d["result"] for d in e["devices"]] == ["agree", "agree", "divergent", "agree"]
    part = [dev(0), dev(1), dev(2), dev(3, error="gone")]
    e = ledger.entry(j, 1.0, 2.0, part, rules.vote_digests(part), rules.vote_times(part))
    assert e["result"] == "incomplete" and not e["complete"]


def test_gpu_devices_from_nvml_else_cuda_visible_devices():
    j = Job(ranks=(Rank(0, 10, "h", 0, device="cuda:2"), Rank(1, 11, "h", 1, device="cuda:3"),
                   Rank(2, 12, "h", 2, device="cuda:GPU-abc")), world_size=3, launcher="x", launcher_pid=1, host="h")
    devs = devices_of(j, nvml=lambda: {11: (5, "GPU-five", "NVIDIA H200")})
    assert devs == [
        Device("cuda:2", "cuda", "cuda", (0,), 10, 2, None, "2"),
        Device("cuda:5", "cuda", "NVIDIA H200", (1,), 11, 5, "GPU-five", "GPU-five"),
        Device("cuda:GPU-abc", "cuda", "cuda", (2,), 12, None, "GPU-abc", "GPU-abc"),
    ]
    # two ranks on one GPU: one worker
    j2 = Job(ranks=(Rank(0, 10, "h", 0, device="cuda:0"), Rank(1, 11, "h", 1, device="cuda:0")), world_size=2,
             launcher="x", launcher_pid=1, host="h")
    (d,) = devices_of(j2, nvml=dict)
    assert d.ranks == (0, 1)
