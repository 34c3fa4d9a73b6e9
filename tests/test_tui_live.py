"""The dashboard on real demo jobs: a Pilot test over the real Watcher, and the real command
``scout-sys watch --job PID`` driven in tmux (send-keys / capture-pane). Jobs are killed at teardown
(conftest ``start_job``); the tmux server runs on its own socket and is killed by it."""

from __future__ import annotations

import asyncio
import glob
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

import pytest

from scout_sys.tui.app import make_app
from scout_sys.tui.widgets import HeaderBar, RankGrid, StackTree, TextScreen
from scout_sys.watch import WatchConfig, Watcher

pytestmark = pytest.mark.slow

STALL_AFTER = 5.0
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pilot_on_a_real_hang(start_job: Any, tmp_path: Any) -> None:
    job = start_job(4, fault="hang", fault_rank=2)
    job.wait_steps(1, timeout=120)
    w = Watcher(str(job.pid), config=WatchConfig(interval=0.5, stall_after=STALL_AFTER, state_dir=str(tmp_path),
                                             ebpf=False))
    w.start()
    try:
        asyncio.run(_drive(job, w, tmp_path))
    finally:
        w.close()


async def _drive(job: Any, w: Watcher, tmp_path: Any) -> None:
    app = make_app(w, save_dir=str(tmp_path))
    async with app.run_test(size=(140, 44)) as pilot:
        await pilot.pause(1.0)
        assert app.snapshot is not None and len(app.snapshot.job.ranks) == 4
        fault_at = time.time()
        await asyncio.to_thread(job.wait_fault, 120)
        fault_at = time.time()
        end = fault_at + STALL_AFTER + 25
        grid = app.query_one(RankGrid)
        while time.time() < end:
            cells = {c.rank: c.category for _, cs in grid._hosts for c in cs}
            if cells.get(2) == "suspect":
                break
            await pilot.pause(0.25)
        took = time.time() - fault_at
        cells = {c.rank: c.category for _, cs in grid._hosts for c in cs}
        assert cells.get(2) == "suspect", (cells, app.snapshot.incidents, app._error)
        print(f"culprit highlighted {took:.1f} s after the fault (stall-after {STALL_AFTER:g} s)")
        assert {cells[r] for r in (0, 1, 3)} <= {"waiting", "stalled", "progressing"}
        assert "INCIDENT hang rank 2" in str(app.query_one(HeaderBar).render())
        assert app.selected == 2
        # the culprit's stack beside the majority's
        await pilot.pause(0.5)
        groups = {n.data[2]: n for n in app.query_one(StackTree).root.children if n.data}
        assert (2,) in groups, list(groups)
        # s: a report, reopenable
        await pilot.press("s")
        for _ in range(40):
            if app.last_saved:
                break
            await pilot.pause(0.1)
        assert app.last_saved is not None
        doc = json.load(open(app.last_saved[0]))
        assert any(i["kind"] == "hang" and i["ranks"] == [2] for i in doc["incidents"])
        # enter: the culprit's details; d: a fresh diagnosis (a worker; the UI keeps drawing)
        await pilot.press("enter")
        await pilot.pause(0.3)
        assert isinstance(app.screen, TextScreen) and app.screen._title == "rank 2"
        await pilot.press("escape")
        await pilot.press("d")
        for _ in range(100):
            if app.last_diagnosis is not None:
                break
            await pilot.pause(0.1)
        assert app.last_diagnosis is not None
        assert {r for i in app.last_diagnosis.incidents for r in i.ranks} == {2}
        await pilot.press("escape", "q")
    assert app.return_value == 1


def _tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, check=False,
                          timeout=20).stdout


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_watch_command_in_tmux(start_job: Any, tmp_path: Any) -> None:
    go = tmp_path / "go"  # the fault waits for the healthy screen: a slow start must not miss it
    job = start_job(4, fault="hang", fault_rank=2, args=["--fault-when", str(go)])
    job.wait_steps(1, timeout=120)
    sock = f"scout-test-{os.getpid()}"
    rc_file = tmp_path / "rc"
    cmd = (f"cd {REPO} && {sys.executable} -m scout_sys watch --job {job.pid} --stall-after {STALL_AFTER:g} "
           f"--state-dir {tmp_path} --no-ebpf; echo $? > {rc_file}")
    env = dict(os.environ, TERM="xterm-256color")
    subprocess.run(["tmux", "-L", sock, "new-session", "-d", "-s", "w", "-x", "150", "-y", "45", cmd],
                   check=True, env=env, timeout=20)
    try:
        screen = _wait_screen(sock, "HEALTHY", 60)
        assert "4 ranks" in screen
        go.touch()
        job.wait_fault(timeout=120)
        screen = _wait_screen(sock, "INCIDENT hang rank 2", STALL_AFTER + 30)
        assert "suspect" in screen and "OPEN hang" in screen
        os.chdir(tmp_path)  # nothing of ours lands in the repo even if the save dir were cwd
        _tmux(sock, "send-keys", "-t", "w", "s")
        end = time.time() + 15
        while time.time() < end and not glob.glob(str(tmp_path / "scout-report-*.md")):
            time.sleep(0.2)
        reports = glob.glob(str(tmp_path / "scout-report-*.json"))
        assert reports, _tmux(sock, "capture-pane", "-p", "-t", "w")
        _tmux(sock, "send-keys", "-t", "w", "?")
        _wait_screen(sock, "diagnose now (samples", 10)
        _tmux(sock, "send-keys", "-t", "w", "Escape")
        time.sleep(1.0)  # a lone ESC: not the start of an escape sequence (alt+q)
        _wait_gone(sock, "diagnose now (samples", 10)
        _tmux(sock, "send-keys", "-t", "w", "q")
        end = time.time() + 30
        while time.time() < end and not rc_file.exists():
            time.sleep(0.2)
        assert rc_file.exists(), _tmux(sock, "capture-pane", "-p", "-t", "w")
        assert rc_file.read_text().strip() == "1"
    finally:
        os.chdir(REPO)
        _tmux(sock, "kill-server")


def _wait_screen(sock: str, text: str, timeout: float) -> str:
    end = time.time() + timeout
    screen = ""
    while time.time() < end:
        screen = _tmux(sock, "capture-pane", "-p", "-t", "w")
        if text in screen:
            return screen
        time.sleep(0.3)
    raise AssertionError(f"{text!r} not on screen within {timeout:g} s:\n{screen}")


def _wait_gone(sock: str, text: str, timeout: float) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if text not in _tmux(sock, "capture-pane", "-p", "-t", "w"):
            return
        time.sleep(0.3)
    raise AssertionError(f"{text!r} still on screen after {timeout:g} s")
