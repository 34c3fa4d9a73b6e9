"""The checkpoint spy (replay/spy.py) against a real process and real files: a checkpoint written
in a folder the rank's command line names is found by the folder's listing, however briefly the
file was open (a small torch.save is open for milliseconds; the watch may be reading stacks then)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from scout_sys.replay.spy import CheckpointSpy, arg_dirs


def test_arg_dirs_takes_the_checkpoint_options_folders(tmp_path) -> None:
    for d in ("run/save", "titan", "data", "ckpts", "out"):
        (tmp_path / d).mkdir(parents=True)
    argv = ["python", "train.py", "--save", "run/save", "--job.dump_folder=./titan", "--data-dir", "data",
            str(tmp_path / "ckpts"), "--output_dir", "missing", "--lr", "0.1", "--resume-from", "/"]
    assert arg_dirs(argv, str(tmp_path)) == [str(tmp_path / "run/save"), str(tmp_path / "titan"),
                                             str(tmp_path / "ckpts")]
    # a flag without a value does not take the next option's folder
    assert arg_dirs(["--save", "--data", str(tmp_path / "data")], "/") == []


@pytest.fixture
def rank(tmp_path):
    """A process whose command line names a checkpoint folder far from its working directory."""
    ckpt = tmp_path / "deep" / "a" / "b" / "run7"
    ckpt.mkdir(parents=True)
    (tmp_path / "cwd").mkdir()
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--checkpoint-dir", str(ckpt)],
                         cwd=tmp_path / "cwd")
    yield p, ckpt
    p.kill()
    p.wait()


def test_a_checkpoint_in_the_named_folder_is_found_once_closed(rank) -> None:
    p, ckpt = rank
    (ckpt / "old.pt").write_bytes(b"x")  # written before the watch began: not news
    spy = CheckpointSpy([p.pid], since=time.time() + 0.01)
    time.sleep(0.05)
    assert spy.scan() == []
    (ckpt / "step_40.pt").write_bytes(b"x" * 10)  # open for microseconds, closed before the scan
    (ckpt / "global_step80").mkdir()
    (ckpt / "global_step80" / "mp_rank_00").mkdir()
    (ckpt / "global_step80" / "mp_rank_00" / "model_states.pt").write_bytes(b"y")
    (ckpt / "notes.txt").write_text("not a checkpoint")
    found = sorted(u for u, _ in spy.scan())  # (oldest first: these two were written in the same instant)
    assert found == [str(ckpt / "global_step80" / "mp_rank_00" / "model_states.pt"), str(ckpt / "step_40.pt")]
    assert spy.scan() == []  # each once
    t = time.time() + 5
    os.utime(ckpt / "step_40.pt", (t, t))
    assert [u for u, _ in spy.scan()] == [str(ckpt / "step_40.pt")]  # rewritten: news again


def test_a_file_still_being_written_waits_for_the_next_scan(rank) -> None:
    p, ckpt = rank
    spy = CheckpointSpy([p.pid], since=time.time() - 1)
    (ckpt / "step_1.pt").write_bytes(b"x")
    assert spy.scan(settled=time.time() - 60) == []
    assert [u for u, _ in spy.scan(settled=time.time() + 1)] == [str(ckpt / "step_1.pt")]
