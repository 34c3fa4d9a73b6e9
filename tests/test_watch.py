"""watch against real jobs: hang onset, stragglers (extra compute, CPU quota), healthy jobs with and
without periodic checkpoint pauses, elastic restarts, SIGTERM. Jobs are killed at teardown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from scout_sys.demo.launch import free_port
from scout_sys.model import ATTRIBUTED, HANG, STRAGGLER
from scout_sys.watch import WatchConfig, Watcher
from scout_sys.watch.hang import MIN_STALL_AFTER
from tests._host import ebpf_reason

pytestmark = pytest.mark.slow


class WatchCli:
    """``scout-sys watch --headless --json`` in a subprocess; events collected by a reader thread.
    ``human=True``: without --json, the printed lines in ``lines``."""

    def __init__(self, job_pid: int, *args: str, human: bool = False, scout: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        scout = scout or [sys.executable, "-m", "scout_sys"]  # or an installed scout-sys (test_package)
        self.proc = subprocess.Popen([*scout, "watch", "--job", str(job_pid),
                                      "--headless", *([] if human else ["--json"]), *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.human = human
        self.events: list[dict] = []
        self.lines: list[str] = []
        self.errors: list[str] = []  # stderr, read as it comes: a full pipe would stall the watch
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()
        self._te = threading.Thread(target=self._read_errors, daemon=True)
        self._te.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if not self.human:
                try:
                    self.events.append(json.loads(line))
                except ValueError:
                    self.errors.append(f"(not JSON on stdout) {line}")

    def _read_errors(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.errors.append(line)

    def stderr(self) -> str:
        """What the watch wrote on stderr so far (all of it once it has exited)."""
        if self.proc.poll() is not None:
            self._te.join(10)
        return "".join(self.errors)

    def wait_event(self, pred, timeout: float) -> dict:
        """The first event (human: printed line) for which ``pred`` holds."""
        end = time.time() + timeout
        while time.time() < end:
            for e in list(self.lines if self.human else self.events):
                if pred(e):
                    return e
            if self.proc.poll() is not None and not self._t.is_alive():
                break
            time.sleep(0.2)
        got = "".join(self.lines[-40:]) if self.human else self.events
        raise AssertionError(f"no such event in {timeout}s; got {got}; "
                             f"{'exited ' + str(self.proc.returncode) if self.proc.poll() is not None else 'running'}; "
                             f"stderr: {''.join(self.errors[-40:])}")

    def opened(self) -> list[tuple[str, str, list[int]]]:
        """(kind, status, ranks) of every incident the watch opened so far: a test that names one
        checks that no other was opened beside it."""
        return [(e["incident"]["kind"], e["incident"]["status"], e["incident"]["ranks"])
                for e in list(self.events) if e.get("event") == "incident_opened"]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            # where it is stuck, for the failure's reader: every thread's stack, as py-spy sees it
            from scout_sys.probes.pystack import find_py_spy

            dump = subprocess.run([find_py_spy() or "py-spy", "dump", "--pid", str(self.proc.pid)], capture_output=True, text=True,
                                  timeout=30, check=False)
            raise AssertionError(f"the watch did not exit within 30 s of SIGTERM; its stacks:\n{dump.stdout}"
                                 f"{dump.stderr}\nits stderr: {''.join(self.errors[-40:])}") from None
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@pytest.fixture
def watch_cli():
    started: list[WatchCli] = []

    def _start(pid: int, *args: str) -> WatchCli:
        w = WatchCli(pid, *args)
        started.append(w)
        return w

    yield _start
    for w in started:
        w.stop()


def _poll_until(w: Watcher, pred, timeout: float, interval: float = 0.5) -> list:
    seen = []
    end = time.time() + timeout
    while time.time() < end:
        evs = w.poll()
        seen += evs
        if any(pred(e) for e in evs):
            return seen
        time.sleep(interval)
    raise AssertionError(f"not within {timeout}s: {[(e.event, e.incident.kind, e.incident.ranks) for e in seen]}")


def test_hang_during_watch_opens_with_the_origin_and_keeps_its_evidence(start_job, watch_cli, tmp_path):
    job = start_job(4, fault="hang", fault_rank=2, fault_step=60)
    job.wait_steps(2)
    w = watch_cli(job.pid, "--state-dir", str(tmp_path))  # the default: stall-after adapts to the job
    job.wait_fault()
    e = w.wait_event(lambda e: e["event"] == "incident_opened" and e["incident"]["kind"] == HANG, timeout=90)
    assert e["incident"]["status"] == ATTRIBUTED and e["incident"]["ranks"] == [2], e
    trigger = [v for v in e["incident"]["evidence"] if "trigger" in v]
    assert trigger and trigger[0]["stall_after"] >= MIN_STALL_AFTER, e["incident"]["evidence"]
    assert [(x["event"], x["incident"]["kind"]) for x in w.events] == [("incident_opened", HANG)], w.events
    bundle = e["bundle"]
    assert bundle.startswith(str(tmp_path)) and os.path.isdir(bundle)
    # the job is killed (as a launcher or watchdog would): the evidence stays, the watch ends with 1
    job.stop()
    assert w.proc.wait(timeout=30) == 1
    for name in ("diagnosis.json", "procfs.json", "observations.json"):
        assert os.path.getsize(os.path.join(bundle, name)) > 0, name
    diag = json.load(open(os.path.join(bundle, "diagnosis.json")))
    assert diag["incident"]["ranks"] == [2]
    assert any("load_next_batch_stuck" in f for e in diag["incident"]["evidence"] for f in e.get("stack", []))


def test_straggler_extra_compute(start_job, tmp_path):
    job = start_job(4, fault="slow", fault_rank=1, fault_step=20, args=["--slow-factor", "4"])
    job.wait_steps(2)
    # without eBPF: the busy share names it, and no 10-50 s of probe compiles load the shared cores; the
    # default path (eBPF's arrival lag included) is test_straggler_e2e.py's: watch at its defaults on a
    # tensor-parallel compute straggler and on a throttled one
    with Watcher(str(job.pid), config=WatchConfig(state_dir=str(tmp_path), ebpf=False)) as w:
        job.wait_fault()
        evs = _poll_until(w, lambda e: e.event == "incident_opened" and e.incident.kind == STRAGGLER, timeout=60)
    opened = [e.incident for e in evs if e.event == "incident_opened"]
    assert [(i.kind, i.ranks) for i in opened] == [(STRAGGLER, (1,))]
    assert "straggler" in opened[0].summary and opened[0].evidence


@pytest.mark.serial  # load-sensitive: run alone (see tests/README.md)
def test_healthy_job_with_checkpoint_pauses_and_evaluations_watched_for_40_s_opens_nothing(start_job, watch_cli,
                                                                                           tmp_path):
    # at the defaults, as a user starts it (the CLI, no flag): rank 0 writes a checkpoint for ~2.5 s every
    # 40 steps while the others wait at a barrier (the floor suspects 1.5 s stretches: the windows must see
    # the writer progress), every rank evaluates for 2 s every 70 steps (no collective anywhere, every rank
    # computing in one place, then one all-reduce), and steps quickly in between; 40 s of it (about 8
    # checkpoint pauses, 4 evaluations) opens no incident at all, attributed or inconclusive (as diagnose's
    # twin requires) (and keeps each step's checkpoint in a folder of its own, as a job does: the watch
    # reports those)
    (tmp_path / "ckpt").mkdir()
    job = start_job(4, args=["--checkpoint-every", "40", "--checkpoint-seconds", "2.5",
                             "--checkpoint-dir", str(tmp_path / "ckpt"), "--eval-every", "70", "--eval-seconds", "2"])
    job.wait_steps(2)
    w = watch_cli(job.pid, "--state-dir", str(tmp_path / "state"))
    time.sleep(40)
    assert w.proc.poll() is None, w.stderr()
    assert job.log().count("SCOUT-DEMO checkpoint") >= 4
    assert job.log().count("SCOUT-DEMO eval") >= 2
    # the checkpoints it writes are news of their own (checkpoint_written, coverage by default): nothing else
    assert [e for e in w.events if e["event"] != "checkpoint_written"] == [], w.events
    assert any(e["event"] == "checkpoint_written" for e in w.events), w.events
    assert w.stop() == 0


@pytest.mark.serial  # load-sensitive (a start-up that must stay quiet): run alone (see tests/README.md)
def test_at_the_defaults_a_hang_after_a_slow_start_up_is_named_at_the_steps_threshold(start_job, watch_cli,
                                                                                       tmp_path):
    # every rank prepares its data for 6 s (asleep) before 20 ms steps; rank 2 hangs ~3 s into training.
    # The old default learned the start-up and waited four times it; now the recent steady gap counts:
    # the threshold the hang was suspected at is the steps' (the floor), not one the 6 s start-up taught.
    # How soon that is, in seconds, is benchmarks/watch_defaults.py's (the "startup" job): no speed here.
    job = start_job(4, fault="hang", fault_rank=2, fault_step=150,
                    args=["--startup-seconds", "6", "--step-time", "0.02", "--log-every", "50"])
    w = watch_cli(job.pid, "--state-dir", str(tmp_path), "--no-replay")  # no --stall-after: the defaults
    job.wait_fault(timeout=120)
    e = w.wait_event(lambda e: e["event"] == "incident_opened" and e["incident"]["ranks"] == [2], timeout=60)
    trigger = [v for v in e["incident"]["evidence"] if "trigger" in v]
    assert trigger and trigger[0]["stall_after"] < 6.0, e["incident"]["evidence"]
    assert e["incident"]["kind"] == HANG and e["incident"]["status"] == ATTRIBUTED
    assert w.opened() == [(HANG, ATTRIBUTED, [2])], w.events  # nothing before it, during the start-up


def test_elastic_restart_is_followed(start_job, tmp_path):
    job = start_job(4, fault="exit", fault_rank=1, fault_step=30, args=["--fault-once"],
                    torchrun_args=["--max-restarts", "1"])
    job.wait_steps(2)
    with Watcher(str(job.pid), config=WatchConfig(ebpf=False, state_dir=str(tmp_path))) as w:
        before = {r.pid for r in w.job.ranks}
        end = time.time() + 60
        while time.time() < end:
            w.poll()
            now = {r.pid for r in w.job.ranks}
            if now and not (now & before) and len(now) == 4:
                break
            time.sleep(0.5)
        assert w.job is not None and len(w.job.ranks) == 4
        assert not ({r.pid for r in w.job.ranks} & before), "still following the old processes"
        assert not w.ended
        assert any("restarted" in n for n in w.snapshot.notes)
        # the new incarnation trains: the watcher sees it progress (however long a loaded machine takes
        # to bring its ranks up: this bounds no speed)
        end = time.time() + 60
        while time.time() < end and not {v.state for v in w.snapshot.views.values()} - {"exited"}:
            w.poll()
            time.sleep(0.5)
        assert {v.state for v in w.snapshot.views.values()} - {"exited"}, (w.snapshot.views, job.log()[-2000:])
        assert not w.ended


@pytest.mark.ebpf
@pytest.mark.skipif(ebpf_reason() is not None, reason=f"{ebpf_reason()}")
def test_sigterm_stops_watch_cleanly(start_job, watch_cli, tmp_path):
    """SIGTERM once the eBPF probes are attached (the metrics say so): the watch detaches and exits 0
    (stop() kills it after 30 s: an exit status of -9 would be a watch that never ended)."""
    from tests.test_exporters_e2e import _get, _scrape

    job = start_job(4)
    job.wait_steps(2)
    port = free_port()
    w = watch_cli(job.pid, "--state-dir", str(tmp_path), "--prometheus", f"127.0.0.1:{port}")
    def up(m: dict) -> list[list[float]]:
        return [_get(m, "scout_sys_probe_up", probe=p) for p in ("ebpf-collectives", "ebpf-sched")]

    end = time.time() + 120
    while time.time() < end and up(_scrape(port, starting=True)) != [[1.0], [1.0]]:
        time.sleep(0.5)
    assert up(_scrape(port)) == [[1.0], [1.0]]
    assert w.stop() == 0


@pytest.mark.ebpf
@pytest.mark.skipif(ebpf_reason() is not None, reason=f"{ebpf_reason()}")
def test_first_rank_to_die_is_named_when_torchrun_kills_the_rest(start_job, tmp_path):
    job = start_job(4)
    job.wait_steps(2)
    with Watcher(str(job.pid), config=WatchConfig(state_dir=str(tmp_path))) as w:
        w.monitor.wait_started()
        assert w.monitor.probe_status.get("ebpf-sched") is None, w.monitor.probe_status
        w.poll()
        victim = w.job.by_rank()[2].pid
        os.kill(victim, signal.SIGKILL)  # torchrun then terminates ranks 0, 1 and 3
        evs = []
        end = time.time() + 40
        while time.time() < end and not w.ended:
            evs += w.poll()
            time.sleep(0.5)
        assert w.ended
    exits = [e.incident for e in evs if e.event == "incident_opened" and e.incident.kind == "process_exit"]
    assert exits and exits[0].ranks == (2,), [(e.event, e.incident.kind, e.incident.ranks) for e in evs]
    assert "SIGKILL" in exits[0].summary
    text = " ".join(ev.text for ev in exits[0].evidence)
    assert str(os.getpid()) in text  # the sender: this test
