"""The human output of ``replay`` (replay/report.py) on hand-made device rounds, judged by the real
replay rules (consensus/replay.py): the verdict as ``diagnose`` prints it, then the device table in
place of the rank table, and the notes after it."""

from __future__ import annotations

from collections.abc import Sequence

from scout_sys.consensus import replay as rules
from scout_sys.model import DeviceRound, Job, KernelResult, Rank
from scout_sys.replay import runner
from scout_sys.replay.report import render_replay
from scout_sys.report import render

KERNELS = ("gemm", "softmax")
J = Job(ranks=tuple(Rank(rank=r, pid=1000 + r, host="h") for r in range(4)), world_size=4, launcher="torchrun",
        launcher_pid=1, host="h")
HEAD = "  DEVICE         RANKS    DIGESTS                                  SECONDS"
ONE_ROUND = "note: times are judged over 2 rounds or more: a slow device cannot be confirmed in one"


def dev(i: int, digests: dict[str, str] | None = None, secs: float = 1.0, kind: str = "cpu:x torch 2",
        error: str | None = None, ranks: tuple[int, ...] | None = None) -> DeviceRound:
    ds = {k: "d-" + k for k in KERNELS}
    ds.update(digests or {})
    ks = {} if error else {k: KernelResult(v, secs / len(ds)) for k, v in ds.items()}
    return DeviceRound(f"cpu/rank{i}", (i,) if ranks is None else ranks, kind, ks, error)


def result(rounds: Sequence[Sequence[DeviceRound]], job: Job = J) -> runner.ReplayResult:
    dv = [rules.vote_digests(r) for r in rounds]
    tv = [rules.vote_times(r) for r in rounds]
    return runner.ReplayResult(runner._diagnose(job, rounds, dv, tv, 0.0, 1.0, []), tuple(map(tuple, rounds)),
                               tuple(dv), tuple(tv))


