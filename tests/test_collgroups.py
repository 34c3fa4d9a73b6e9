"""consensus/collgroups.py: a collective sample's group named across ranks by its members (Gloo: read
from the group; NCCL: the communicator matched at creation), the probe's name where they are unknown."""

from __future__ import annotations

from scout_sys.consensus import collgroups
from scout_sys.model import CollectiveSample, ProcessGroupSample


def _s(rank: int, group: str, members: tuple[int, ...] = (), backend: str = "gloo", ptr: int = 0,
       t: float = 1.0) -> CollectiveSample:
    return CollectiveSample(time=t, rank=rank, pid=100 + rank, backend=backend, group=group, seq=5, completed=None,
                            inside=False, last_enter=None, last_exit=None, last=None, group_ptr=ptr, members=members)


def test_a_dp_tp_jobs_tensor_parallel_groups_are_two_groups_under_one_probe_name():
    # dp=2 x tp=2: every rank's first group is its tp pair (gloo:0), its second the dp pair (gloo:1)
    tp = {0: (0, 1), 1: (0, 1), 2: (2, 3), 3: (2, 3)}
    dp = {0: (0, 2), 1: (1, 3), 2: (0, 2), 3: (1, 3)}
    obs = [_s(r, "gloo:0", tp[r]) for r in range(4)] + [_s(r, "gloo:1", dp[r]) for r in range(4)]
    assert collgroups.keys(obs) == {
        (0, "gloo:0"): "gloo[0,1]", (1, "gloo:0"): "gloo[0,1]", (2, "gloo:0"): "gloo[2,3]", (3, "gloo:0"): "gloo[2,3]",
        (0, "gloo:1"): "gloo[0,2]", (1, "gloo:1"): "gloo[1,3]", (2, "gloo:1"): "gloo[0,2]", (3, "gloo:1"): "gloo[1,3]"}


def test_two_groups_of_one_rank_with_the_same_members_keep_the_probes_name_and_unknown_members_keep_it_alone():
    obs = [_s(0, "gloo:0", (0, 1)), _s(0, "gloo:1", (0, 1)), _s(1, "gloo:0", (0, 1)), _s(1, "gloo:2")]
    assert collgroups.keys(obs) == {(0, "gloo:0"): "gloo[0,1]gloo:0", (0, "gloo:1"): "gloo[0,1]gloo:1",
                                    (1, "gloo:0"): "gloo[0,1]", (1, "gloo:2"): "gloo:2"}
    # the newest sample of a (rank, group) counts
    assert collgroups.keys([_s(2, "gloo:0"), _s(2, "gloo:0", (2, 3), t=2.0)]) == {(2, "gloo:0"): "gloo[2,3]"}


def test_nccl_calls_are_named_by_the_communicator_matched_at_creation():
    groups = ((0, 1), (2, 3))
    old = ProcessGroupSample(time=1.0, groups=((0, 1, 2, 3),), source="ebpf-comms", handles=((0, 0xA, 0),))
    comms = ProcessGroupSample(time=2.0, groups=groups, source="ebpf-comms",
                               handles=((0, 0xA, 0), (1, 0xB, 0), (2, 0xA, 1), (3, 0xC, 9)))  # 9: no such group
    obs = [_s(0, "nccl:0", backend="nccl", ptr=0xA), _s(1, "nccl:0", backend="nccl", ptr=0xB),
           _s(2, "nccl:0", backend="nccl", ptr=0xA), _s(3, "nccl:0", backend="nccl", ptr=0xC),
           _s(3, "gloo:0", ptr=0xA)]  # a Gloo call is never named by an NCCL communicator
    assert collgroups.keys([comms, old, *obs]) == {  # the newest communicator record, whatever the order
        (0, "nccl:0"): "nccl[0,1]", (1, "nccl:0"): "nccl[0,1]", (2, "nccl:0"): "nccl[2,3]",
        (3, "nccl:0"): "nccl:0", (3, "gloo:0"): "gloo:0"}
    # without the communicators: the probe's names
    assert set(collgroups.keys(obs).values()) == {"nccl:0", "gloo:0"}


def test_names_and_labels_for_people():
    assert collgroups.member_name("nccl", (1, 3)) == "nccl[1,3]"
    assert collgroups.known("gloo[1,3]") and collgroups.known("gloo[0,1]gloo:1") and not collgroups.known("gloo:1")
    assert collgroups.label("gloo[1,3]", (1, 3)) == "ranks 1, 3"
    assert collgroups.label("gloo[0,1]gloo:1", (0, 1)) == "ranks 0-1 (gloo[0,1]gloo:1)"
    assert collgroups.label("gloo:1", (0, 1)) == "ranks 0-1 (gloo:1)"
    assert collgroups.label("gloo:1", ()) == "gloo:1"


def test_a_position_names_every_real_group_behind_a_probe_name():
    both = [_s(0, "gloo:1", (0, 1)), _s(2, "gloo:1", (2, 3)), _s(1, "gloo:1", (0, 1))]
    assert collgroups.label_of("gloo:1", both) == "ranks 0-1 and ranks 2-3 (gloo:1)"
    assert collgroups.position("gloo:1", both, 5) == "#5 of ranks 0-1 and ranks 2-3 (gloo:1)"
    unknown = [*both, _s(3, "gloo:1")]  # one sample without members: the name alone
    assert collgroups.label_of("gloo:1", unknown) == "gloo:1"
    assert collgroups.position("gloo:1", unknown, 5) == "gloo:1 #5"
    assert collgroups.label_of("gloo:1", []) == "gloo:1"
