"""certify on a host that ran several jobs in one folder (the same script relaunched): a checkpoint
is judged by the rounds of the job that wrote it only, and a job that had ended, or that the ledger
last saw before the file was written, is not taken for its writer."""

from __future__ import annotations

import json
import os
import socket
import time

import torch  # the replay extra, installed by `make`: a failed import fails here, never skips

from scout_sys.replay import ledger
from scout_sys.replay.certify import certify
from scout_sys.replay.writers import SLACK
from tests.test_certify import clean_round, ident_of, state


def status(path, state_dir) -> dict:
    (c,) = certify([str(path)], state_dir=str(state_dir))["checkpoints"]
    return c


def test_a_later_job_in_the_same_folder_is_judged_by_none_of_the_earlier_jobs_rounds(tmp_path):
    """Job 7 computed other bits a minute ago, job 8 ran a clean round 30 s ago, both in proj/ and
    both gone; a checkpoint written now in proj/checkpoints is neither rejected nor certified by them."""
    ckpts = tmp_path / "proj" / "checkpoints"
    ckpts.mkdir(parents=True)
    st = tmp_path / "state"
    clean_round(st, "sdc", cwd=tmp_path / "proj", launcher=7, ago=60)
    torch.save(state(), ckpts / "step_1.pt")
    c = status(ckpts / "step_1.pt", st)
    assert (c["status"], c["job"]) == ("unverified", None), c
    assert not any("sdc" in r for r in c["reasons"]) and "a later job may have written it" in c["reasons"][0]
    clean_round(st, cwd=tmp_path / "proj", launcher=8, ago=30)
    torch.save(state(), ckpts / "step_2.pt")
    c = status(ckpts / "step_2.pt", st)
    assert (c["status"], c["job"]) == ("unverified", None), c
    assert "job run8" in c["reasons"][0]


def test_a_job_the_watch_saw_end_wrote_nothing_after(tmp_path):
    (tmp_path / "proj").mkdir()
    st = tmp_path / "state"
    clean_round(st, "sdc", cwd=tmp_path / "proj", launcher=7, ago=60)
    ledger.note(str(st), ident_of(st, 7, tmp_path / "proj"), ledger.SEEN, time.time() - 30, alive=False)
    torch.save(state(), tmp_path / "proj" / "step_3.pt")
    c = status(tmp_path / "proj" / "step_3.pt", st)
    assert (c["status"], c["job"]) == ("unverified", None), c
    assert "no job in the replay ledger wrote it" in c["reasons"][0]


def test_a_checkpoint_the_watch_saw_its_job_write_is_that_jobs_after_it_ended(tmp_path):
    """A round a minute ago, then the watch saw the job write step_4 and end: step_4 is certified;
    a file written in the same folder after the job ended is not its."""
    (tmp_path / "proj").mkdir()
    st = tmp_path / "state"
    me = ident_of(st, 5, tmp_path / "proj")
    clean_round(st, cwd=tmp_path / "proj", launcher=5, ago=60)
    p = tmp_path / "proj" / "step_4.pt"
    torch.save(state(), p)
    ledger.note(str(st), me, ledger.CHECKPOINT, os.stat(p).st_mtime, seen=time.time(), checkpoint=str(p))
    ledger.note(str(st), me, ledger.SEEN, time.time(), alive=False)
    time.sleep(SLACK + 0.1)  # step_4 is not merely written while the job was last seen
    c = status(p, st)
    assert (c["status"], c["job"]["launcher_pid"], c["job"]["matched"]) == \
        ("certified", 5, "the watch saw its ranks write it"), c
    torch.save(state(), tmp_path / "proj" / "step_5.pt")
    assert status(tmp_path / "proj" / "step_5.pt", st)["status"] == "unverified"


def test_a_job_that_runs_now_wrote_what_lies_in_its_folder(tmp_path):
    """The ledger's job is this test process (same pid and start time, this host): it runs, so a
    checkpoint written a minute after its round is its own, and certified by that round."""
    (tmp_path / "proj").mkdir()
    st = tmp_path / "state"
    clean_round(st, cwd=tmp_path / "proj", launcher=os.getpid(), ago=60)
    lines = ledger.read(str(st))
    ident = {**lines[0]["job"], "launcher_start": ledger.start_time(os.getpid()), "host": socket.gethostname()}
    ident["key"] = ledger.job_key(ident)
    # the same round, recorded for the running job's identity
    with open(ledger.path(str(st)), "w") as f:
        f.write(json.dumps({**lines[0], "job": ident}) + "\n")
    assert ledger.alive(ident)
    torch.save(state(), tmp_path / "proj" / "step_6.pt")
    c = status(tmp_path / "proj" / "step_6.pt", st)
    assert (c["status"], c["job"]["launcher_pid"]) == ("certified", os.getpid()), c

