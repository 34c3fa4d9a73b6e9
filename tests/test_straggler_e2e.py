"""Stragglers on real jobs, by both verbs: a rank held to ~12% of a CPU by a fresh cgroup's CFS quota
(every other rank waits for it each step) is named ``straggler`` with cause "throttled" and the
throttling numbers by ``diagnose`` and by ``watch``; a DDP rank doing 4x the work is a compute straggler
for ``diagnose``; the same job without either stays quiet in both verbs. The job is
tests/jobs/straggler_job.py (DDP over Gloo, a step of real compute, then sleep). Serial: the verdicts
depend on the machine's load and on cgroups."""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from tests._host import HOST_PREFIX
from tests.conftest import diagnose_json, scout
from tests.test_watch import WatchCli

pytestmark = [pytest.mark.slow, pytest.mark.serial]

JOB = os.path.join(os.path.dirname(__file__), "jobs", "straggler_job.py")
WORK = ["--work", "1400", "--step-time", "0.1"]  # ~30 ms of compute in a 100 ms step, per rank
V1 = "/sys/fs/cgroup/cpu"


def _start(start_job, *args: str):
    job = start_job(4, script=JOB, args=[*WORK, *args])
    job.wait_for(r"STRAGGLER-JOB step ", count=2)
    return job


def _rank_pid(job, rank: int) -> int:
    from scout_sys.job import find_job

    return find_job(str(job.pid)).by_rank()[rank].pid


class QuotaCgroup:
    """A fresh CPU cgroup with a CFS quota (v1 cpu controller, else v2 cpu.max); the pids moved in
    are moved back to the root before it is removed."""

    def __init__(self, quota_us: int, period_us: int = 100_000) -> None:
        name = f"scout-test-{os.getpid()}-{time.monotonic_ns()}"
        self.pids: list[int] = []
        if os.path.isfile(f"{V1}/cpu.cfs_quota_us"):
            self.root, self.dir = V1, f"{V1}/{name}"
            os.mkdir(self.dir)
            self._write("cpu.cfs_period_us", str(period_us))
            self._write("cpu.cfs_quota_us", str(quota_us))
        elif os.path.isfile("/sys/fs/cgroup/cgroup.controllers") and "cpu" in open(
                "/sys/fs/cgroup/cgroup.subtree_control").read().split():
            self.root, self.dir = "/sys/fs/cgroup", f"/sys/fs/cgroup/{name}"
            os.mkdir(self.dir)
            self._write("cpu.max", f"{quota_us} {period_us}")
        else:
            pytest.skip(f"{HOST_PREFIX}a cgroup CPU controller")

    def _write(self, name: str, value: str) -> None:
        with open(f"{self.dir}/{name}", "w") as f:
            f.write(value)

    def add(self, pid: int) -> None:
        self._write("cgroup.procs", str(pid))
        self.pids.append(pid)

    def nr_throttled(self) -> int:
        for line in open(f"{self.dir}/cpu.stat"):
            if line.startswith("nr_throttled "):
                return int(line.split()[1])
        return 0

    def remove(self) -> None:
        for pid in self.pids:
            try:
                with open(f"{self.root}/cgroup.procs", "w") as f:
                    f.write(str(pid))
            except OSError:
                pass  # gone already
        for _ in range(100):
            try:
                os.rmdir(self.dir)
                return
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"cgroup {self.dir} left behind")


@pytest.fixture
def quota_cgroup():
    made: list[QuotaCgroup] = []

    def _make(quota_us: int) -> QuotaCgroup:
        cg = QuotaCgroup(quota_us)
        made.append(cg)
        return cg

    yield _make
    for cg in made:
        cg.remove()


def _until(pred, timeout: float, what: str) -> None:
    end = time.time() + timeout
    while not pred():
        if time.time() > end:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        time.sleep(0.2)


def _stragglers(d: dict) -> list[dict]:
    return [i for i in d["incidents"] if i["kind"] == "straggler"]


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a cgroup needs root")
def test_rank_throttled_by_its_cgroup_quota_is_a_straggler_in_both_verbs(start_job, quota_cgroup, tmp_path):
    job = _start(start_job)
    victim = _rank_pid(job, 3)
    cg = quota_cgroup(12_000)  # 12% of one CPU: its ~30 ms steps take ~250 ms
    cg.add(victim)
    _until(lambda: cg.nr_throttled() >= 10, 30, "the quota throttles rank 3")
    rc, d = diagnose_json(job.pid, window=3)
    assert rc == 1, d
    assert [(i["kind"], i["status"], i["ranks"]) for i in d["incidents"]] == [("straggler", "attributed", [3])], d
    inc = d["incidents"][0]
    assert "cause: starved of CPU (throttled)" in inc["summary"]
    why = next(e for e in inc["evidence"] if e.get("cause"))
    assert why["cause"] == "throttled" and why["nr_throttled"] > 0 and why["throttled_s"] > 0.5, why
    assert abs(why["quota_cpus"] - 0.12) < 1e-6 and "periods" in why["text"], why

    w = WatchCli(job.pid, "--state-dir", str(tmp_path))
    try:
        ev = w.wait_event(lambda e: e.get("event") == "incident_opened", timeout=60)
        assert w.opened() == [("straggler", "attributed", [3])], w.events
        assert "throttled" in ev["incident"]["summary"], ev["incident"]
        assert any(e.get("cause") == "throttled" for e in ev["incident"]["evidence"]), ev["incident"]
    finally:
        w.stop()


