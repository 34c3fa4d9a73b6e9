"""What every bad-input test of the command line checks: one clear line and exit 2, never a traceback."""

from __future__ import annotations

import subprocess


def one_error_line(out: subprocess.CompletedProcess[str]) -> str:
    """The one line a bad input prints (exit 2, nothing on stdout, no traceback)."""
    assert (out.returncode, out.stdout) == (2, ""), (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    return lines[0]


def usage_error_line(out: subprocess.CompletedProcess[str]) -> str:
    """argparse's own: the usage, then one error line (exit 2, no traceback)."""
    assert (out.returncode, out.stdout) == (2, ""), (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert lines[0].startswith("usage: scout-sys ") and "Traceback" not in out.stderr, out.stderr
    return lines[-1]
