"""watch as users start it: in the same second as torchrun (before a rank exists), headless and in
the dashboard; GPU-shaped hangs with and without eBPF; a two-rank hang; a launcher that ends without
ranks; a healthy job that ends. Jobs are killed at teardown (conftest start_job)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from scout_sys.demo.launch import DemoJob, free_port
from scout_sys.model import ATTRIBUTED, COLLECTIVES, HANG, INCONCLUSIVE, MAIN_THREAD
from scout_sys.tui.app import make_app
from scout_sys.tui.widgets import HeaderBar, RankGrid
from scout_sys.watch import WAITING_TEXT, WatchConfig, Watcher
from tests.conftest import wait_for
from tests.test_exporters_e2e import _get, _scrape
from tests.test_watch import WatchCli

pytestmark = pytest.mark.slow


def _collectives_seen(metrics: dict, n: int) -> bool:
    """The watch's /metrics: the collective probe attached and a sequence number of every one of ``n`` ranks."""
    ranks = {dict(lbl).get("rank") for (name, lbl) in metrics if name == "scout_sys_rank_collective_seq"}
    return _get(metrics, "scout_sys_probe_up", probe="ebpf-collectives") == [1.0] and ranks >= {str(r) for r in range(n)}


def _watch(pid: int, *args: str) -> WatchCli:
    return WatchCli(pid, *args)


@pytest.mark.parametrize("ebpf", [False, True], ids=["no-ebpf", "ebpf"])
def test_watch_started_with_torchrun_names_a_gpu_shaped_hang(start_job, tmp_path, ebpf):
    go = tmp_path / "go"
    job = start_job(4, fault="hang", fault_rank=2, args=["--sync", "spin", "--fault-when", str(go)])
    port = free_port()
    w = _watch(job.pid, "--stall-after", "5", "--state-dir", str(tmp_path / "state"), "--prometheus",
               f"127.0.0.1:{port}", *([] if ebpf else ["--no-ebpf"]))
    try:
        if ebpf:  # the fault once the collective probe sees every rank: its signal is then the one that counts
            try:
                wait_for(lambda: _collectives_seen(_scrape(port, starting=True), 4), 180,
                         "the collective probe attached and seeing every rank")
            except AssertionError as e:  # say why: the probe's state and the watch's own lines
                m = _scrape(port, starting=True)
                raise AssertionError(f"{e}; probes: {sorted((dict(lbl)['probe'], v) for (n, lbl), v in m.items() if n == 'scout_sys_probe_up')}; "
                                     f"ranks with a sequence: {sorted({dict(lbl).get('rank') for (n, lbl) in m if n == 'scout_sys_rank_collective_seq'})}; "
                                     f"watch stderr: {w.stderr()[-3000:]}") from None
        else:
            job.wait_steps(2, timeout=180)
        go.touch()
        job.wait_fault(timeout=60)
        e = w.wait_event(lambda e: e["event"] == "incident_opened" and e["incident"]["kind"] == HANG, timeout=60)
        assert e["incident"]["status"] == ATTRIBUTED and e["incident"]["ranks"] == [2], e
        assert "wait_for_buckets" in e["incident"]["summary"]
        trigger = [ev for ev in e["incident"]["evidence"] if "trigger" in ev]
        # the spinners' main threads never stop: with eBPF their collective sequence numbers stand still
        # (every rank seen by the probe is judged by them alone); without it, their main threads stopped
        # blocking (their voluntary switches stand still, read every poll, from about the moment they
        # last blocked), which a stack sampled seconds apart at one place never outruns
        assert [t["trigger"] for t in trigger] == [COLLECTIVES if ebpf else MAIN_THREAD], e["incident"]["evidence"]
    finally:
        assert w.stop() == 1
    assert w.opened() == [(HANG, ATTRIBUTED, [2])], w.events
    assert WAITING_TEXT.rstrip("…") in w.stderr()  # it was started before any rank existed


def test_watch_opens_the_inconclusive_incident_of_a_two_rank_hang(start_job, tmp_path):
    # one rank asleep in a data loader, the other inside all_reduce: diagnose says inconclusive,
    # and the watch must say so too instead of staying silent
    job = start_job(2, fault="hang", fault_rank=0, fault_step=10)
    w = _watch(job.pid, "--stall-after", "5", "--state-dir", str(tmp_path), "--no-ebpf")
    try:
        job.wait_fault(timeout=180)
        e = w.wait_event(lambda e: e["event"] == "incident_opened", timeout=60)
        assert (e["incident"]["kind"], e["incident"]["status"]) == (HANG, INCONCLUSIVE), e
    finally:
        w.stop()
    assert w.opened() == [(HANG, INCONCLUSIVE, [])], w.events


