"""The checkpoint spy (replay/spy.py) against a real process and real files: a checkpoint written
in a folder the rank's command line names is found by the folder's listing, however briefly the
file was open (a small torch.save is open for milliseconds; the watch may be reading stacks then)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from scout_sys.replay.spy import MAX_ENTRIES, CheckpointSpy, arg_dirs


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


def test_a_crowded_folder_seen_before_does_not_use_up_the_look_at_the_named_one(rank, tmp_path) -> None:
    # stop 32's CI: a scratch checkpoint in /tmp made /tmp a folder to look into, and /tmp's thousands
    # of entries (sorted first) used up the scan's whole budget before the job's own checkpoint folder
    p, ckpt = rank
    crowd = tmp_path / "a"  # sorts before "deep/..." as /tmp before /tmp/pytest-of-root/...
    crowd.mkdir()
    for i in range(MAX_ENTRIES + 100):
        (crowd / f"d{i:05}").mkdir()
    spy = CheckpointSpy([p.pid], since=time.time() - 1)
    spy.dirs.add(str(crowd))
    (crowd / "scratch.pt").write_bytes(b"x")  # beside the crowd of folders: files are looked at first
    (ckpt / "step_40.pt").write_bytes(b"x")
    assert sorted(u for u, _ in spy.scan()) == [str(crowd / "scratch.pt"), str(ckpt / "step_40.pt")]


def test_a_file_seen_open_is_reported_once_closed_wherever_it_is(tmp_path) -> None:
    # a scratch checkpoint in a folder no listing reaches: seen open (still being written), then closed
    far = tmp_path / "x" / "y" / "z" / "w"
    far.mkdir(parents=True)
    path = far / "scratch.pt"
    writer = subprocess.Popen([sys.executable, "-c",
                               f"import time; f = open({str(path)!r}, 'wb'); f.write(b'x'); f.flush(); "
                               "print('open', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "open\n"
        spy = CheckpointSpy([writer.pid], since=time.time() - 5)
        assert spy.scan(settled=time.time() - 60) == []  # being written: not yet
        spy.dirs.clear()  # as if no listing reached its folder (past a crowded folder's budget)
        writer.kill()
        writer.wait()
        assert [u for u, _ in spy.scan(settled=time.time() + 1)] == [str(path)]
    finally:
        writer.kill()
        writer.wait()


def test_the_watch_records_which_checkpoints_its_job_wrote_and_until_when_it_ran(rank, tmp_path) -> None:
    """Coverage on: each checkpoint seen goes to the ledger as the job's (certify matches the file to
    it exactly), and closing says the job still ran; once the job is gone, it says it had ended."""
    import socket

    from scout_sys.model import Job, Rank
    from scout_sys.replay import ledger
    from scout_sys.replay.live import SETTLE, ReplayPart
    from scout_sys.replay.writers import jobs_of, writer_of

    p, ckpt = rank
    job = Job(ranks=(Rank(0, p.pid, socket.gethostname()),), world_size=1, launcher="t", launcher_pid=None,
              host=socket.gethostname())
    st = str(tmp_path / "state")
    part = ReplayPart(job, state_dir=st, started=time.time() - 10, checkpoints=True, load=lambda: 99.0)
    (ckpt / "step_7.pt").write_bytes(b"x")
    t = os.stat(ckpt / "step_7.pt").st_mtime
    time.sleep(SETTLE + 0.2)
    part.step(time.time(), [])  # the host is "busy": no round starts, the checkpoint is noted
    part.close()
    seen, end = ledger.read(st)
    assert (seen["event"], seen["checkpoint"], seen["time"]) == ("checkpoint", str(ckpt / "step_7.pt"), round(t, 3))
    assert (end["event"], end["alive"], end["job"]["key"]) == ("seen", True, seen["job"]["key"])
    writer, how = writer_of(str(ckpt / "step_7.pt"), os.stat(ckpt / "step_7.pt").st_mtime, jobs_of(ledger.read(st)))
    assert writer is not None and how == "the watch saw its ranks write it"
    p.kill()
    p.wait()
    part.close()
    assert ledger.read(st)[-1]["alive"] is False


def test_each_checkpoint_says_its_coverage_as_it_is_written(rank) -> None:
    """checkpoint_written carries what the rounds since the previous checkpoint say of it: not covered
    (no round yet), covered (a clean round after the previous one), sdc (an sdc round in between)."""
    import socket

    from scout_sys.model import Job, Rank
    from scout_sys.replay.live import SETTLE, ReplayPart
    from tests.test_replay_live import result

    p, ckpt = rank
    job = Job(ranks=(Rank(0, p.pid, socket.gethostname()),), world_size=1, launcher="t", launcher_pid=None,
              host=socket.gethostname())
    runs = [result(), result(bad=1), result()]  # after step_1 a clean round, after step_2 an sdc one
    part = ReplayPart(job, runner=lambda *a, **kw: runs.pop(0), started=0.0, checkpoints=True, load=lambda: 0.0)
    now = 0.0
    events = []
    for step in (1, 2, 3):
        (ckpt / f"step_{step}.pt").write_bytes(b"x")
        time.sleep(SETTLE + 0.2)
        now += 10
        part.step(now, [])  # the checkpoint is seen; its round starts
        events += [e.to_json() for e in part.events]
        part.events.clear()
        end = time.time() + 10
        while part.running and time.time() < end:
            time.sleep(0.01)
        now += 10
        part.step(now, [])  # the round's result is taken
    part.close()
    assert [(e["path"], e["coverage"], e["replay"]) for e in events] == [
        (str(ckpt / "step_1.pt"), "not covered", "round started"),
        (str(ckpt / "step_2.pt"), "covered", "round started"),
        (str(ckpt / "step_3.pt"), "sdc", "round started")], events
    assert runs == []
