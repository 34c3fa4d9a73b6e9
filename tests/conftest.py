"""Shared fixtures. Every job a test starts is killed when the test ends, pass or fail, by pid and
process group (DemoJob.stop), never by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from scout_sys.demo.launch import DemoJob

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = os.path.join(REPO, "tests", "jobs")


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
