"""watch/bundle.py directly: a bundle saved for a real process (this one) in tmp_path, private, with
its files as a person reads them; the native dump in the background, its failure said in the file."""

from __future__ import annotations

import json
import os
import socket
import stat

from scout_sys.model import (
    HANG,
    INCONCLUSIVE,
    Frame,
    Incident,
    Job,
    ProcSample,
    Rank,
    StackSample,
    ThreadStack,
)
from scout_sys.watch import bundle
from tests.conftest import wait_for

ME = Job(ranks=(Rank(rank=0, pid=os.getpid(), host=socket.gethostname()),), world_size=1, launcher="explicit",
         launcher_pid=None, host=socket.gethostname())
INC = Incident(HANG, INCONCLUSIVE, (), ("h",), 1_764_000_000.0, "every rank waits", id="i7")


def _wait_file(path: str) -> dict:
    wait_for(lambda: os.path.exists(path), 30, f"{path} written by the background dump")
    return json.load(open(path))


def test_a_bundle_for_a_real_process_is_private_and_complete(tmp_path):
    stack = StackSample(time=1.0, rank=0, pid=os.getpid(),
                        threads=(ThreadStack(os.getpid(), "MainThread", True, (Frame("f", "/x.py", 3),)),), native=True)
    history = [ProcSample(time=float(i), rank=0, pid=os.getpid(), status="sleeping") for i in range(2005)]
    path = bundle.save(str(tmp_path), INC, ME, None, history, native_dump=lambda: [stack])
    assert os.path.dirname(path) == str(tmp_path / "bundles") and path.endswith("-i7-hang")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    diag = json.load(open(os.path.join(path, "diagnosis.json")))
    assert diag == {"incident": INC.to_json()}
    procfs = json.load(open(os.path.join(path, "procfs.json")))
    assert set(procfs) == {"0"} and procfs["0"]["pid"] == os.getpid()
    assert "python" in procfs["0"]["cmdline"] and procfs["0"]["status"].startswith("Name:")
    obs = json.load(open(os.path.join(path, "observations.json")))
    assert len(obs) == bundle.MAX_OBSERVATIONS and obs[0]["time"] == 5.0 and obs[-1]["type"] == "ProcSample"
    native = _wait_file(os.path.join(path, "stacks-native.json"))
    assert native == {"0": {"pid": os.getpid(), "error": None, "threads": [stack.threads[0].to_json()]}}
    for name in os.listdir(path):
        assert stat.S_IMODE(os.stat(os.path.join(path, name)).st_mode) == 0o600, name
    assert not [n for n in os.listdir(path) if n.endswith(".tmp")]


def test_a_failed_native_dump_and_an_unreadable_process_are_said(tmp_path):
    def boom():
        raise RuntimeError("py-spy gone")

    gone = Job(ranks=(Rank(rank=3, pid=2**22 + 12345, host="h"),), world_size=4, launcher="explicit",
               launcher_pid=None, host="h")
    path = bundle.save(str(tmp_path), INC, gone, None, [], native_dump=boom)
    assert _wait_file(os.path.join(path, "stacks-native.json")) == {"error": "py-spy gone"}
    info = json.load(open(os.path.join(path, "procfs.json")))["3"]
    assert info["status"] == "unreadable: No such file or directory", info


def test_the_default_state_dir(monkeypatch):
    if os.geteuid() == 0:
        assert bundle.default_state_dir() == "/var/lib/scout-sys"
    else:
        monkeypatch.setenv("XDG_STATE_HOME", "/tmp/xdg")
        assert bundle.default_state_dir() == "/tmp/xdg/scout-sys"
