"""What users run, through the real command line on real 4-rank jobs: `demo` with each fault (what
`make demo` runs), `diagnose -q / --native / --ebpf`, the PID,PID selector, `watch --headless`'s
human lines, its exit status when the job ends cleanly, and incidents opened then closed.
Jobs are tiny and killed at teardown (conftest.start_job); each demo stops its own job."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from scout_sys.job import find_job
from tests._host import ebpf_reason
from tests.conftest import REPO, origins
from tests.test_watch import WatchCli

pytestmark = pytest.mark.slow

DEMO_FAULTS = {"none": None, "hang": "hang", "stop": "process_stall", "busy": "hang", "exit": "process_exit",
               "desync": "collective_desync"}
DIAGNOSED_ELSEWHERE = ("stop", "busy", "desync")  # test_diagnose_e2e.py::test_torchrun_4_ranks_each_fault


def test_demo_with_each_fault_names_the_faulty_rank() -> None:
    """`scout-sys demo --fault F`, three at a time (each its own job and port): exit 0 when it named
    exactly the faulty rank (or, without a fault, nothing). Run for the faults whose demo path differs
    (none; exit, which slows torchrun's monitor; hang); stop, busy and desync go through the same
    DemoJob and Monitor as hang, and each is named by tests/test_diagnose_e2e.py's each-fault test."""
    from scout_sys.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "cmd").choices["demo"]
    choices = next(a for a in sub._actions if a.dest == "fault").choices
    assert set(choices) == set(DEMO_FAULTS), "a demo fault without a test here"
    results: dict[str, tuple[int, str, str]] = {}
    faults = ["none", "exit", "hang"]
    assert set(DIAGNOSED_ELSEWHERE) | set(faults) == set(DEMO_FAULTS)
    for i in range(0, len(faults), 3):
        procs = {f: subprocess.Popen([sys.executable, "-m", "scout_sys", "demo", "--fault", f, "--json"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
                 for f in faults[i:i + 3]}
        for f, p in procs.items():
            try:
                out, err = p.communicate(timeout=240)
            finally:
                if p.poll() is None:
                    p.send_signal(signal.SIGINT)  # the demo stops its job on the way out
                    p.wait(30)
            results[f] = (p.returncode, out, err)
    for f in faults:
        kind = DEMO_FAULTS[f]
        rc, out, err = results[f]
        assert rc == 0, (f, rc, out, err[-2000:])
        d = json.loads(out)
        want = [] if kind is None else [(kind, "attributed", [2])]
        assert origins(d) == want, (f, d["incidents"])
        assert f"fault {f!r} on rank 2" in err and "stopping the job" in err, err


def _perf_fds(pid: int) -> int:
    n = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                n += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[perf_event]"
            except OSError:
                pass
    except OSError:
        pass
    return n


def _wait_attached(pid: int, timeout: float = 120) -> int:
    """Until the process's perf event fds (one per uprobe / tracepoint) stopped growing for 1.5 s."""
    stable_since, last = time.time(), 0
    end = time.time() + timeout
    while time.time() < end:
        n = _perf_fds(pid)
        if n != last or n == 0:
            stable_since, last = time.time(), n
        elif time.time() - stable_since >= 1.5:
            break
        time.sleep(0.1)
    return last


@pytest.mark.ebpf
@pytest.mark.skipif(ebpf_reason() is not None, reason=f"{ebpf_reason()}")
def test_diagnose_ebpf_names_who_killed_a_rank(start_job) -> None:
    """`diagnose --ebpf` with the product's probes: once it says its window began (every probe
    attached), this test SIGKILLs rank 2 within the window; the exit probe names rank 2, the signal
    and this test as its sender. torchrun looks every 600 s, so the others stay and wait."""
    job = start_job(4, torchrun_args=["--monitor-interval", "600"])
    job.wait_steps(2)
    victim = find_job(str(job.pid)).by_rank()[2].pid
    p = subprocess.Popen([sys.executable, "-m", "scout_sys", "diagnose", "--job", str(job.pid), "--ebpf",
                          "--window", "8", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = p.stderr.readline()  # type: ignore[union-attr]
        assert ready.startswith("scout-sys: probes ready; sampling 4 ranks for 8 s"), ready
        assert _perf_fds(p.pid) > 0 and p.poll() is None, "diagnose --ebpf attached nothing"
        os.kill(victim, signal.SIGKILL)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    d = json.loads(out)
    assert (d["probes"]["ebpf-collectives"], d["probes"]["ebpf-sched"]) == ("on", "on"), d["probes"]
    assert p.returncode == 1 and origins(d) == [("process_exit", "attributed", [2])], d["incidents"]
    ebpf = [e for e in d["incidents"][0]["evidence"] if e["source"] == "ebpf" and e.get("rank") == 2]
    assert ebpf and ebpf[0]["signal"] == "SIGKILL" and ebpf[0]["sender_pid"] == os.getpid(), ebpf
    # the answer came before the kernel unregistered the uprobes: a child of diagnose (its own session)
    # detaches them after it exits, and is gone once done, leaving no probe behind
    end = time.time() + 60
    while (left := _same_cmdline(p.args)) and time.time() < end:
        time.sleep(0.2)
    assert left == [], f"diagnose's detaching child {left} still runs 60 s after the answer"


def _same_cmdline(args: list[str]) -> list[int]:
    """The processes running exactly ``args`` (a forked child keeps its parent's command line)."""
    want = "\0".join(args).encode() + b"\0"
    found = []
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and open(f"/proc/{name}/cmdline", "rb").read() == want:
                found.append(int(name))
        except OSError:
            pass
    return found


def wait_line(w: WatchCli, pattern: str, timeout: float) -> re.Match[str]:
    """The first printed line of the human watch ``w`` that matches ``pattern``."""
    line = w.wait_event(lambda x: re.search(pattern, x) is not None, timeout)
    return re.search(pattern, line)  # type: ignore[return-value]


@pytest.fixture
def human_watch():
    started: list[WatchCli] = []

    def _start(pid: int, *args: str) -> WatchCli:
        started.append(WatchCli(pid, *args, human=True))
        return started[-1]

    yield _start
    for w in started:
        w.stop()


def test_watch_of_a_job_that_ends_cleanly_exits_0(start_job, human_watch, tmp_path) -> None:
    job = start_job(4, args=["--steps", "120"])
    job.wait_steps(2)
    w = human_watch(job.pid, "--state-dir", str(tmp_path))
    rc = w.proc.wait(timeout=180)
    w._t.join(10)
    assert "SCOUT-DEMO done steps=120" in job.log()  # the job ran to its end
    assert rc == 0, (w.lines, w.stderr())
    assert re.fullmatch(rf"watching 4 ranks \(4 on \S+\), launcher torchrun pid {job.pid}; Ctrl-C to stop\n",
                        w.lines[0]), w.lines
    assert w.lines[1:] == ["job ended\n"], w.lines


@pytest.mark.ebpf
@pytest.mark.skipif(ebpf_reason() is not None, reason=f"{ebpf_reason()}")
def test_watch_opens_updates_and_closes_incidents_in_human_lines_and_events(start_job, human_watch,
                                                                           tmp_path) -> None:
    """One job, as a person would meet it: rank 1 stops itself (SIGSTOP) once the watch runs and this
    test resumes it (SIGCONT): its incident opens, then closes once the rank steps again. Then this
    test SIGKILLs rank 3 (torchrun looks every 600 s, so the others wait): the exit probe opens the
    incident at once, and the stack window that follows adds its own evidence (updated)."""
    go = tmp_path / "go"
    job = start_job(4, fault="stop", fault_rank=1, fault_step=10, args=["--fault-when", str(go)],
                    torchrun_args=["--monitor-interval", "600"])
    job.wait_steps(2)
    events = tmp_path / "events.jsonl"
    w = human_watch(job.pid, "--state-dir", str(tmp_path / "state"), "--events", str(events))
    wait_line(w, r"^watching 4 ranks", 60)
    assert _wait_attached(w.proc.pid) > 0, "the watch attached no eBPF probe"
    go.touch()
    stopped = job.wait_fault()
    m = wait_line(w, r"^\d\d:\d\d:\d\d OPENED (inc-\d+) process_stall \(attributed\) rank 1: ", 60)
    stall_id = m.group(1)
    wait_line(w, r"^  evidence saved to /", 10)
    os.kill(stopped, signal.SIGCONT)
    wait_line(w, rf"^\d\d:\d\d:\d\d CLOSED {stall_id} process_stall \(attributed\) rank 1: ", 60)
    job.wait_steps(2)  # it trains again
    os.kill(find_job(str(job.pid)).by_rank()[3].pid, signal.SIGKILL)
    m = wait_line(w, r"^\d\d:\d\d:\d\d OPENED (inc-\d+) process_exit \(attributed\) rank 3: .*SIGKILL", 60)
    exit_id = m.group(1)
    wait_line(w, rf"^\d\d:\d\d:\d\d UPDATED {exit_id} process_exit \(attributed\) rank 3: ", 60)
    assert w.proc.poll() is None, "the watch ended with the job still there"
    assert w.stop() == 1  # incidents were opened
    seen = [(e["event"], e["incident"]["id"], e["incident"]["kind"], e["incident"]["ranks"])
            for e in map(json.loads, events.read_text().splitlines())]
    assert seen[:2] == [("incident_opened", stall_id, "process_stall", [1]),
                        ("incident_closed", stall_id, "process_stall", [1])], seen
    assert seen[2] == ("incident_opened", exit_id, "process_exit", [3]), seen
    assert {(e, i) for e, i, _, _ in seen[3:]} == {("incident_updated", exit_id)}, seen  # nothing else