def table(text: str) -> list[str]:
    """The device table: from its title to the line before the notes."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("devices ("))
    return [ln for ln in lines[start:] if not ln.startswith(("note:", "signals off"))]


def test_four_devices_that_agree_in_one_round() -> None:
    assert render_replay(result([[dev(i) for i in range(4)]])) == "\n".join([
        "job: 4 ranks (4 found on h), launcher torchrun pid 1, window 1.0 s",
        "HEALTHY: no incident",
        "devices (1 round; seconds per round):",
        HEAD,
        "  cpu/rank0      0        agree (2 kernels)                        1.000",
        "  cpu/rank1      1        agree (2 kernels)                        1.000",
        "  cpu/rank2      2        agree (2 kernels)                        1.000",
        "  cpu/rank3      3        agree (2 kernels)                        1.000",
        ONE_ROUND,
    ])


def test_the_rank_table_of_diagnose_gives_way_to_the_device_table() -> None:
    r = result([[dev(i) for i in range(4)]])
    plain = render(r.diagnosis).splitlines()
    assert plain[2] == "ranks:"  # what diagnose prints (state "agrees" per rank)...
    out = render_replay(r).splitlines()
    assert out[:2] == plain[:2] and "ranks:" not in out  # ...replay does not
    assert out[-1] == ONE_ROUND == plain[-1]


def test_a_divergent_device_and_a_slow_one_over_two_rounds() -> None:
    rnd = [dev(0), dev(1), dev(2, {"gemm": "bad"}), dev(3, secs=5.0)]
    out = render_replay(result([rnd, rnd]))
    assert table(out) == [
        "devices (2 rounds; seconds per round):",
        HEAD,
        "  cpu/rank0      0        agree (2 kernels)                        1.000 1.000",
        "  cpu/rank1      1        agree (2 kernels)                        1.000 1.000",
        "  cpu/rank2      2        differs on gemm                          1.000 1.000",
        "  cpu/rank3      3        agree (2 kernels)                        5.000* 5.000*",
        "  * slower than its peers in that round",
    ]
    assert out.splitlines()[1] == "INCIDENT sdc (attributed): rank 2 on h"
    assert [ln for ln in out.splitlines() if ln.startswith("INCIDENT")] == [
        "INCIDENT sdc (attributed): rank 2 on h", "INCIDENT straggler (attributed): rank 3 on h"]
    assert ONE_ROUND not in out.splitlines()


def test_kernels_that_differ_in_any_round_are_named_once_each_sorted() -> None:
    r1 = [dev(0), dev(1), dev(2, {"softmax": "bad"}), dev(3)]
    r2 = [dev(0), dev(1), dev(2, {"gemm": "bad", "softmax": "bad"}), dev(3)]
    assert table(render_replay(result([r1, r2])))[4] == (
        "  cpu/rank2      2        differs on gemm, softmax                 1.000 1.000")


def test_a_device_slow_in_one_round_only_is_starred_in_that_round() -> None:
    out = render_replay(result([[dev(i) for i in range(4)], [dev(0), dev(1), dev(2), dev(3, secs=5.0)]]))
    assert table(out)[5:] == ["  cpu/rank3      3        agree (2 kernels)                        1.000 5.000*",
                              "  * slower than its peers in that round"]
    assert [ln for ln in out.splitlines() if ln.startswith("INCIDENT")] == []  # not confirmed in one round


def test_a_two_two_split_has_no_majority_on_its_kernel() -> None:
    rnd = [dev(0), dev(1), dev(2, {"gemm": "x"}), dev(3, {"gemm": "x"})]
    assert table(render_replay(result([rnd])))[2:] == [
        f"  cpu/rank{i}      {i}        no majority on gemm                      1.000" for i in range(4)]


def test_no_majority_is_shown_on_the_devices_of_the_kind_that_split_only() -> None:
    # Two kinds: the vote names the kernel "gemm (A)"; the A devices have no majority on gemm, the B
    # devices agree (and their times are not compared with A's: "-"). The table said "agree" for A.
    rnd = [dev(0, kind="A"), dev(1, {"gemm": "z"}, kind="A"), dev(2, kind="B"), dev(3, kind="B")]
    out = render_replay(result([rnd]))
    assert out.splitlines()[2] == ("  devices disagree on gemm (A) with no strict majority: cannot tell which "
                                   "device is wrong")
    assert table(out)[2:] == [
        "  cpu/rank0      0        no majority on gemm                      1.000",
        "  cpu/rank1      1        no majority on gemm                      1.000",
        "  cpu/rank2      2        agree (2 kernels)                        -",
        "  cpu/rank3      3        agree (2 kernels)                        -",
    ]


def test_a_failed_device_shows_its_error_as_printable_text_and_the_notes_follow_the_table() -> None:
    rnd = [dev(0), dev(1), dev(2, error="worker died\x1b[31m"), dev(3)]
    lines = render_replay(result([rnd])).splitlines()
    assert lines[-9:] == [
        "devices (1 round; seconds per round):",
        HEAD,
        "  cpu/rank0      0        agree (2 kernels)                        1.000",
        "  cpu/rank1      1        agree (2 kernels)                        1.000",
        "  cpu/rank2      2        error: worker died?[31m                  -",
        "  cpu/rank3      3        agree (2 kernels)                        1.000",
        "signals off: replay (1 device(s) gave no result)",
        "note: cpu/rank2: no result (worker died?[31m)",
        ONE_ROUND,
    ]


def test_a_device_of_several_ranks_lists_them() -> None:
    job = Job(ranks=tuple(Rank(rank=r, pid=1000 + r, host="h") for r in range(6)), world_size=6,
              launcher="torchrun", launcher_pid=1, host="h")
    rnd = [dev(0, ranks=(0, 1)), dev(1, ranks=(2, 3)), dev(2, ranks=(4, 5))]
    assert table(render_replay(result([rnd], job)))[2:] == [
        f"  cpu/rank{i}      {2 * i},{2 * i + 1}      agree (2 kernels)                        1.000" for i in range(3)]


def test_verbose_is_passed_to_the_verdict() -> None:
    rnd = [dev(0), dev(1), dev(2, {"gemm": "bad"}), dev(3)]
    r = result([rnd])
    for verbose in (True, False):
        head = render(r.diagnosis, verbose=verbose).splitlines()
        head = head[:head.index("ranks:")]
        assert render_replay(r, verbose=verbose).splitlines()[:len(head)] == head
    assert render_replay(r, verbose=False) != render_replay(r, verbose=True)
