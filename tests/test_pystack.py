"""The stack probe's boundary: py-spy's refusals are classified where py-spy is run (probes/pystack.py),
and a window in which no rank's stack could be read for that reason is one clear error, not a verdict."""

from __future__ import annotations

import pytest

from scout_sys.errors import PermissionDenied
from scout_sys.model import StackSample
from scout_sys.probes import pystack


def test_py_spy_refusals_are_denials_and_other_errors_are_not():
    assert pystack._is_denial("Error: Permission denied (os error 13)")
    assert pystack._is_denial("Failed to attach: Operation not permitted (EPERM), see ptrace_scope")
    assert not pystack._is_denial("Error: No such process (os error 3)")
    assert not pystack._is_denial("py-spy timed out after 2s")


def test_a_window_with_every_stack_denied_raises_one_line_and_one_read_stack_does_not():
    denied = [StackSample(time=1.0, rank=r, pid=10 + r, error="Permission denied (os error 13)", denied=True)
              for r in range(4)]
    with pytest.raises(PermissionDenied) as e:
        pystack.check_access(denied)
    assert "\n" not in str(e.value) and "sudo" in str(e.value)
    pystack.check_access(denied[:3] + [StackSample(time=1.0, rank=3, pid=13)])  # one rank readable: decide
    pystack.check_access([StackSample(time=1.0, rank=0, pid=10, error="No such process")])  # gone, not denied
    pystack.check_access([])