def test_a_launcher_that_ends_before_starting_ranks_is_one_line_and_exit_2():
    launcher = subprocess.Popen(["sleep", "2"], start_new_session=True)
    try:
        out = subprocess.run([sys.executable, "-m", "scout_sys", "watch", "--job", str(launcher.pid), "--headless"],
                             capture_output=True, text=True, timeout=60)
    finally:
        launcher.kill()
        launcher.wait()
    assert out.returncode == 2, out
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("scout-sys: error:") and "ended without ever starting a rank" in lines[-1], out.stderr
    assert "Traceback" not in out.stderr


def test_wait_ranks_bounds_the_wait():
    launcher = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        t0 = time.time()
        out = subprocess.run([sys.executable, "-m", "scout_sys", "watch", "--job", str(launcher.pid), "--headless",
                              "--wait-ranks", "2"], capture_output=True, text=True, timeout=60)
    finally:
        launcher.kill()
        launcher.wait()
    assert out.returncode == 2 and "--wait-ranks" in out.stderr, out
    assert time.time() - t0 < 50  # it did not wait for the launcher's whole life


def test_healthy_job_started_with_the_watch_ends_with_exit_0(start_job, tmp_path):
    job = start_job(4, args=["--sync", "spin", "--steps", "120"])
    w = _watch(job.pid, "--state-dir", str(tmp_path), "--no-ebpf")
    assert w.proc.wait(timeout=240) == 0, (w.events, w.stderr())
    assert w.events == []  # and stdout held JSON lines only: the waiting message went to stderr
    assert "SCOUT-DEMO done" in job.log()
    assert "waiting for the job's ranks" in w.stderr()


def test_dashboard_started_before_the_ranks_shows_the_culprit(tmp_path):
    job = DemoJob(4, fault="hang", fault_rank=1, fault_step=30, args=["--sync", "wait"])
    job.start()
    try:
        w = Watcher(str(job.pid), config=WatchConfig(interval=0.5, stall_after=5.0, state_dir=str(tmp_path), ebpf=False))
        w.start()
        assert w.job is None and w.waiting  # torchrun has not forked yet
        try:
            asyncio.run(_drive(job, w))
        finally:
            w.close()
    finally:
        job.stop()


async def _drive(job: DemoJob, w: Watcher) -> None:
    app = make_app(w)
    async with app.run_test(size=(140, 44)) as pilot:
        await pilot.pause(0.2)
        assert "waiting for the job's ranks" in str(app.query_one(HeaderBar).render())
        await asyncio.to_thread(job.wait_fault, 180)
        grid = app.query_one(RankGrid)
        end = time.time() + 60
        while time.time() < end:
            cells = {c.rank: c.category for _, cs in grid._hosts for c in cs}
            if cells.get(1) == "suspect":
                break
            await pilot.pause(0.25)
        cells = {c.rank: c.category for _, cs in grid._hosts for c in cs}
        assert cells.get(1) == "suspect", (cells, app.snapshot and app.snapshot.incidents, app._error)
        assert len(app.snapshot.job.ranks) == 4
        assert "INCIDENT hang rank 1" in str(app.query_one(HeaderBar).render())
        await pilot.press("q")


def test_watch_of_an_env_selector_started_before_the_job_follows_it(start_job, tmp_path):
    # how a Slurm prolog or batch script starts it: before any process of the job step exists
    job_id = f"scout-test-{os.getpid()}-{time.monotonic_ns()}"
    w = WatchCli(f"env:SLURM_JOB_ID={job_id}", "--state-dir", str(tmp_path))  # at the defaults, as the prolog runs it
    try:
        time.sleep(3)
        assert w.proc.poll() is None, w.stderr()  # it waits: no exit 2 for a job that has no process yet
        waiting = [x for x in w.stderr().splitlines() if WAITING_TEXT.rstrip("…") in x]
        assert len(waiting) == 1 and f"SLURM_JOB_ID={job_id}" in waiting[0], w.stderr()
        job = start_job(4, fault="hang", fault_rank=2, fault_step=10, env={"SLURM_JOB_ID": job_id})
        job.wait_fault(timeout=180)
        e = w.wait_event(lambda e: e["event"] == "incident_opened" and e["incident"]["kind"] == HANG, timeout=90)
        assert e["incident"]["status"] == ATTRIBUTED and e["incident"]["ranks"] == [2], e
        assert w.opened() == [(HANG, ATTRIBUTED, [2])], w.events
        # the job is killed (SIGKILL: eBPF sees the kills, which may open process_exit): the watch ends
        # with it, with 1 (incidents were opened), instead of waiting for another job
        job.stop()
        assert w.proc.wait(timeout=60) == 1, w.stderr()
    finally:
        w.stop()
