"""The replay part of the live loop (replay/live.py): when it starts sessions and what it returns,
on a fake clock with a runner that returns results decided by the real rules; and a real session
on a live job stopped half-way, leaving no worker."""

from __future__ import annotations

import os
import threading
import time

import pytest

from scout_sys.model import ATTRIBUTED, STRAGGLER, DeviceRound, Evidence, Incident, Job, KernelResult, Rank
from scout_sys.replay import runner
from scout_sys.replay.live import ReplayPart

J = Job(ranks=tuple(Rank(r, 100 + r, "h") for r in range(4)), world_size=4, launcher="t", launcher_pid=1, host="h")


def result(slow: int | None = None, bad: int | None = None) -> runner.ReplayResult:
    from scout_sys.consensus import replay as rules

    rounds = []
    for _ in range(2):
        rounds.append(tuple(DeviceRound(f"cpu/rank{r}", (r,), "cpu", {"gemm": KernelResult(
            "x" if r == bad else "a", 3.0 if r == slow else 1.0)}) for r in range(4)))
    dv = [rules.vote_digests(x) for x in rounds]
    tv = [rules.vote_times(x) for x in rounds]
    return runner.ReplayResult(runner._diagnose(J, rounds, dv, tv, 0.0, 1.0, []), tuple(rounds), tuple(dv), tuple(tv))


class FakeRunner:
    def __init__(self, res: runner.ReplayResult) -> None:
        self.res, self.calls, self.go = res, 0, threading.Event()

    def __call__(self, job, rounds, **kw):
        self.calls += 1
        assert "stop" in kw and kw["state_dir"] == "/tmp/s"
        self.go.wait(10)
        return self.res


def straggler(ranks=(2,)) -> Incident:
    return Incident(STRAGGLER, ATTRIBUTED, ranks, ("h",), 0.0, "s", (Evidence("procfs", "busy"),))


def settle(part: ReplayPart) -> None:
    end = time.time() + 10
    while part.running and time.time() < end:
        time.sleep(0.01)


def test_a_confirmed_straggler_starts_one_session_and_replay_says_the_device_is_not_slow():
    fake = FakeRunner(result())
    part = ReplayPart(J, runner=fake, state_dir="/tmp/s")
    assert part.step(10.0, [straggler()]) == [] and part.running
    assert part.step(11.0, [straggler()]) == []  # one at a time
    fake.go.set()
    settle(part)
    assert part.step(12.0, [straggler()]) == []  # a healthy replay: no finding...
    assert fake.calls == 1  # ...and the same straggler is not replayed again
    (ev,) = [e for e in part.explain(straggler()).evidence if e.source == "replay"]
    assert "not the device" in ev.text and ev.data["device_slow"] is False


def test_replay_confirms_a_slow_device_and_reports_sdc():
    fake = FakeRunner(result(slow=2, bad=1))
    fake.go.set()
    part = ReplayPart(J, runner=fake, state_dir="/tmp/s")
    part.step(0.0, [straggler()])
    settle(part)
    found = part.step(1.0, [])
    assert sorted((i.kind, i.ranks) for i in found) == [("sdc", (1,)), ("straggler", (2,))]
    assert all(any("started for: straggler rank(s) 2" in e.text for e in i.evidence) for i in found)
    assert "a slow device" in part.explain(straggler()).evidence[-1].text
    # a straggler found by replay does not trigger replay again
    assert part.step(2.0, [i for i in found if i.kind == STRAGGLER]) == [] and not part.running


def test_the_watch_updates_its_straggler_with_what_replay_says_of_the_device():
    """The straggler round's path in the watch (watch/straggler.with_replay, then the incident book):
    the open straggler is updated once with replay's evidence, then stays as it is."""
    from scout_sys.watch.incidents import IncidentBook
    from scout_sys.watch.straggler import with_replay

    fake = FakeRunner(result(slow=2))
    fake.go.set()
    part = ReplayPart(J, runner=fake, state_dir="/tmp/s")
    book = IncidentBook()
    (opened,) = book.reconcile(with_replay([straggler()], part.explain, []), 0.0, frozenset({STRAGGLER}))
    assert opened.event == "incident_opened"
    part.step(0.0, list(book.open.values()))
    settle(part)
    replayed = part.step(1.0, list(book.open.values()))  # replay's own straggler: the same ranks
    found = with_replay([straggler()], part.explain, replayed)
    (updated,) = book.reconcile(found, 1.0, frozenset({STRAGGLER}))
    assert updated.event == "incident_updated" and updated.incident.id == opened.incident.id
    inc = updated.incident
    assert [e.source for e in inc.evidence][0] == "procfs"  # the job's own straggler, its evidence first
    assert any(e.data.get("device_slow") is True for e in inc.evidence)  # explained: a slow device
    assert any("peer_median" in e.data and "device_slow" not in e.data for e in inc.evidence)  # replay's own
    assert "; replay: a slow device (cpu/rank2" in inc.summary
    assert book.reconcile(with_replay([straggler()], part.explain, replayed), 2.0, frozenset({STRAGGLER})) == []


def test_periodic_sessions():
    fake = FakeRunner(result())
    fake.go.set()
    part = ReplayPart(J, every=60.0, runner=fake, state_dir="/tmp/s", started=0.0)
    part.step(59.0, [])
    assert fake.calls == 0
    part.step(60.0, [])
    settle(part)
    part.step(61.0, [])
    part.step(119.0, [])
    assert fake.calls == 1
    part.step(121.0, [])
    settle(part)
    assert fake.calls == 2


def test_a_failing_session_is_reported_not_raised():
    def boom(job, rounds, **kw):
        raise runner.ReplayError("not enough free memory")

    part = ReplayPart(J, runner=boom, state_dir="/tmp/s")
    part.request("manual", 0.0)
    settle(part)
    assert part.step(1.0, []) == [] and part.last_error == "not enough free memory"


@pytest.mark.slow
def test_close_stops_a_real_session_and_leaves_no_worker(start_job):
    from scout_sys.job import find_job
    from tests.test_replay_e2e import workers_of

    job = start_job(4, args=["--log-every", "1"])
    job.wait_steps(2, timeout=120)
    part = ReplayPart(find_job(str(job.pid)), rounds=1000, size="small", reps=3)
    assert part.request("manual", 0.0)
    end = time.time() + 180
    while len(workers_of(job)) < 4 and time.time() < end:
        time.sleep(0.2)
    assert len(workers_of(job)) == 4
    t = time.time()
    part.close()
    assert time.time() - t < 10
    assert workers_of(job) == [] and part.step(1.0, []) == [] and part.last is None
    assert os.path.exists(f"/proc/{job.pid}")


def test_a_checkpoints_coverage_is_the_rounds_since_the_previous_one_in_its_folder():
    # rank 0 rewrote a scratch file in /tmp a moment before its checkpoint: the scratch file took the
    # clean round, and the checkpoint was "not covered" (CI read so once); certify reads coverage
    # per folder (the newest older sibling), so does the watch now
    from scout_sys.replay import ledger
    from scout_sys.replay.live import COVERED, NOT_COVERED

    part = ReplayPart(J, runner=lambda *a, **k: result(), state_dir="/tmp/s")
    part._rounds.append((10.0, ledger.CLEAN))
    assert part._coverage_of("/tmp/scratch.bin", 11.0) == COVERED
    assert part._coverage_of("/ckpts/step_60.pt", 11.1) == COVERED  # the round since its folder's previous
    assert part._coverage_of("/ckpts/step_120.pt", 14.0) == NOT_COVERED  # no round since step_60
