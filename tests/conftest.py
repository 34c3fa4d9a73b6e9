"""Shared fixtures. Every job a test starts is killed when the test ends, pass or fail, by pid and
process group (DemoJob.stop), never by name.

Under `make test` (which first set up every prerequisite, or stopped) a skipped eBPF or real-job
test (markers ``ebpf``, ``slow``) is a failure: a regression that wrongly finds eBPF unavailable must
not pass as a skip. ``SCOUT_SYS_ALLOW_SKIPS=1`` allows them on purpose; a skip for what no make
step provides (reason starting with ``tests._host.HOST_PREFIX``) is always allowed. See tests/README.md."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import psutil
import pytest

from scout_sys.demo.launch import DemoJob
from tests._host import HOST_PREFIX

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = os.path.join(REPO, "tests", "jobs")


# pytest-xdist's workers set COLUMNS=80 LINES=24 for their own output; every program a test starts
# (the dashboard in tmux, the human lines of watch) would take them for the terminal's size.
for _var in ("COLUMNS", "LINES"):
    os.environ.pop(_var, None)

STRICT_SKIPS = os.environ.get("SCOUT_SYS_STRICT_SKIPS") == "1" and os.environ.get("SCOUT_SYS_ALLOW_SKIPS") != "1"
GUARDED = ("ebpf", "slow")  # markers of the tests that must run where make set up their prerequisites


# torch 2.13 (the replay/cluster extras) has no wheel for Python < 3.10: there (make test's part on the
# oldest Python the monitor supports) a test module that imports torch or safetensors at its top is not
# collected at all; its tests need torch, which that part leaves out anyway (marker ``torch``).
_TOP_LEVEL_TORCH = re.compile(r"^(?:import|from) (?:torch|safetensors)\b", re.M)


def pytest_ignore_collect(collection_path, config: pytest.Config):
    if sys.version_info >= (3, 10) or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    return True if _TOP_LEVEL_TORCH.search(collection_path.read_text(errors="replace")) else None


def pytest_report_header(config: pytest.Config) -> str:
    if STRICT_SKIPS:
        return "skips of eBPF / real-job tests fail (make test; SCOUT_SYS_ALLOW_SKIPS=1 allows them)"
    return "skips allowed (not run by make test, or SCOUT_SYS_ALLOW_SKIPS=1)"


def skip_reason(rep: pytest.TestReport) -> str:
    text = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
    return text.removeprefix("Skipped: ")


def _refused(reason: str) -> str:
    return (f"skipped under `make test`, where make set up the prerequisites: {reason}\n"
            "fix the machine or the product; SCOUT_SYS_ALLOW_SKIPS=1 allows the skip on purpose")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    rep = outcome.get_result()
    if not (STRICT_SKIPS and rep.skipped) or hasattr(rep, "wasxfail"):
        return
    if not any(item.get_closest_marker(m) for m in GUARDED) or skip_reason(rep).startswith(HOST_PREFIX):
        return
    rep.outcome = "failed"
    rep.longrepr = _refused(skip_reason(rep))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """A whole module skipped while it is collected (a module-level ``pytest.skip`` or
    ``importorskip``) never reaches the hook above: under `make test` it fails too, whatever its
    markers, unless its reason is a host's."""
    outcome = yield
    rep = outcome.get_result()
    if STRICT_SKIPS and rep.skipped and not skip_reason(rep).startswith(HOST_PREFIX):
        rep.outcome = "failed"
        rep.longrepr = _refused(skip_reason(rep))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Every skip, with its reason, at the end of the run: an allowed skip is said, not hidden."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    terminalreporter.section(f"{len(skipped)} skipped (allowed: "
                             f"{'host lacks it' if STRICT_SKIPS else 'SCOUT_SYS_ALLOW_SKIPS=1 or plain pytest'})")
    for rep in skipped:
        terminalreporter.line(f"SKIPPED {rep.nodeid or rep.fspath}: {skip_reason(rep)}")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--dist loadgroup`` (make test's parallel part): a test marked ``xdist_group(name)`` gets
    ``@name`` at the end of its node id, the scope pytest-xdist's scheduler keeps on one worker.
    pytest-xdist 3.8 writes that id to ``item._nodeid``, which pytest 9 no longer reads (the id is
    ``item._id``): every group was split over both workers, each starting its own copy of the
    module's shared job. Here the id is set where pytest 9 reads it (a no-op where xdist's own works)."""
    if not getattr(config.option, "loadgroup", False):  # set on xdist's workers under --dist loadgroup
        return
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # an older pytest: xdist's own suffix works there
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            item._id = NodeId.parse(item.nodeid + suffix)


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


def job_with_go_file(tmp_path_factory, name: str, args, nproc: int = 4, **kw):
    """For a module-scoped fixture: a job for a healthy test and then its fault, which waits for a
    go-file (``args(go)`` → the job's arguments); stopped, and checked gone, at the module's end.
    Yields (job, go-file)."""
    go = tmp_path_factory.mktemp(name) / "go"
    job = DemoJob(nproc, args=args(go), **kw)
    job.start()
    try:
        yield job, go
    finally:
        job.stop()
        assert job.pids() == [], f"processes of the {name} job left behind"


def _rank_pids(job: DemoJob) -> list[int]:
    """The job's rank processes (and helpers they forked): its processes that carry RANK, and those
    of Lightning's launcher: the children that carry LOCAL_RANK only, and their parent (local rank 0)."""
    out = []
    for p in job.pids():
        try:
            with open(f"/proc/{p}/environ", "rb") as f:
                env = f.read().split(b"\0")
            if any(v.startswith(b"RANK=") for v in env):
                out.append(p)
            elif any(v.startswith(b"LOCAL_RANK=") for v in env) and any(v.startswith(b"NODE_RANK=") for v in env):
                out += [p, psutil.Process(p).ppid()]
        except (OSError, psutil.Error):
            continue
    return sorted(set(out))


def _main_ran_ns(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _main_frames(pid: int) -> str:
    """The function names on ``pid``'s main-thread stack (a real py-spy dump, never pausing it)."""
    from scout_sys.probes.pystack import find_py_spy

    out = subprocess.run([find_py_spy() or "py-spy", "dump", "--nonblocking", "--json", "--pid", str(pid)],
                         capture_output=True, text=True, timeout=30, check=False)
    try:
        threads = json.loads(out.stdout)
    except ValueError:
        return ""
    main = [t for t in threads if t.get("os_thread_id") == pid] or threads[:1]
    return " ".join(f.get("name", "") for t in main for f in t.get("frames", []))


ASLEEP_NS = 500_000  # main-thread CPU time over the quiet period of a rank that waits


def settle(job: DemoJob, *faulty: int, parked_in: str | None = None, quiet: float = 0.5,
           timeout: float = 60.0) -> None:
    """Until every rank but ``faulty`` (pids) sits where the fault leaves it: its main thread has
    hardly run for ``quiet`` seconds (the Gloo shape: asleep inside the collective; a healthy rank
    computes every 0.05 s; a forked helper that wakes to look at a clock is asleep), or, with ``parked_in`` (the GPU shape, where waiters spin), its main thread's
    stack holds that function in two dumps ``quiet`` apart. A condition, not a fixed sleep: on a
    loaded machine it waits as long as the ranks take."""
    end = time.time() + timeout
    while True:
        witnesses = [p for p in _rank_pids(job) if p not in faulty]
        ran = {p: _main_ran_ns(p) for p in witnesses}
        inside = {p: parked_in is not None and parked_in in _main_frames(p) for p in witnesses}
        time.sleep(quiet)
        parked = bool(witnesses) and all(
            (ran[p] is not None and (_main_ran_ns(p) or 0) - ran[p] < ASLEEP_NS) or (inside[p] and parked_in in _main_frames(p))
            for p in witnesses)
        if parked:
            return
        if time.time() > end:
            raise TimeoutError(f"the ranks {witnesses} did not settle within {timeout:g}s:\n{job.log()[-2000:]}")


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    """Until ``predicate()`` is true (its value is returned), polled every ``interval`` s: the condition a
    test means instead of a fixed sleep; an AssertionError that says ``what`` did not happen after
    ``timeout`` s (a bound generous enough for a loaded 2-core machine, never a speed asserted)."""
    end = time.time() + timeout
    while True:
        v = predicate()
        if v:
            return v
        if time.time() > end:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(interval)


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
