"""The package as a cluster operator installs it: the wheel, built from this tree, in a fresh venv
without torch (no Makefile, no setup-ebpf.sh shim), against real jobs.

One venv per module, built under pytest's tmp dir: the wheel (pip wheel --no-deps) and its
dependencies at the versions of requirements.txt (pip's cache / the local index: a few seconds)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from scout_sys.probes.ebpf import distro
from scout_sys.probes.ebpf.distro import find_system_bcc
from tests._ebpf_jobs import ROOT, ebpf_skip_reason
from tests.conftest import origins, settle
from tests.test_watch import WatchCli

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("package")]


class Installed:
    def __init__(self, venv: Path, wheel: Path, work: Path) -> None:
        self.venv, self.wheel, self.work = venv, wheel, work
        self.exe = str(venv / "bin" / "scout-sys")
        # Nothing of this tree: no PYTHONPATH (the suite's own points here), run from elsewhere.
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.exe, *args], capture_output=True, text=True, env=self.env, cwd=self.work,
                              timeout=timeout, check=False)


@pytest.fixture(scope="module")
def pkg(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("package")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # else pip finds this tree's scout_sys
    src = base / "src"  # a clean copy: setuptools would reuse a stale build/ of the tree
    shutil.copytree(ROOT / "scout_sys", src / "scout_sys", ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src / f)
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(base / "dist"), str(src)], check=True, capture_output=True, timeout=300, env=env, cwd=base)
    wheel = next((base / "dist").glob("scout_sys-*.whl"))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300, env=env, cwd=base)
    p = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                        "-c", str(ROOT / "requirements.txt"), str(wheel)], capture_output=True, text=True,
                       timeout=600, check=False, env=env, cwd=base)
    assert p.returncode == 0 and (venv / "bin" / "scout-sys").exists(), p.stderr[-3000:]
    print(f"wheel built and installed in {time.monotonic() - t0:.1f} s")
    (base / "work").mkdir()
    return Installed(venv, wheel, base / "work")


def test_the_wheel_carries_the_bpf_sources_and_no_torch_comes_with_it(pkg: Installed) -> None:
    names = zipfile.ZipFile(pkg.wheel).namelist()
    for f in ("scout_sys/probes/ebpf/scout_common.bpf.h", "scout_sys/probes/ebpf/collectives.bpf.c",
              "scout_sys/tui/scout.tcss"):
        assert f in names
    assert not any(n.startswith("tests/") for n in names)
    p = subprocess.run([str(pkg.venv / "bin" / "python"), "-c",
                        "import importlib.util as u; print([m for m in ('torch', 'safetensors', 'bcc') if u.find_spec(m)])"],
                       capture_output=True, text=True, env=pkg.env, cwd=pkg.work, timeout=60, check=True)
    assert p.stdout.strip() == "[]", p.stdout  # bcc too: not on this venv's path, found by scout-sys


def test_its_advice_names_the_distro_packages_never_make(pkg: Installed) -> None:
    """A pip user has no Makefile: what doctor and the probes advise is the distro's install command."""
    code = "from scout_sys.probes.ebpf import distro; print(distro.source_checkout()); print(distro.setup_hint())"
    p = subprocess.run([str(pkg.venv / "bin" / "python"), "-c", code], capture_output=True, text=True, env=pkg.env,
                       cwd=pkg.work, timeout=60, check=True)
    checkout, hint = p.stdout.splitlines()
    assert checkout == "None" and "make" not in hint, hint
    assert hint.startswith(distro.install_command()) and hint.endswith("then `sudo scout-sys doctor`"), hint


@pytest.mark.parametrize(("args", "what", "extra"), [
    (["agent", "--job", "1", "--store", "127.0.0.1:1", "--nnodes", "1", "--node-rank", "0", "--token-file", "t"],
     "agent", "cluster"),
    (["diagnose", "--cluster", "127.0.0.1:1", "--token-file", "t"], "diagnose --cluster", "cluster"),
    (["watch", "--cluster", "127.0.0.1:1", "--token-file", "t", "--headless"], "watch --cluster", "cluster"),
    (["certify", "model.pt"], "certify", "replay"),
    (["demo"], "demo", "all"),
])
def test_a_verb_without_its_extra_says_what_to_install(pkg: Installed, args: list[str], what: str, extra: str) -> None:
    (pkg.work / "model.pt").write_bytes(b"PK")
    p = pkg.run(*args)
    want = f"scout-sys {what} needs torch: pip install 'scout-sys[{extra}]'\n"
    assert (p.returncode, p.stderr, p.stdout) == (2, want, ""), p.stderr


@pytest.mark.ebpf
@pytest.mark.skipif(ebpf_skip_reason() is not None, reason=f"{ebpf_skip_reason()}")
def test_doctor_finds_the_distro_bcc_by_itself(pkg: Installed) -> None:
    p = pkg.run("doctor")
    assert p.returncode == 0, p.stdout + p.stderr
    bcc = next(line for line in p.stdout.splitlines() if line.split()[1:2] == ["bcc"])
    assert bcc.startswith("OK") and f"{find_system_bcc()} (distro bcc, imported from the system's dist-packages)" in bcc
    assert f"{pkg.venv}/bin/py-spy" in p.stdout


@pytest.mark.ebpf
@pytest.mark.skipif(ebpf_skip_reason() is not None, reason=f"{ebpf_skip_reason()}")
def test_watch_and_diagnose_a_real_job(pkg: Installed, start_job, tmp_path: Path) -> None:
    """The installed monitor (no torch in its venv) on a real torchrun job: watch --headless, at its
    defaults (eBPF from the distro bcc, replay coverage on), opens the hang with its origin; diagnose --ebpf compiles and attaches the probes from the wheel's sources."""
    job = start_job(3, fault="hang", fault_rank=1, fault_step=20)
    job.wait_steps(2, timeout=120)
    w = WatchCli(job.pid, "--state-dir", str(tmp_path), scout=[pkg.exe], env=pkg.env)  # at its defaults: eBPF, coverage
    try:
        settle(job, job.wait_fault(timeout=120))
        e = w.wait_event(lambda e: e["event"] == "incident_opened", timeout=120)
        assert w.opened() == [("hang", "attributed", [1])], w.events
    finally:
        w.stop()
    assert w.proc.returncode is not None and "Traceback" not in w.stderr(), w.stderr()
    assert e["bundle"].startswith(str(tmp_path))
    p = pkg.run("diagnose", "--job", str(job.pid), "--window", "2.5", "--ebpf", "--json", timeout=180)
    assert p.returncode == 1, p.stdout + p.stderr
    d = json.loads(p.stdout)
    assert origins(d) == [("hang", "attributed", [1])], d["incidents"]
    assert (d["probes"]["ebpf-collectives"], d["probes"]["ebpf-sched"]) == ("on", "on"), d["probes"]
