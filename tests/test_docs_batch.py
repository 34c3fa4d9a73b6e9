"""The batch scripts of the docs, run by bash as written, with stand-ins on PATH for what this machine
has not (Slurm's ``srun`` and ``scontrol``, ``sudo`` that refuses or a monitor that runs, ``torchrun``
that trains for a moment and exits with a chosen status): the script's exit status is the training's
whether the monitor fails at once or runs to the end, the training always runs to its end, and nothing
is left running. (docs/cluster.md's sbatch script once ended with ``wait -n``, which let a failing
agent step end the script, and Slurm would kill the training; the runbook's with a bare ``wait``,
which exits 0 after a failed job.)"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests._docs import ROOT, _text

_STUBS = {
    "scontrol": 'echo node0\n',
    # srun OPTIONS COMMAND...: the command, in this process (as one task of a one-node step)
    "srun": 'while [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n',
    # the training: runs a moment, says it finished, exits with TRAIN_RC
    "torchrun": 'sleep 0.5\necho done >"$MARK"\nexit "${TRAIN_RC:-0}"\n',
    # sudo -n: refused (no password may be asked), or the monitor: an agent runs until it is stopped, a
    # watch --job PID until that pid has ended (as the real ones do)
    "sudo": ('[ "$MONITOR" = fail ] && { echo "sudo: a password is required" >&2; exit 1; }\n'
             'shift\nwhile [ $# -gt 0 ] && [ "$1" != --job ]; do shift; done\n'
             'case "${2:-}" in env:*|"") exec sleep 600 ;; esac\n'
             'while kill -0 "$2" 2>/dev/null; do sleep 0.1; done\nexit 0\n'),
}


def _bin(tmp: Path) -> Path:
    b = tmp / "bin"
    b.mkdir()
    for name, body in _STUBS.items():
        (b / name).write_text("#!/bin/bash\n" + body)
        (b / name).chmod(0o755)
    return b


def _run(script: str, tmp: Path, *, train_rc: int, monitor: str) -> tuple[int, bool]:
    """(the script's exit status, whether the training ran to its end); nothing of it left running."""
    mark = tmp / f"trained-{train_rc}-{monitor}"
    env = dict(os.environ, PATH=f"{_bin(tmp)}:{os.environ['PATH']}",
               TRAIN_RC=str(train_rc), MONITOR=monitor, MARK=str(mark), SLURM_JOB_NODELIST="node[0-1]",
               SLURM_NNODES="1", SLURM_NODEID="0", SLURM_JOB_ID="4242")
    p = subprocess.Popen(["bash", "-c", script], env=env, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        rc = p.wait(timeout=60)
        left = subprocess.run(["pgrep", "-g", str(p.pid)], capture_output=True, text=True, check=False).stdout.split()
        assert left == [], f"left running: {left}"
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return rc, mark.exists()


def _block(page: str, first: str) -> str:
    for b in re.findall(r"^```[a-z]*\n(.*?)^```", _text(ROOT / "docs" / page), re.M | re.S):
        if first in b:
            return b
    raise AssertionError(f"no block with {first!r} in docs/{page}")


@pytest.mark.parametrize("monitor", ["fail", "runs"])
@pytest.mark.parametrize("train_rc", [0, 3])
def test_the_sbatch_script_of_cluster_md_exits_with_the_trainings_status(tmp_path: Path, train_rc: int,
                                                                         monitor: str) -> None:
    script = _block("cluster.md", "#SBATCH")
    assert not re.search(r"^wait( -n)?\s*$", script, re.M), script  # see the module's docstring
    assert _run(script, tmp_path, train_rc=train_rc, monitor=monitor) == (train_rc, True)


@pytest.mark.parametrize("monitor", ["fail", "runs"])
@pytest.mark.parametrize("train_rc", [0, 4])
def test_the_runbooks_watch_from_the_start_exits_with_the_trainings_status(tmp_path: Path, train_rc: int,
                                                                          monitor: str) -> None:
    script = _block("runbook.md", "torchrun ... train.py &")
    assert _run(script, tmp_path, train_rc=train_rc, monitor=monitor) == (train_rc, True)
