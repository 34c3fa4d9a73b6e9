"""The distro's bcc, found at runtime (scout_sys/probes/ebpf/distro.py): only its `bcc` package is
imported, never the rest of the system's dist-packages; and the install advice per distro."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from scout_sys.probes.ebpf import distro
from tests._ebpf_jobs import ROOT


def _site(tmp_path: Path) -> Path:
    """A fake system dist-packages: a `bcc` package with a submodule, and a package beside it."""
    site = tmp_path / "dist-packages"
    (site / "bcc").mkdir(parents=True)
    (site / "bcc" / "__init__.py").write_text("from .libbcc import lib\nclass BPF:\n    pass\n")
    (site / "bcc" / "libbcc.py").write_text("lib = 'the fake libbcc'\n")
    (site / "neighbour").mkdir()
    (site / "neighbour" / "__init__.py").write_text("")
    return site


def _run(code: str, *, isolated: bool = False) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter. ``isolated``: without site (-S), so no .pth (the venv's
    bcc-only shim of setup-ebpf.sh) puts a bcc on the path: what a pip-installed venv sees."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), sysconfig.get_paths()["purelib"]]))
    cmd = [sys.executable, *(["-S"] if isolated else []), "-c", code]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60, check=False)


def test_only_the_bcc_package_is_imported(tmp_path: Path) -> None:
    site = _site(tmp_path)
    p = _run(f"""
import sys
from scout_sys.probes.ebpf.distro import find_system_bcc, import_package
pkg = find_system_bcc([{str(tmp_path / 'empty')!r}, {str(site)!r}])
assert pkg is not None and pkg.name == "bcc", pkg
bcc = import_package(pkg)
import bcc.libbcc
assert bcc.libbcc.lib == "the fake libbcc" and hasattr(bcc, "BPF")
assert bcc.__file__.startswith({str(site)!r}), bcc.__file__
assert not any(p.startswith({str(site)!r}) for p in sys.path), sys.path
try:
    import neighbour
except ModuleNotFoundError:
    print("ok")
else:
    print("LEAK", neighbour.__file__)
""")
    assert p.stdout.strip() == "ok", p.stdout + p.stderr


def test_a_failing_import_leaves_nothing_behind(tmp_path: Path) -> None:
    site = _site(tmp_path)
    (site / "bcc" / "libbcc.py").write_text("raise OSError('libbcc.so.0: cannot open shared object file')\n")
    p = _run(f"""
import sys
from scout_sys.probes.ebpf.distro import find_system_bcc, import_package
try:
    import_package(find_system_bcc([{str(site)!r}]))
except OSError as e:
    print("raised", e)
print(sorted(k for k in sys.modules if k == "bcc" or k.startswith("bcc.")))
""")
    assert p.stdout.splitlines() == ["raised libbcc.so.0: cannot open shared object file", "[]"], p.stdout + p.stderr


def test_no_bcc_anywhere(tmp_path: Path) -> None:
    (tmp_path / "bcc").mkdir()  # a directory named bcc that is no package
    assert distro.find_system_bcc([str(tmp_path), str(tmp_path / "missing")]) is None


@pytest.mark.ebpf
@pytest.mark.skipif(distro.find_system_bcc() is None, reason="no distro bcc here (python3-bpfcc)")
def test_the_monitor_finds_the_distro_bcc_without_a_shim() -> None:
    """The real distro bcc, from an interpreter whose path has no bcc (a pip install's venv)."""
    p = _run("""
import sys
from scout_sys.probes.ebpf import _common
bcc, err = _common.load_bcc()
assert err is None, err
print(bcc.__file__, _common.BCC_FROM_SYSTEM)
print([p for p in sys.path if "dist-packages" in p])
try:
    import apt  # a neighbour of bcc in Debian's dist-packages
    print("LEAK", apt.__file__)
except ImportError:
    print("no neighbour")
""", isolated=True)
    lines = p.stdout.splitlines()
    assert lines == [f"{distro.find_system_bcc()}/__init__.py True", "[]", "no neighbour"], p.stdout + p.stderr


REL = {
    "debian": 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\n',
    "ubuntu": 'PRETTY_NAME="Ubuntu 24.04.1 LTS"\nID=ubuntu\nID_LIKE=debian\n',
    "rocky": 'PRETTY_NAME="Rocky Linux 9.4 (Blue Onyx)"\nID="rocky"\nID_LIKE="rhel centos fedora"\n',
    "alma": 'NAME="AlmaLinux"\nID="almalinux"\nID_LIKE="rhel centos fedora"\n',
    "arch": 'NAME="Arch Linux"\nID=arch\n',
}


@pytest.mark.parametrize(("name", "machine", "want"), [
    ("debian", "x86_64", "apt-get install bpfcc-tools python3-bpfcc linux-headers-$(uname -r) "
                         "(where no package matches the running kernel: linux-headers-amd64)"),
    ("debian", "aarch64", "linux-headers-arm64)"),
    ("ubuntu", "aarch64", "on Ubuntu 24.04.1 LTS: apt-get install bpfcc-tools python3-bpfcc"),
    ("ubuntu", "x86_64", "linux-headers-generic)"),
    ("rocky", "x86_64", "on Rocky Linux 9.4 (Blue Onyx): dnf install bcc-tools python3-bcc kernel-devel-$(uname -r)"),
    ("alma", "aarch64", "dnf install bcc-tools python3-bcc kernel-devel"),
    ("arch", "x86_64", "Debian/Ubuntu: bpfcc-tools python3-bpfcc"),
])
def test_install_command_per_distro(tmp_path: Path, name: str, machine: str, want: str) -> None:
    f = tmp_path / "os-release"
    f.write_text(REL[name])
    cmd = distro.install_command(distro.os_release(str(f)), machine)
    assert want in cmd, cmd
    assert "pip install bcc`" in cmd if name == "arch" else "pip" not in cmd


def test_make_ebpf_only_from_a_source_checkout() -> None:
    assert distro.source_checkout() == ROOT  # these tests run from one
    assert "make ebpf" in distro.setup_hint()
