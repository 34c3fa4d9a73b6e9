"""certify on checkpoints written by real torch.save, torch.distributed.checkpoint and safetensors,
through the real command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import torch  # the replay extra, installed by `make`: a failed import fails here, never skips

from scout_sys.consensus import replay as rules
from scout_sys.model import DeviceRound, Job, KernelResult, Rank
from scout_sys.replay import ledger
from tests.conftest import scout

KEYS = {"path", "step", "status", "reasons", "divergent", "nonfinite", "replay", "job"}


def state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"layer.weight": torch.randn(32, 16, generator=g), "layer.bias": torch.randn(32, generator=g),
            "head.weight": torch.randn(4, 32, generator=g).to(torch.bfloat16)}


def certify(*paths, state_dir, extra=()) -> tuple[int, dict]:
    out = scout("certify", *map(str, paths), "--state-dir", str(state_dir), "--json", *extra, timeout=120)
    assert len(out.stdout.strip().splitlines()) == 1, out.stdout + out.stderr
    cert = json.loads(out.stdout)
    assert set(cert) == {"schema", "time", "checkpoints", "recommended", "why", "next"}
    assert cert["schema"] == "scout-sys/certificate/v1"
    for c in cert["checkpoints"]:
        assert set(c) == KEYS and set(c["replay"]) == {"covered", "rounds"}
    human = scout("certify", *map(str, paths), "--state-dir", str(state_dir), *extra, timeout=120)
    assert human.returncode == out.returncode and "next: " in human.stdout
    return out.returncode, cert


def one(cert: dict) -> dict:
    (c,) = cert["checkpoints"]
    return c


STARTED = round(time.time() - 3600, 2)  # when the tests' jobs started (they are gone: their pids are made up)


def ident_of(state_dir, launcher: int = 1, cwd=None) -> dict:
    """The ledger identity of the made-up job of launcher pid ``launcher``, run in ``cwd``."""
    return {"launcher_pid": launcher, "launcher_start": STARTED + launcher, "run_id": f"run{launcher}",
            "host": "h", "world_size": 3, "ranks": [0, 1, 2],
            "cwd": str(cwd if cwd is not None else os.path.dirname(str(state_dir))), "cmdline": "python train.py",
            "checkpoint_dirs": []}


def clean_round(state_dir, result: str = "clean", *, cwd=None, launcher: int = 1, gpus: bool = False,
                ago: float = 0.0) -> None:
    """A replay round as the replay runner records it (its own entry function), now, for the job of
    launcher pid ``launcher`` started an hour ago in ``cwd`` (default: the state dir's parent, where
    the tests write their checkpoints). ``gpus``: its devices are GPUs with UUIDs GPU-<r>. ``ago``: the
    round ended that many seconds ago."""
    j = Job(ranks=tuple(Rank(r, 100 + r, "h") for r in range(3)), world_size=3, launcher="t", launcher_pid=launcher,
            host="h")
    name = (lambda r: f"cuda:{r}") if gpus else (lambda r: f"cpu/rank{r}")
    res = [DeviceRound(name(r), (r,), "cpu torch",
                       {"gemm": KernelResult("x" if (result == "sdc" and r == 2) else "a", 0.1)}) for r in range(3)]
    now = time.time() - ago
    ident = ident_of(state_dir, launcher, cwd)
    uuids = {f"cuda:{r}": f"GPU-{r}" for r in range(3)} if gpus else None
    ledger.append(str(state_dir), j, now - 0.01, now, res, rules.vote_digests(res), rules.vote_times(res),
                  ident=ident, uuids=uuids)
    time.sleep(0.05)


def test_clean_file_without_replay_is_unverified_then_certified_once_a_clean_round_precedes_it(tmp_path):
    torch.save(state(), tmp_path / "step_100.pt")
    time.sleep(0.05)
    rc, cert = certify(tmp_path / "step_100.pt", state_dir=tmp_path / "state")
    c = one(cert)
    assert (rc, c["status"], c["step"]) == (1, "unverified", 100)
    assert "no job in the replay ledger wrote it" in c["reasons"][0]
    assert cert["recommended"] is None and "--job" in cert["next"]
    clean_round(tmp_path / "state")
    torch.save(state(), tmp_path / "step_200.pt")
    rc, cert = certify(tmp_path / "step_100.pt", tmp_path / "step_200.pt", state_dir=tmp_path / "state")
    assert [c["status"] for c in cert["checkpoints"]] == ["unverified", "certified"]
    assert cert["checkpoints"][1]["replay"]["covered"] and cert["checkpoints"][1]["reasons"] == []
    assert cert["recommended"] == str(tmp_path / "step_200.pt")
    assert cert["next"] == f"restart from {tmp_path / 'step_200.pt'}"
    assert cert["checkpoints"][1]["job"]["launcher_pid"] == 1
    rc, cert = certify(tmp_path / "step_200.pt", state_dir=tmp_path / "state")
    assert rc == 0 and one(cert)["status"] == "certified"
    ledger.note(str(tmp_path / "state"), ident_of(tmp_path / "state"), ledger.SEEN, time.time(), alive=True)
    torch.save(state(), tmp_path / "step_300.pt")  # no round of its job since step_200, which still ran
    rc, cert = certify(tmp_path / "step_300.pt", state_dir=tmp_path / "state")
    assert (rc, one(cert)["status"]) == (1, "unverified")
    assert "no complete clean replay round of its job run1" in one(cert)["reasons"][0]
    assert "sudo scout-sys replay --job 1" in cert["next"]


def test_another_jobs_rounds_neither_reject_nor_certify(tmp_path):
    """Two jobs share one state dir: job 7 (in tmp/other) computed other bits on cpu/rank2, job 8
    (in tmp/other too, later) ran clean rounds. A checkpoint of a third job in tmp/mine is none of theirs."""
    (tmp_path / "other").mkdir()
    (tmp_path / "mine").mkdir()
    torch.save(state(), tmp_path / "mine" / "step_1.pt")
    time.sleep(0.05)
    clean_round(tmp_path / "state", "sdc", cwd=tmp_path / "other", launcher=7)
    clean_round(tmp_path / "state", cwd=tmp_path / "other", launcher=8)
    torch.save(state(), tmp_path / "mine" / "step_2.pt")
    rc, cert = certify(tmp_path / "mine" / "step_2.pt", state_dir=tmp_path / "state")
    c = one(cert)
    assert (rc, c["status"], c["job"]) == (1, "unverified", None), c
    assert not any("sdc" in r for r in c["reasons"])
    # Its own job's clean round certifies it; the other jobs' sdc on cpu/rank2 still does not count.
    clean_round(tmp_path / "state", cwd=tmp_path / "mine", launcher=9)
    torch.save(state(), tmp_path / "mine" / "step_3.pt")
    rc, cert = certify(tmp_path / "mine" / "step_3.pt", state_dir=tmp_path / "state")
    assert (rc, one(cert)["status"], one(cert)["job"]["launcher_pid"]) == (0, "certified", 9), cert


def test_an_sdc_on_a_gpu_rejects_later_checkpoints_computed_on_it_in_any_job(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    clean_round(tmp_path / "state", "sdc", cwd=tmp_path / "a", launcher=7, gpus=True)  # GPU-2 is bad
    clean_round(tmp_path / "state", cwd=tmp_path / "b", launcher=8, gpus=True)  # job 8: clean, same GPUs
    torch.save(state(), tmp_path / "b" / "step_5.pt")
    rc, cert = certify(tmp_path / "b" / "step_5.pt", state_dir=tmp_path / "state")
    c = one(cert)
    assert (rc, c["status"]) == (1, "rejected"), c
    assert any("GPU GPU-2 computed other bits" in r and "launcher pid 7" in r for r in c["reasons"]), c["reasons"]


def test_the_ledger_rotates_and_stays_readable(tmp_path, monkeypatch):
    monkeypatch.setattr(ledger, "MAX_BYTES", 4000)  # about 6 rounds a generation
    for _ in range(30):
        clean_round(tmp_path / "state")
    files = sorted(os.listdir(tmp_path / "state" / "replay"))
    assert files == ["ledger.jsonl", "ledger.jsonl.1"]
    assert all(os.path.getsize(tmp_path / "state" / "replay" / f) < 4000 + 2000 for f in files)
    assert 2 <= len(ledger.read(str(tmp_path / "state"))) < 20
    torch.save(state(), tmp_path / "step_9.pt")
    rc, cert = certify(tmp_path / "step_9.pt", state_dir=tmp_path / "state")
    assert (rc, one(cert)["status"]) == (0, "certified")


def test_sdc_round_in_the_interval_rejects(tmp_path):
    torch.save(state(), tmp_path / "step_1.pt")
    time.sleep(0.05)
    clean_round(tmp_path / "state")
    clean_round(tmp_path / "state", "sdc")
    torch.save(state(), tmp_path / "step_2.pt")
    rc, cert = certify(tmp_path / "step_2.pt", state_dir=tmp_path / "state")
    c = one(cert)
    assert (rc, c["status"]) == (1, "rejected")
    assert any("sdc on cpu/rank2" in r and "job run1" in r for r in c["reasons"])
    assert "previous certified" in cert["next"]


def test_nonfinite_values_are_named(tmp_path):
    sd = state()
    sd["layer.bias"][3] = float("nan")
    sd["layer.weight"][0, :2] = float("inf")
    torch.save(sd, tmp_path / "model.pt")
    clean_round(tmp_path / "state")
    rc, cert = certify(tmp_path / "model.pt", state_dir=tmp_path / "state")
    c = one(cert)
    assert (rc, c["status"]) == (1, "rejected")
    assert sorted((x["tensor"], x["count"]) for x in c["nonfinite"]) == [("layer.bias", 1), ("layer.weight", 2)]
    assert all(x["file"] == str(tmp_path / "model.pt") for x in c["nonfinite"])


def test_with_nothing_certified_the_newest_clean_checkpoint_is_the_fallback_never_skipped(tmp_path):
    """A job no watch followed: no ledger, so its clean checkpoint is unverified; an older one of it is
    truncated. Next says to cover the clean one while the job runs, else to restart from it unless an
    older one certifies — never "go back" past it, as it once did whenever any given was rejected."""
    torch.save(state(), tmp_path / "step_1.pt")
    data = (tmp_path / "step_1.pt").read_bytes()
    (tmp_path / "step_1.pt").write_bytes(data[: len(data) // 2])
    time.sleep(0.05)
    torch.save(state(), tmp_path / "step_2.pt")
    rc, cert = certify(tmp_path / "step_2.pt", tmp_path / "step_1.pt", state_dir=tmp_path / "state")
    assert (rc, [c["status"] for c in cert["checkpoints"]]) == (1, ["unverified", "rejected"])
    assert cert["recommended"] is None
    assert cert["next"] == (
        f"while the job runs: sudo scout-sys certify --job PID {tmp_path / 'step_2.pt'} {tmp_path / 'step_1.pt'} "
        "(or run a round: sudo scout-sys replay --job PID); if the job is gone: certify older checkpoints too "
        f"and restart from the newest certified, else from {tmp_path / 'step_2.pt'} (clean, not replay-checked)")


def test_truncated_files_are_rejected(tmp_path):
    torch.save(state(), tmp_path / "a.pt")
    from safetensors.torch import save_file

    save_file(state(), str(tmp_path / "b.safetensors"))
    for name in ("a.pt", "b.safetensors"):
        data = (tmp_path / name).read_bytes()
        (tmp_path / name).write_bytes(data[: len(data) * 2 // 3])
    rc, cert = certify(tmp_path / "a.pt", tmp_path / "b.safetensors", state_dir=tmp_path / "state")
    assert rc == 1 and [c["status"] for c in cert["checkpoints"]] == ["rejected", "rejected"]
    assert "zip archive" in cert["checkpoints"][0]["reasons"][0]
    assert "incomplete" in cert["checkpoints"][1]["reasons"][0]


def test_a_pickle_that_needs_code_is_rejected_and_never_run(tmp_path):
    marker = tmp_path / "executed"
    code = (f"import os, torch\nclass Payload:\n    def __reduce__(self):\n"
            f"        return (os.system, ('touch {marker}',))\n"
            f"torch.save({{'w': torch.zeros(2), 'x': Payload()}}, {str(tmp_path / 'evil.pt')!r})\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert not marker.exists()
    rc, cert = certify(tmp_path / "evil.pt", state_dir=tmp_path / "state")
    c = one(cert)
    assert (rc, c["status"]) == (1, "rejected")
    assert "needs code to load" in c["reasons"][0] and "never executed" in c["reasons"][0]
    assert not marker.exists()


def test_the_divergent_replica_is_named(tmp_path):
    folder = tmp_path / "step_300"
    folder.mkdir()
    for r in range(4):
        sd = state()
        if r == 1:
            sd["layer.weight"][5, 5] += 1e-6  # one value, barely
        torch.save(sd, folder / f"rank{r}.pt")
    clean_round(tmp_path / "state")
    rc, cert = certify(folder, state_dir=tmp_path / "state")
    c = one(cert)
    assert (rc, c["status"], c["step"]) == (1, "rejected", 300)
    assert c["divergent"] == [str(folder / "rank1.pt")]
    assert "layer.weight" in c["reasons"][0]


def test_two_replicas_that_differ_have_no_majority(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    torch.save(state(0), folder / "rank0.pt")
    torch.save(state(1), folder / "rank1.pt")
    rc, cert = certify(folder, state_dir=tmp_path / "state")
    c = one(cert)
    assert c["status"] == "rejected" and c["divergent"] == []
    assert "no strict majority" in c["reasons"][0]


def test_clean_replicas_safetensors_and_dcp_are_certified(tmp_path):
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    time.sleep(0.05)
    clean_round(tmp_path / "state")
    # Each in its own run folder: a sibling written earlier would be "the previous checkpoint".
    for run in "abc":
        (tmp_path / run).mkdir()
    reps = tmp_path / "a" / "replicas"
    reps.mkdir()
    for r in range(3):
        torch.save({"model": state(), "step": 7}, reps / f"rank{r}.pt")
    save_file(state(), str(tmp_path / "b" / "model.safetensors"))
    dcp.save({"model": state(), "extra": {"epoch": 3}}, checkpoint_id=str(tmp_path / "c" / "dcp"), no_dist=True)
    rc, cert = certify(reps, tmp_path / "b" / "model.safetensors", tmp_path / "c" / "dcp",
                       state_dir=tmp_path / "state")
    assert [c["status"] for c in cert["checkpoints"]] == ["certified"] * 3, cert
    assert rc == 0


def test_dcp_with_nan_or_a_truncated_shard_is_rejected(tmp_path):
    import torch.distributed.checkpoint as dcp

    sd = state()
    sd["layer.bias"][0] = float("-inf")
    dcp.save({"model": sd}, checkpoint_id=str(tmp_path / "nan"), no_dist=True)
    dcp.save({"model": state()}, checkpoint_id=str(tmp_path / "cut"), no_dist=True)
    shard = next(p for p in (tmp_path / "cut").iterdir() if p.suffix == ".distcp")
    shard.write_bytes(shard.read_bytes()[:-200])
    rc, cert = certify(tmp_path / "nan", tmp_path / "cut", state_dir=tmp_path / "state")
    nan, cut = cert["checkpoints"]
    assert nan["status"] == "rejected" and nan["nonfinite"][0]["tensor"] == "model.layer.bias"
    assert cut["status"] == "rejected" and "truncated" in cut["reasons"][0]


def test_dcp_metadata_that_needs_code_is_refused(tmp_path):
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": state()}, checkpoint_id=str(tmp_path / "d"), no_dist=True)
    marker = tmp_path / "executed"
    code = (f"import os, pickle\nclass P:\n    def __reduce__(self):\n        return (os.system, ('touch {marker}',))\n"
            f"open({str(tmp_path / 'd' / '.metadata')!r}, 'wb').write(pickle.dumps(P()))\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    rc, cert = certify(tmp_path / "d", state_dir=tmp_path / "state")
    assert one(cert)["status"] == "rejected" and "needs code to load" in one(cert)["reasons"][0]
    assert not marker.exists()


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    out = scout("certify", str(tmp_path / "nope.pt"))
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "no such path" in out.stderr
    (tmp_path / "notes.txt").write_text("hello")
    out = scout("certify", str(tmp_path / "notes.txt"))
    assert out.returncode == 2 and "does not look like a checkpoint" in out.stderr
    assert "Traceback" not in out.stderr


def test_monitor_side_never_imports_torch():
    code = ("import sys, scout_sys.cli, scout_sys.replay.runner, scout_sys.replay.certify, "
            "scout_sys.replay.report, scout_sys.consensus.replay\n"
            "scout_sys.cli.build_parser().parse_args(['replay', '--job', '1'])\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env={**os.environ})
