"""The documented examples on a real job (slow): a watch started with the job writes its --pid-file;
logrotate, run on the stanza of docs/metrics.md, rotates --events and its postrotate line makes the
watch reopen it without stopping (nor does SIGHUP stop a watch without --events); the next event lands
in the fresh file, where the runbook's jq finds its bundle; the runbook's first command, run by bash as
written, saves the verdict (0600) that its jq lines read; the pid file goes at exit."""

from __future__ import annotations

import json
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scout_sys.model import (
    ATTRIBUTED,
    HANG,
)
from tests._docs import (
    ROOT,
    _diagnosis_jq_checks,
    _jq,
    _runbook_jq,
    _text,
    _tool,
)

T = 1_764_000_000.0


# ------------------------------------------------------------------ a real job (slow)


def _wait(pred, timeout: float, what: str):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout} s")


def _sigmask(pid: int, field: str) -> int:
    """A signal set of /proc/PID/status (SigPnd, ShdPnd, SigCgt, ...); 0 once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(ln.split()[1], 16) for ln in f if ln.startswith(field + ":")), 0)
    except OSError:
        return 0


def _catches(pid: int, sig: int) -> bool:
    return bool(_sigmask(pid, "SigCgt") & 1 << (sig - 1))


def _pending(pid: int, sig: int) -> bool:
    return bool((_sigmask(pid, "SigPnd") | _sigmask(pid, "ShdPnd")) & 1 << (sig - 1))


@pytest.mark.slow
def test_pid_file_logrotate_sighup_and_the_runbooks_first_command(start_job, tmp_path: Path) -> None:
    """A real watch started with a real job: --pid-file holds its pid; logrotate, run on the documented
    stanza, rotates --events and its postrotate line makes the watch reopen it without stopping, the next event lands in the fresh file
    and the runbook's jq finds its bundle; a watch without --events survives SIGHUP too; the runbook's
    first command saves the verdict (0600) that its jq lines read; the pid file goes at exit."""
    from tests.test_watch import WatchCli

    events = tmp_path / "log" / "llama-70b.jsonl"
    pidfile = tmp_path / "run" / "llama-70b.pid"
    job = start_job(4, fault="hang", fault_rank=2, fault_step=40)
    w = WatchCli(job.pid, "--no-ebpf", "--no-replay", "--state-dir", str(tmp_path / "state"), "--events", str(events),
                 "--pid-file", str(pidfile))
    bare = WatchCli(job.pid, "--no-ebpf", "--no-replay", "--state-dir", str(tmp_path / "state2"))
    try:
        _wait(lambda: pidfile.exists() and events.exists(), 60, "pid file and events file")
        assert pidfile.read_text().strip() == str(w.proc.pid)
        # logrotate itself, forced, on the stanza of docs/metrics.md as written but for the two paths
        stanza = re.search(r"^(/var/log/scout-sys/llama-70b\.jsonl \{\n.*?^\})", _text(ROOT / "docs" / "metrics.md"),
                           re.M | re.S).group(1)
        conf = tmp_path / "logrotate.conf"
        conf.write_text(stanza.replace("/var/log/scout-sys/llama-70b.jsonl", str(events))
                        .replace("/run/scout-sys/llama-70b.pid", str(pidfile)) + "\n")
        conf.chmod(0o644)
        r = subprocess.run([_tool("logrotate"), "-f", "-s", str(tmp_path / "logrotate.state"), str(conf)],
                           capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode == 0, r.stdout + r.stderr
        assert Path(str(events) + ".1").exists()  # rotated (delaycompress: the first one stays plain)
        _wait(events.exists, 5, "a fresh events file after SIGHUP")
        _wait(lambda: _catches(bare.proc.pid, signal.SIGHUP), 60, "the bare watch's SIGHUP handler")
        bare.proc.send_signal(signal.SIGHUP)
        # delivered (pending no more): a watch whose SIGHUP killed it would be gone by then
        _wait(lambda: not _pending(bare.proc.pid, signal.SIGHUP), 30, "SIGHUP delivered to the bare watch")
        assert w.proc.poll() is None and bare.proc.poll() is None, (w.stderr(), bare.stderr())
        job.wait_fault(timeout=120)
        e = w.wait_event(lambda e: e.get("event") == "incident_opened", timeout=90)
        assert e["bundle"], e
        lines = _wait(lambda: [json.loads(x) for x in events.read_text().splitlines()], 10, "the event in the file")
        assert lines[0] == e
        expr, raw = _runbook_jq("select(.bundle)")
        assert _jq(expr, events.read_text(), raw=raw)[-1:] == [e["bundle"]]
        # the runbook's first command, run by bash as written but for the pid and the file's folder (and a
        # shorter window); `sudo` and `scout-sys` stand for this process's user and interpreter
        cmd = re.search(r"^(sudo scout-sys diagnose --job PID --output /var/tmp/.*)$", _text(ROOT / "docs" / "runbook.md"),
                        re.M).group(1)
        folder = tmp_path / "tmp"
        line = cmd.replace("--job PID", f"--job {job.pid} --window 2").replace("/var/tmp/", f"{folder}/")
        r = subprocess.run(["bash", "-c", f'sudo() {{ "$@"; }}; scout-sys() {{ {sys.executable} -m scout_sys "$@"; }}; {line}'],
                           capture_output=True, text=True, timeout=120, check=False)
        assert r.returncode == 1, r.stdout + r.stderr
        saved = list(folder.glob("scout-*.json"))
        assert len(saved) == 1, (saved, r.stderr)
        out_file = saved[0]
        assert "INCIDENT hang (attributed): rank 2" in r.stdout and str(out_file) in r.stderr, r.stdout + r.stderr
        assert stat.S_IMODE(out_file.stat().st_mode) == 0o600
        d = json.loads(out_file.read_text())
        assert [(i["kind"], i["ranks"]) for i in d["incidents"]] == [(HANG, [2])]
        assert all("cpu_percent" in x for x in d["job"]["ranks"]), d["job"]["ranks"]
        _diagnosis_jq_checks(d)
    finally:
        bare.stop()
        assert w.stop() == 1  # an incident was opened
    assert not pidfile.exists()
    assert w.opened() == [(HANG, ATTRIBUTED, [2])]
