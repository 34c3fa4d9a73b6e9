"""The live watch's session, shared by ``watch --job`` and ``watch --cluster``: sinks fed after each
poll, a new incident's bundle named on it (pure: a temporary folder, no processes)."""

from __future__ import annotations

from scout_sys.watch.hang import HangWatch
from scout_sys.watch.incidents import IncidentBook
from scout_sys.watch.session import Session
from scout_sys.watch.views import Views
from tests.test_exporters import HANG_2, _snapshot


class _Sink:
    def __init__(self) -> None:
        self.got: list[tuple[str, object]] = []

    def on_event(self, e: object) -> None:
        self.got.append(("event", e))

    def on_snapshot(self, s: object, took: float) -> None:
        self.got.append(("snapshot", s))

    def close(self) -> None:
        pass


def test_a_poll_feeds_the_sinks_its_events_then_the_snapshot_it_made(tmp_path) -> None:
    session, sink = Session(str(tmp_path)), _Sink()
    session.sinks.append(sink)
    snap = _snapshot((HANG_2,))

    def step() -> list[str]:
        session.snapshot = snap  # the source publishes during its poll
        return ["e1", "e2"]

    assert session.poll(step) == ["e1", "e2"]
    assert sink.got == [("event", "e1"), ("event", "e2"), ("snapshot", snap)]


def test_a_bundle_is_named_on_its_incident_and_a_failed_one_said_not_raised(tmp_path) -> None:
    session, said = Session(str(tmp_path)), []
    inc, path = session.save_bundle(HANG_2, lambda d: d + "/bundles/x", "cluster", said.append)
    assert path == str(tmp_path) + "/bundles/x" and session.bundle == path
    assert inc.evidence[-1].source == "cluster" and inc.evidence[-1].data == {"bundle": path}
    assert inc.evidence[:-1] == HANG_2.evidence and not said

    def fails(d: str) -> str:
        raise PermissionError(13, "Permission denied")

    same, none = session.save_bundle(HANG_2, fails, "procfs", said.append)
    assert same is HANG_2 and none is None and session.bundle == path
    assert said == [f"cannot save the evidence bundle under {tmp_path}: [Errno 13] Permission denied"]


def test_the_snapshot_is_made_from_the_engines_parts_plus_what_one_source_alone_has(tmp_path) -> None:
    session, base = Session(str(tmp_path)), _snapshot()
    book, views = IncidentBook(), Views()
    book.reconcile([HANG_2], base.time, None)
    views.views, views.stacks = dict(base.views), {2: ("train.py:9 load_next_batch_stuck",)}
    session.bundle = "/b/x"
    notes = [f"note {i}" for i in range(12)]
    snap = session.publish(base.time, base.started, base.job, hang=HangWatch(4.0), book=book, views=views,
                           probes={"procfs": None}, devices={0: {"index": 3}}, notes=notes, pauses={2: 7.5},
                           agents=({"node": 1},))
    assert snap is session.snapshot and (snap.time, snap.started, snap.job) == (base.time, base.started, base.job)
    assert [i.key() for i in snap.incidents] == [HANG_2.key()] and snap.closed == ()
    assert snap.views == base.views and snap.stacks == views.stacks and snap.stall_after == 4.0
    assert (snap.probes, snap.devices, snap.pauses, snap.bundle) == ({"procfs": None}, {0: {"index": 3}}, {2: 7.5}, "/b/x")
    assert snap.notes == tuple(notes[-10:]) and snap.agents == ({"node": 1},) and snap.step_times == {}
