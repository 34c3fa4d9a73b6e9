"""diagnose's window too short to tell a slow step from a hang: an inconclusive hang (exit 1), never
"healthy" (scout_sys/monitor.py too_short); a job whose steps fit in the window stays healthy."""

from __future__ import annotations

import pytest

from scout_sys.model import HANG, INCONCLUSIVE, Frame
from scout_sys.monitor import too_short
from tests.conftest import diagnose_json, wait_for
from tests.test_hang_rules import SLEEPING, T0, TRAIN, WAIT_AR, _job, _rank_obs

WINDOW = (T0, T0 + 4)


def test_no_rank_moving_over_the_whole_window_is_too_short_to_tell():
    obs = []
    for r in range(4):  # asleep at one place, main threads last ran before the window
        obs += _rank_obs(r, stacks=SLEEPING if r % 2 else WAIT_AR)
    inc = too_short(_job(4), obs, WINDOW)
    assert inc is not None and (inc.kind, inc.status, inc.ranks) == (HANG, INCONCLUSIVE, ())
    assert "too short" in inc.summary and "--window" in inc.summary


def test_a_rank_that_moved_or_ran_in_the_window_is_progress():
    moved = [SLEEPING] * 4 + [(Frame(function="forward", file=TRAIN, line=20),) + SLEEPING[1:]]
    obs = []
    for r in range(4):
        obs += _rank_obs(r, stacks=moved if r == 1 else SLEEPING)
    assert too_short(_job(4), obs, WINDOW) is None
    ran = []
    for r in range(4):
        ran += [o if not hasattr(o, "main_last_ran") or r != 3 else
                type(o)(**{**o.__dict__, "main_last_ran": T0 + 2}) for o in _rank_obs(r, stacks=SLEEPING)]
    assert too_short(_job(4), ran, WINDOW) is None  # rank 3's main thread ran inside the window


def _asleep_in_the_step(pid: int) -> bool:
    """A rank's main thread in the step's sleep (time.sleep: nanosleep), past its collectives."""
    try:
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        return not any(v.startswith(b"RANK=") for v in env) or \
            open(f"/proc/{pid}/wchan").read() in ("hrtimer_nanosleep", "do_nanosleep")
    except OSError:
        return False


@pytest.mark.slow
def test_a_job_stepping_slower_than_the_window_is_an_inconclusive_hang_not_healthy(start_job):
    # every rank sleeps 60 s per step: a 2 s window sees nobody move, as it would a hang. diagnose
    # waits for its eBPF probes before its window (clang: seconds, many on a loaded 2-core CI): with
    # 10 s steps its window sometimes held the next step, whose ranks moved ("healthy", rightly). The
    # window now begins within the first step's sleep, whatever the compile takes.
    job = start_job(4, args=["--step-time", "60", "--log-every", "1"])
    job.wait_for(r"SCOUT-DEMO start ", timeout=90)
    wait_for(lambda: len(job.pids()) >= 5 and all(_asleep_in_the_step(p) for p in job.pids()), 60,
             "every rank asleep in its first step")
    rc, d = diagnose_json(job.pid, window=2.0)
    assert rc == 1, d
    assert [(i["kind"], i["status"], i["ranks"]) for i in d["incidents"]] == [(HANG, INCONCLUSIVE, [])], d
    assert "too short" in d["incidents"][0]["summary"]


def test_a_window_takes_a_dozen_stack_samples_on_a_schedule():
    from scout_sys.model import Job, Rank
    from scout_sys.monitor import Monitor, stack_interval_for
    from scout_sys.probes.jitter import Jitter

    assert stack_interval_for(3.0) == 0.25 and stack_interval_for(6.0) == 0.5 and stack_interval_for(30) == 0.5
    now = [100.0]
    m = Monitor(Job(ranks=(Rank(rank=0, pid=1, host="h"),), world_size=1, launcher="torchrun", launcher_pid=1,
                    host="h"), clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s),
                jitter=Jitter(seed=0))
    dumps, procs = [], []

    def dump(*_a, **_k):
        dumps.append(now[0])
        now[0] += 0.06  # py-spy's own time: the schedule does not slip by it
        return []

    m.stacks.dump = dump  # type: ignore[method-assign]
    m.procfs.sample = lambda t: procs.append(t) or []  # type: ignore[method-assign]
    m._started = [m.procfs, m.stacks]
    m.collect(3.0)
    assert len(dumps) == 13, dumps  # one in each 0.25 s slot of the window, at a random point of it, and the end
    assert [int((t - 100.0) // 0.25) for t in dumps[:-1]] == list(range(12)), dumps
    assert len({round((t - 100.0) % 0.25, 3) for t in dumps[:-1]}) > 6, dumps  # not on a grid
    assert len(procs) >= 12
