"""The distro's bcc, found from any Python environment, and what to install where it is missing.

bcc's Python module comes with the distro (Debian/Ubuntu ``python3-bpfcc``, RHEL/Rocky/Alma/Fedora
``python3-bcc``), built for its libbcc; PyPI's ``bcc`` is an unrelated project. A venv or a pipx
install does not see the system's site-packages, and must not see all of it (its other packages
would shadow the venv's). So the rule of ``scripts/setup-ebpf.sh`` is applied at runtime: only the
``bcc`` package of the system's dist-packages is imported, from its own directory; nothing is added
to ``sys.path``. A ``bcc`` the environment imports by itself (setup-ebpf.sh's ``bcc-only`` shim)
comes first.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType

# Where the distros install python3-bpfcc / python3-bcc (and bcc's own `make install`), in order.
SYSTEM_SITES = (
    "/usr/lib/python3/dist-packages",         # Debian, Ubuntu
    "/usr/lib/python3.*/site-packages",       # RHEL, Rocky, Alma, Fedora (noarch)
    "/usr/lib64/python3.*/site-packages",
    "/usr/local/lib/python3*/dist-packages",  # bcc built from source
    "/usr/local/lib/python3*/site-packages",
)
OS_RELEASE = "/etc/os-release"


def system_sites(patterns: Sequence[str] = SYSTEM_SITES) -> list[str]:
    out: list[str] = []
    for pat in patterns:
        out += sorted(glob.glob(pat), reverse=True)  # the newest python3.N first
    return out


def find_system_bcc(sites: Iterable[str] | None = None) -> Path | None:
    """The distro's ``bcc`` package directory (``.../dist-packages/bcc``), or None."""
    for site in system_sites() if sites is None else sites:
        pkg = Path(site) / "bcc"
        if (pkg / "__init__.py").is_file():
            return pkg
    return None


def import_package(pkg: Path) -> ModuleType:
    """Import the package at ``pkg`` under its own name, and only it: its submodules are looked up in
    ``pkg`` (its ``__path__``), every other import as usual. Raises what its import raises."""
    name = pkg.name
    spec = importlib.util.spec_from_file_location(name, pkg / "__init__.py", submodule_search_locations=[str(pkg)])
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {pkg}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
        raise
    return module


# --------------------------------------------------------------------------- advice


def os_release(path: str = OS_RELEASE) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        text = Path(path).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.startswith("#"):
            out[key.strip()] = value.strip().strip("'\"")
    return out


def family(release: dict[str, str]) -> str | None:
    """``debian`` (Debian, Ubuntu and derivatives), ``rhel`` (RHEL, Rocky, Alma, CentOS, Fedora,
    Amazon Linux) or None."""
    ids = [release.get("ID", "")] + release.get("ID_LIKE", "").split()
    if any(i in ("debian", "ubuntu") for i in ids):
        return "debian"
    if any(i in ("rhel", "fedora", "centos", "rocky", "almalinux", "amzn") for i in ids):
        return "rhel"
    return None


def install_command(release: dict[str, str] | None = None, machine: str | None = None) -> str:
    """The distro's command that installs bcc and the running kernel's headers."""
    release = os_release() if release is None else release
    machine = machine or os.uname().machine
    fam = family(release)
    name = release.get("PRETTY_NAME") or release.get("NAME") or "this distro"
    if fam == "debian":
        meta = "linux-headers-generic" if release.get("ID") == "ubuntu" else (
            "linux-headers-arm64" if machine == "aarch64" else "linux-headers-amd64")
        return (f"on {name}: apt-get install bpfcc-tools python3-bpfcc linux-headers-$(uname -r) "
                f"(where no package matches the running kernel: {meta})")
    if fam == "rhel":
        return f"on {name}: dnf install bcc-tools python3-bcc kernel-devel-$(uname -r)"
    return ("install your distro's bcc with its Python module and the running kernel's headers (Debian/Ubuntu: "
            "bpfcc-tools python3-bpfcc linux-headers-$(uname -r); RHEL/Rocky/Alma: bcc-tools python3-bcc "
            "kernel-devel); never `pip install bcc`")


def source_checkout() -> Path | None:
    """The source tree this package runs from (its Makefile and scripts/setup-ebpf.sh), or None
    for an installed wheel."""
    root = Path(__file__).resolve().parents[3]
    if (root / "Makefile").is_file() and (root / "scripts" / "setup-ebpf.sh").is_file():
        return root
    return None


def setup_hint() -> str:
    """How to set up eBPF here: `make ebpf` in a source checkout, else the distro's packages."""
    if source_checkout() is not None:
        return "run `sudo make ebpf` (scripts/setup-ebpf.sh), then `sudo scout-sys doctor`"
    arch = " (aarch64: the same packages)" if os.uname().machine == "aarch64" else ""
    return f"{install_command()}{arch}, then `sudo scout-sys doctor`"
