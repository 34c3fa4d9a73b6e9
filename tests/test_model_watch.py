"""The live watch's records (model_watch.py): an incident Event's JSON, and the Snapshot's saved form
(a ``scout-sys/diagnosis/v1`` report with a ``"watch"`` key) and back, on records built by hand."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from scout_sys.model import (
    SCHEMA,
    WATCH_KEY,
    Diagnosis,
    Event,
    Evidence,
    Incident,
    Job,
    Rank,
    RankView,
    Snapshot,
)

JOB = Job(ranks=(Rank(0, 100, "a"), Rank(1, 101, "b", local_rank=0)), world_size=3, launcher="torchrun",
          launcher_pid=99, host="a", missing=(2,), notes=("rank 2 exited before it was seen",))
HANG = Incident("hang", "attributed", (1,), ("b",), 10.12345, "rank 1 hung", (Evidence("stack", "t", 1, {"k": 1}),),
                id="i1")
GONE = Incident("straggler", "inconclusive", (), (), 3.0, "no majority")
STACK = ("t.py:1 f", "t.py:2 g")


def snapshot(**kw: Any) -> Snapshot:
    base: dict[str, Any] = dict(
        time=20.00049, started=5.0, job=JOB,
        views={0: RankView(0, "waiting", "t.py:1 f", "all_reduce at t.py:1", 0.449, STACK),
               1: RankView(1, "busy", "t.py:9 h", None, 99.96)},
        incidents=(HANG,), closed=(GONE,), probes={"procfs": None, "ebpf": "no root"}, stall_after=7.5,
        step_times={1: (1.0000004, 2.5)}, wait_fractions={0: (0.12345,)}, stacks={0: STACK},
        devices={1: {"index": 0, "util_percent": 97}}, ended=True, bundle="/state/bundle-1",
        pauses={0: 1.0}, seqs={0: {"gloo:0": 4}}, lost_events=3,
        agents=({"node": 0, "host": "a", "state": "up", "ranks": [0, 2], "detail": ""},))
    base.update(kw)
    return Snapshot(**base)


def reopened(s: Snapshot) -> Snapshot:
    """The snapshot saved, written as JSON and read back, as the dashboard opens a saved report."""
    return Snapshot.from_report(json.loads(json.dumps(s.to_report())))


def test_an_event_in_json_rounds_its_time_and_names_its_bundle_only_when_there_is_one() -> None:
    assert Event("incident_opened", 12.34567, HANG).to_json() == {
        "event": "incident_opened", "time": 12.346, "incident": HANG.to_json()}
    assert Event("incident_closed", 1.0, GONE, bundle="/b").to_json() == {
        "event": "incident_closed", "time": 1.0, "incident": GONE.to_json(), "bundle": "/b"}
    assert Event("incident_updated", 1.0, GONE, bundle="").to_json() == {
        "event": "incident_updated", "time": 1.0, "incident": GONE.to_json()}


def test_the_snapshot_as_a_diagnosis() -> None:
    s = snapshot()
    d = s.diagnosis()
    assert d == Diagnosis(time=s.time, job=JOB, views={}, incidents=(HANG,), probes={}, window=0.0,
                          notes=JOB.notes)
    assert (d.views, d.probes) == (s.views, s.probes)
    assert d.views is not s.views and d.probes is not s.probes


def test_the_report_is_the_diagnosis_plus_what_the_dashboard_shows_under_watch() -> None:
    s = snapshot()
    rep = s.to_report()
    assert {k: v for k, v in rep.items() if k != WATCH_KEY} == s.diagnosis().to_json()
    assert rep["schema"] == SCHEMA and WATCH_KEY == "watch"
    assert rep[WATCH_KEY] == {
        "started": 5.0, "stall_after": 7.5, "ended": True, "bundle": "/state/bundle-1",
        "hosts": {"0": "a", "1": "b"},  # the ranks found (rank 2 is missing)
        "closed": [GONE.to_json()],
        "stacks": {"0": list(STACK)},
        "step_times": {"1": [1.0, 2.5]},
        "wait_fractions": {"0": [0.1235]},
        "devices": {"1": {"index": 0, "util_percent": 97}},
        "agents": [{"node": 0, "host": "a", "state": "up", "ranks": [0, 2], "detail": ""}],
    }
    assert list(snapshot(agents=()).to_report()[WATCH_KEY]) == list(rep[WATCH_KEY])[:-1]  # no "agents"


def test_the_watch_sections_are_sorted_by_rank_number() -> None:
    st = {10: (1.0,), 2: (2.0,), 1: (3.0,)}
    w = snapshot(step_times=st, wait_fractions=st, stacks={10: ("x",), 2: ("y",)}).to_report()[WATCH_KEY]
    assert list(w["step_times"]) == list(w["wait_fractions"]) == ["1", "2", "10"]
    assert list(w["stacks"]) == ["2", "10"]


def test_a_saved_snapshot_reopens_with_what_it_showed() -> None:
    s = snapshot()
    back = reopened(s)
    assert (back.time, back.started, back.stall_after, back.ended, back.bundle) == (20.0, 5.0, 7.5, True,
                                                                                   "/state/bundle-1")
    assert back.job.ranks == (Rank(0, 100, "a", world_size=3), Rank(1, 101, "b", local_rank=0, world_size=3))
    assert (back.job.missing, back.job.notes, back.job.launcher_pid) == ((2,), JOB.notes, 99)
    assert back.incidents == (replace(HANG, since=10.123),)  # its time as saved, to the millisecond
    assert back.incidents[0].evidence[0].data == {"k": 1}
    assert back.closed == (GONE,)
    assert back.probes == {"procfs": None, "ebpf": "no root"}
    # the views: their stacks from the watch section, CPU% as saved (one decimal), the missing rank exited
    assert back.views == {0: RankView(0, "waiting", "t.py:1 f", "all_reduce at t.py:1", 0.4, STACK),
                          1: RankView(1, "busy", "t.py:9 h", None, 100.0),
                          2: RankView(2, "exited")}
    assert back.step_times == {1: (1.0, 2.5)} and back.wait_fractions == {0: (0.1235,)}
    assert back.stacks == {0: STACK} and back.devices == {1: {"index": 0, "util_percent": 97}}
    assert back.agents == s.agents


def test_a_reopened_report_saves_as_the_same_report() -> None:
    rep = snapshot().to_report()
    assert reopened(snapshot()).to_report() == rep
    assert reopened(reopened(snapshot())).to_report() == rep


def test_the_live_figures_of_a_poll_are_not_saved() -> None:
    back = reopened(snapshot())
    assert (back.pauses, back.seqs, back.lost_events) == ({}, {}, None)


def test_a_plain_diagnose_report_without_a_watch_section_opens() -> None:
    d = Diagnosis(time=42.0, job=JOB, views={1: RankView(1, "idle", "t.py:3 k", cpu_percent=0.0)}, incidents=(),
                  probes={"stacks": None, "nvml": "no NVIDIA driver"}, window=3.0, notes=JOB.notes)
    s = Snapshot.from_report(json.loads(json.dumps(d.to_json())))
    assert (s.time, s.started, s.stall_after, s.ended, s.bundle) == (42.0, 42.0, 0.0, False, None)
    assert (s.incidents, s.closed, s.agents) == ((), (), ())
    assert (s.stacks, s.step_times, s.wait_fractions, s.devices) == ({}, {}, {}, {})
    assert s.views == {0: RankView(0, "unknown"), 1: RankView(1, "idle", "t.py:3 k", cpu_percent=0.0),
                       2: RankView(2, "exited")}
    assert s.probes == {"stacks": None, "nvml": "no NVIDIA driver"}


def test_a_probe_reason_that_itself_starts_with_off_keeps_its_own_words() -> None:
    s = reopened(snapshot(probes={"ebpf": "off: by --no-ebpf"}))
    assert s.probes == {"ebpf": "off: by --no-ebpf"}


@pytest.mark.parametrize(("doc", "said"), [
    ({"schema": "scout-sys/diagnosis/v2", "job": {}}, "schema 'scout-sys/diagnosis/v2'"),
    ({"job": {"ranks": []}}, "schema None"),
    ({}, "schema None"),
])
def test_a_document_that_is_not_a_report_is_refused(doc: dict[str, Any], said: str) -> None:
    with pytest.raises(ValueError) as e:
        Snapshot.from_report(doc)
    assert str(e.value) == f"not a scout-sys report ({said}, expected {SCHEMA})"
