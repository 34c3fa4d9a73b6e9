"""A verb whose extra is not installed: one line naming the install command, exit 2, no traceback.

Here torch is hidden from a fresh interpreter (``sys.modules["torch"] = None``: import and find_spec
both fail, as without the package); tests/test_package.py checks the same in a real install."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests._ebpf_jobs import ROOT

HIDE = """
import sys
for m in {hide!r}:
    sys.modules[m] = None
from scout_sys.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _cli(tmp_path, *args: str, hide: tuple[str, ...] = ("torch", "safetensors")) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", HIDE.format(hide=hide), *args], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=60, check=False)


@pytest.mark.parametrize(("args", "line"), [
    (["agent", "--job", "1", "--store", "127.0.0.1:1", "--nnodes", "1", "--node-rank", "0", "--token-file", "t"],
     "scout-sys agent needs torch: pip install 'scout-sys[cluster]'"),
    (["diagnose", "--cluster", "127.0.0.1:1", "--token-file", "t"],
     "scout-sys diagnose --cluster needs torch: pip install 'scout-sys[cluster]'"),
    (["watch", "--cluster", "127.0.0.1:1", "--token-file", "t", "--headless"],
     "scout-sys watch --cluster needs torch: pip install 'scout-sys[cluster]'"),
    (["certify", "model.pt"], "scout-sys certify needs torch: pip install 'scout-sys[replay]'"),
    (["demo"], "scout-sys demo needs torch: pip install 'scout-sys[all]'"),
])
def test_missing_torch_is_one_line(tmp_path, args: list[str], line: str) -> None:
    (tmp_path / "model.pt").write_bytes(b"PK")
    p = _cli(tmp_path, *args)
    if sys.version_info < (3, 10):  # the oldest-Python part of make test: no torch 2.13 for this Python
        line += f" under Python 3.10 or newer (this is Python 3.{sys.version_info[1]})"
    assert (p.returncode, p.stderr, p.stdout) == (2, line + "\n", ""), p.stderr


def test_the_store_client_itself_says_so() -> None:
    """Whatever reaches the store without the CLI's check (a library user) gets the same line."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "from scout_sys.cluster.store import Store\n"
            "from scout_sys.extras import MissingExtra\n"
            "try:\n    Store('127.0.0.1', 1)\nexcept MissingExtra as e:\n    print(e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    line = "the scout-sys store client needs torch: pip install 'scout-sys[cluster]'"
    if sys.version_info < (3, 10):
        line += f" under Python 3.10 or newer (this is Python 3.{sys.version_info[1]})"
    assert p.stdout == line + "\n", p.stderr


@pytest.mark.torch
def test_certify_of_a_safetensors_file_without_safetensors(tmp_path) -> None:
    """torch there, safetensors not: the file is not "rejected" for it, the command says what is missing."""
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    p = _cli(tmp_path, "certify", "--state-dir", str(tmp_path / "state"), str(f), hide=("safetensors",))
    assert (p.returncode, p.stderr) == (2, "scout-sys certify needs safetensors: pip install 'scout-sys[replay]'\n"), \
        p.stdout + p.stderr


def test_make_installs_the_tests_packages_for_make_test_only(tmp_path) -> None:
    """`make` (and `make demo`) set up the product's dependencies; the test runner, the linter and the
    frameworks the tests run jobs of come with `make test` (dry runs of the real Makefile, in a copy)."""
    import shutil

    for f in ("Makefile", "requirements.txt", "requirements-test.txt", "requirements-frameworks.txt",
              "constraints.txt", "pyproject.toml"):
        shutil.copy(ROOT / f, tmp_path / f)

    def dry(*target: str) -> str:
        p = subprocess.run(["make", "-n", *target], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                           check=False)
        assert p.returncode == 0, p.stderr
        return p.stdout

    for target in ((), ("demo",), ("install",)):
        out = dry(*target)
        assert "-r requirements.txt" in out and "requirements-test.txt" not in out, (target, out)
        assert "requirements-frameworks.txt" not in out and "setup-doc-tools" not in out, (target, out)
    out = dry("test")
    for needed in ("-r requirements.txt", "-r requirements-test.txt", "-r requirements-frameworks.txt",
                   "setup-doc-tools.sh", "scripts/test.sh"):
        assert needed in out, (needed, out)