def test_ddp_rank_doing_four_times_the_work_is_a_compute_straggler_in_diagnose(start_job):
    job = _start(start_job, "--slow-rank", "3", "--slow-factor", "4")
    # diagnose's default window (3 s): its 13 stack samples and the busy share agree (with 7 samples, one
    # every 0.5 s, the stack measure missed the straggler about one run in five)
    rc, d = diagnose_json(job.pid, window=3)
    assert rc == 1, d
    assert [(i["kind"], i["status"], i["ranks"]) for i in d["incidents"]] == [("straggler", "attributed", [3])], d
    inc = d["incidents"][0]
    assert "cause: compute" in inc["summary"], inc
    assert {e["source"] for e in inc["evidence"]} >= {"stack", "procfs"}, inc
    assert not any("possible straggler" in n for n in d["notes"])


def test_the_same_job_without_a_straggler_stays_quiet_in_both_verbs(start_job, tmp_path):
    job = _start(start_job)
    rc, d = diagnose_json(job.pid, window=3)
    assert rc == 0 and d["incidents"] == [], d
    w = WatchCli(job.pid, "--state-dir", str(tmp_path))
    try:
        time.sleep(22)  # four straggler windows: more than it takes to confirm one
        assert w.proc.poll() is None, w.stderr()
        assert w.opened() == [], w.events
    finally:
        w.stop()


# ---- a tensor-parallel straggler (issue 22): dp=2 x tp=2, no collective spans the four ranks

LAYOUTS = os.path.join(os.path.dirname(__file__), "jobs", "layouts.py")
# rank 3's extra ~130 ms of compute per step (a healthy step: ~60 ms): its peers wait about 70% of the time,
# well above diagnose's stack-sample bar (40%); with ~50 ms they waited ~45% and diagnose, in one of two runs,
# had the busy share alone (an inconclusive straggler)
TP_SLOW = ["--slow-work", "6000"]
# its own compute; on this shared 2-core machine, while the watch compiles its eBPF probes, that compute
# also waits for a CPU more than its peers' (which sleep): "starved of CPU (contended)", with the numbers
# (diagnose's summary says the label, its evidence the numbers; watch's summary says both)
LAG = re.compile(r"every collective waits (\d+) ms for it, about (\d+)% of a (\d+) ms step")
CAUSE = re.compile(r"; cause: (compute\b|starved of CPU \(contended\))")


@pytest.mark.parametrize("slow", [3, -1], ids=["rank3-slow", "healthy"])
def test_tensor_parallel_rank_slow_in_both_its_groups_is_a_straggler_in_both_verbs(start_job, tmp_path, slow):
    """Rank 3 of a DTensor dp=2 x tp=2 job (tests/jobs/layouts.py) does extra compute each step: its tp
    partner 2 waits for it in the tensor-parallel all-reduce, rank 1 in the data-parallel one, and rank 0
    for rank 2 in its data-parallel one — three slow groups, but only rank 3 is late in every group it
    belongs to, and only rank 3 never waits. Both verbs, at their defaults, name it a straggler with its
    cause (diagnose: stack samples and busy share; watch: busy share, then the eBPF arrival lag); the
    same job without the extra work stays quiet in both. The watch's lag is intersected over the job's
    sub-groups, told apart by their members (the probe numbers both tp groups alike by first use: issue
    22), and it is rank 3's lag behind its partners, less than a step (it once read "920% of a 10 ms step")."""
    job = start_job(4, script=LAYOUTS, args=["--layout", "tp", "--slow-rank", str(slow), *TP_SLOW])
    job.wait_for(r"LAYOUT step 10", timeout=150)
    out = scout("diagnose", "--job", str(job.pid), "--json", timeout=90)  # the defaults: a 3 s window, no eBPF
    d = json.loads(out.stdout)
    if slow < 0:
        assert (out.returncode, d["incidents"]) == (0, []), d
    else:
        assert out.returncode == 1, d
        assert [(i["kind"], i["status"], i["ranks"]) for i in d["incidents"]] == [("straggler", "attributed", [3])], \
            [(i["summary"], [e["text"] for e in i["evidence"]]) for i in d["incidents"]]
        assert CAUSE.search(d["incidents"][0]["summary"]), d["incidents"][0]
    w = WatchCli(job.pid, "--state-dir", str(tmp_path))
    try:
        if slow < 0:
            time.sleep(30)  # eBPF attached and four straggler windows: more than it takes to confirm one
            assert w.proc.poll() is None, w.stderr()
            assert w.opened() == [], w.events
            return
        ev = w.wait_event(lambda e: e.get("event") == "incident_opened", timeout=90)
        assert w.opened() == [("straggler", "attributed", [3])], w.events
        assert CAUSE.search(ev["incident"]["summary"]), ev["incident"]
        lag = w.wait_event(lambda e: e.get("event") in ("incident_opened", "incident_updated")
                           and LAG.search(e["incident"]["summary"]), timeout=60)["incident"]
        waits, pct, step = map(int, LAG.search(lag["summary"]).groups())
        assert 30 <= waits < step and pct < 100, lag["summary"]
        groups = next(e for e in lag["evidence"] if "groups" in e)  # Evidence.to_json: its data inline
        assert sorted(groups["members"].values()) == [[1, 3], [2, 3]], lag["evidence"]
    finally:
        w.stop()
