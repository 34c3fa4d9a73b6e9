"""The Job's one JSON codec (scout_sys/model_job.py): both profiles round-trip, and the layout's source
is a value that travels with it (never read back from the layout's sentence, but for earlier reports)."""

from __future__ import annotations

import json

import pytest

from scout_sys.consensus import peers
from scout_sys.job import with_layout
from scout_sys.model import Diagnosis, Job, LayoutSource, ProcessGroupSample, Rank, RankView, Snapshot
from scout_sys.model_job import REPORT, WIRE, job_from_json, job_to_json
from scout_sys.tui.state import peers_title


def _through(d: dict) -> dict:
    return json.loads(json.dumps(d))


def _laid_out(job: Job) -> Job:
    return with_layout(job, "dp=2,tp=2")


def test_wire_round_trips_every_field():
    ranks = (Rank(rank=0, pid=10, host="a", local_rank=0, world_size=4, group_rank=0, run_id="r1", name="python",
                  coords=(("dp", 0), ("tp", 0)), container_pid=7),
             Rank(rank=1, pid=11, host="b", local_rank=1, device="cuda:1"))
    job = Job(ranks=ranks, world_size=4, launcher="torchrun", launcher_pid=9, host="a", missing=(2,),
              peer_groups=((0, 2), (1, 3)), notes=("a note",), layout="--topology dp=2,tp=2 (order mesh: ...)",
              remote=(3,), missing_hosts=((2, "c"),), layout_source=LayoutSource.TOPOLOGY,
              layout_from="--topology dp=2,tp=2")
    assert job_from_json(_through(job_to_json(job, WIRE)), WIRE) == job
    plain = Job(ranks=ranks[:1], world_size=1, launcher="shell", launcher_pid=None, host="a")
    assert job_from_json(_through(job_to_json(plain, WIRE)), WIRE) == plain


def test_report_round_trips_what_it_holds():
    ranks = tuple(Rank(rank=r, pid=100 + r, host="h", local_rank=r, world_size=4, container_pid=(7 if r == 1 else None))
                  for r in (0, 1, 3))
    job = _laid_out(Job(ranks=ranks, world_size=4, launcher="torchrun", launcher_pid=9, host="h", missing=(2,)))
    assert job.layout_source is LayoutSource.TOPOLOGY and job.layout_from == "--topology dp=2,tp=2"
    back = job_from_json(_through(job_to_json(job, REPORT)), REPORT, notes=job.notes)
    assert back == job
    # a whole job merged from agents: ranks elsewhere and an exited rank's host come back too
    merged = Job(ranks=ranks[:1], world_size=4, launcher="2 agents via store", launcher_pid=None, host="h",
                 missing=(2,), remote=(1, 3), missing_hosts=((2, "other"),))
    assert job_from_json(_through(job_to_json(merged, REPORT)), REPORT) == merged


def test_a_saved_report_gives_the_dashboard_the_same_job():
    job = _laid_out(Job(ranks=tuple(Rank(rank=r, pid=100 + r, host="h", world_size=4) for r in range(4)),
                        world_size=4, launcher="torchrun", launcher_pid=9, host="h"))
    views = {r: RankView(rank=r, state="waiting") for r in range(4)}
    d = Diagnosis(time=1.0, job=job, views=views, incidents=(), probes={}, notes=job.notes).to_json()
    assert d["job"]["layout_source"] == "topology" and d["job"]["layout"] == job.layout
    snap = Snapshot.from_report(_through(d))
    assert snap.job == job and peers_title(snap.job) == "ranks by peer group (--topology dp=2,tp=2)"


def test_a_learned_layout_stays_learned_across_the_wire():
    job = Job(ranks=tuple(Rank(rank=r, pid=100 + r, host="h") for r in range(4)), world_size=4,
              launcher="torchrun", launcher_pid=9, host="h")
    sample = ProcessGroupSample(time=1.0, groups=((0, 1), (2, 3), (0, 2), (1, 3)))
    learned = peers.with_learned(job, [sample])
    assert learned.layout_source is LayoutSource.LEARNED and learned.layout_from.startswith(peers.LEARNED)
    back = job_from_json(_through(job_to_json(learned, WIRE)), WIRE)
    assert peers.is_learned(back) and peers.with_learned(back, [sample]) == back
    # a framework's or --topology's layout wins over learned groups
    given = _laid_out(job)
    assert peers.with_learned(given, [sample]) is given


def test_a_layout_learned_again_replaces_its_note():
    job = Job(ranks=tuple(Rank(rank=r, pid=100 + r, host="h") for r in range(8)), world_size=8,
              launcher="torchrun", launcher_pid=9, host="h", notes=("before",))
    tp2 = ProcessGroupSample(time=1.0, groups=((0, 1), (2, 3), (4, 5), (6, 7), (0, 2, 4, 6), (1, 3, 5, 7)))
    tp4 = ProcessGroupSample(time=2.0, groups=((0, 1, 2, 3), (4, 5, 6, 7), (0, 4), (1, 5), (2, 6), (3, 7)))
    first = peers.with_learned(job, [tp2])
    second = peers.with_learned(first, [tp4])
    assert first.peer_groups == ((0, 2, 4, 6), (1, 3, 5, 7)) and second.peer_groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    learned_notes = [n for n in second.notes if n.startswith("peer groups from " + peers.LEARNED)]
    assert second.notes[0] == "before" and len(learned_notes) == 1 and "(0,4)" in learned_notes[0]


@pytest.mark.parametrize("text, source, where", [
    ("process groups learned from the ranks' connections: dp=2,tp=2 (read with tp fastest, as ...)",
     LayoutSource.LEARNED, "process groups learned from the ranks' connections"),
    ("--topology dp=2,tp=2 (order mesh: tp-dp, fastest first)", LayoutSource.TOPOLOGY, "--topology dp=2,tp=2"),
    ("Megatron-Core command line (tp=2; expert parallelism reuses data-parallel ranks): dp=2,tp=2 (order ...)",
     LayoutSource.FRAMEWORK, "Megatron-Core command line"),
])
def test_reports_of_earlier_versions_say_their_source(text, source, where):
    j = {"world_size": 4, "launcher": "torchrun", "launcher_pid": 9,
         "ranks": [{"rank": r, "pid": 100 + r, "host": "h"} for r in range(4)],
         "layout": text, "peer_groups": [[0, 2], [1, 3]]}
    job = job_from_json(j, REPORT)
    assert (job.layout_source, job.layout_from, job.layout) == (source, where, text)
    assert job_from_json({k: v for k, v in j.items() if k not in ("layout", "peer_groups")},
                         REPORT).layout_source is LayoutSource.NONE
