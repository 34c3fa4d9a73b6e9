"""Shared fixtures. Every job a test starts is killed when the test ends, pass or fail, by pid and
process group (DemoJob.stop), never by name.

Under `make test` (which first set up every prerequisite, or stopped) a skipped eBPF or real-job
test (markers ``ebpf``, ``slow``) is a failure: a regression that wrongly finds eBPF unavailable must
not pass as a skip. ``SCOUT_SYS_ALLOW_SKIPS=1`` allows them on purpose; a skip for what no make
step provides (reason starting with ``tests._host.HOST_PREFIX``) is always allowed. See tests/README.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from scout_sys.demo.launch import DemoJob
from tests._host import HOST_PREFIX

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = os.path.join(REPO, "tests", "jobs")


STRICT_SKIPS = os.environ.get("SCOUT_SYS_STRICT_SKIPS") == "1" and os.environ.get("SCOUT_SYS_ALLOW_SKIPS") != "1"
GUARDED = ("ebpf", "slow")  # markers of the tests that must run where make set up their prerequisites


def pytest_report_header(config: pytest.Config) -> str:
    if STRICT_SKIPS:
        return "skips of eBPF / real-job tests fail (make test; SCOUT_SYS_ALLOW_SKIPS=1 allows them)"
    return "skips allowed (not run by make test, or SCOUT_SYS_ALLOW_SKIPS=1)"


def skip_reason(rep: pytest.TestReport) -> str:
    text = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
    return text.removeprefix("Skipped: ")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    rep = outcome.get_result()
    if not (STRICT_SKIPS and rep.skipped) or hasattr(rep, "wasxfail"):
        return
    if not any(item.get_closest_marker(m) for m in GUARDED) or skip_reason(rep).startswith(HOST_PREFIX):
        return
    rep.outcome = "failed"
    rep.longrepr = (f"skipped under `make test`, where make set up the prerequisites: {skip_reason(rep)}\n"
                    "fix the machine or the product; SCOUT_SYS_ALLOW_SKIPS=1 allows the skip on purpose")


@pytest.fixture
def start_job():
    """``start_job(nproc, fault=..., ...)`` → a started DemoJob, stopped at teardown."""
    jobs: list[DemoJob] = []

    def _start(nproc: int = 4, **kw) -> DemoJob:
        job = DemoJob(nproc, **kw)
        jobs.append(job)
        return job.start()

    yield _start
    for j in jobs:
        j.stop()
    for j in jobs:
        assert j.pids() == [], f"processes of job {j.id} left behind"


def scout(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the real command line in a subprocess (as a user would)."""
    return subprocess.run([sys.executable, "-m", "scout_sys", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def diagnose_json(job_sel: str | int, window: float = 2.5) -> tuple[int, dict]:
    out = scout("diagnose", "--job", str(job_sel), "--window", str(window), "--json")
    assert out.stdout.strip(), out.stderr
    assert len(out.stdout.strip().splitlines()) == 1, "--json prints exactly one object"
    return out.returncode, json.loads(out.stdout)


def origins(d: dict) -> list[tuple[str, str, list[int]]]:
    return sorted((i["kind"], i["status"], i["ranks"]) for i in d["incidents"])
