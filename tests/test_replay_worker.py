"""replay/worker.py directly: its digest (checked against an independent fold in plain Python), FNV-1a
against the published vectors, exact inputs, the checkpoint's kernels from a real torch.save /
safetensors file, and the script's own protocol (stdin lines in, JSON lines out)."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys

import pytest
import torch

from scout_sys.replay import worker

pytestmark = pytest.mark.torch  # the replay extra

SMALL = {"device": "cpu", "size": "small", "seed": 7, "reps": 2}


def _digest_by_hand(t: torch.Tensor) -> str:
    """The documented digest, without torch: XOR of the 64-bit words at each position of 256, FNV-1a."""
    raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    raw += b"\0" * ((-len(raw)) % (8 * worker.FOLD_WORDS))
    words = struct.unpack(f"<{len(raw) // 8}Q", raw)
    folded = [0] * worker.FOLD_WORDS
    for i, w in enumerate(words):
        folded[i % worker.FOLD_WORDS] ^= w
    h = worker.fnv1a64(f"{t.dtype}|{tuple(t.shape)}|".encode())
    for w in folded:
        h = worker.fnv1a64(w.to_bytes(8, "little"), h)
    return f"{h:016x}"


def test_fnv1a64_published_vectors():
    assert worker.fnv1a64(b"") == 0xCBF29CE484222325
    assert worker.fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert worker.fnv1a64(b"foobar") == 0x85944171F73967E8
    assert worker.combine(["a", "b"]) == f"{worker.fnv1a64(b'a|b'):016x}"


def test_the_digest_is_the_documented_fold_and_one_bit_changes_it():
    for t in (torch.arange(3000, dtype=torch.float32).reshape(30, 100),  # 12000 bytes: 6 rows of 256 words, padded
              torch.arange(7, dtype=torch.int16), torch.ones(2048, dtype=torch.float64)):
        assert worker.digest(torch, t) == _digest_by_hand(t)
    t = torch.arange(3000, dtype=torch.float32).reshape(30, 100)
    flipped = t.clone()
    flipped.view(torch.int32)[17, 3] ^= 1
    assert worker.digest(torch, flipped) != worker.digest(torch, t)
    assert worker.digest(torch, t.t()) == worker.digest(torch, t.t().contiguous())
    assert worker.digest(torch, t) != worker.digest(torch, t.view(torch.int32))  # same bytes, other dtype
    assert worker.digest(torch, t) != worker.digest(torch, t.reshape(100, 30))


def test_exact_inputs_are_the_same_for_a_seed_and_exactly_representable():
    a = worker.exact_input(torch, torch.Generator().manual_seed(3), (64,), torch.bfloat16, torch.device("cpu"))
    b = worker.exact_input(torch, torch.Generator().manual_seed(3), (64,), torch.bfloat16, torch.device("cpu"))
    assert torch.equal(a, b) and a.dtype == torch.bfloat16
    scaled = a.float() * 1024
    assert torch.equal(scaled, scaled.round()) and scaled.abs().max() <= 1024


def test_the_cpu_kernels_are_stable_and_reproducible():
    names = [n for n, _ in worker.kernels(torch, SMALL, torch.device("cpu"), 7)]
    assert names == ["gemm_float32", "bmm", "softmax", "layer_norm", "gelu", "silu", "reductions", "block_fwd_bwd"]
    torch.use_deterministic_algorithms(True)
    try:
        first = {n: worker.run_kernel(torch, fn, 2, lambda: None) for n, fn in worker.kernels(torch, SMALL, torch.device("cpu"), 7)}
        again = {n: worker.run_kernel(torch, fn, 1, lambda: None) for n, fn in worker.kernels(torch, SMALL, torch.device("cpu"), 7)}
        other = worker.run_kernel(torch, worker.kernels(torch, SMALL, torch.device("cpu"), 8)[0][1], 1, lambda: None)
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(r["stable"] and r["seconds"] >= 0 for r in first.values()), first
    assert {n: r["digest"] for n, r in first.items()} == {n: r["digest"] for n, r in again.items()}
    assert other["digest"] != first["gemm_float32"]["digest"]  # another seed, other inputs


def test_a_kernel_whose_repetitions_differ_is_unstable():
    calls = iter(range(10))
    r = worker.run_kernel(torch, lambda: torch.tensor([float(next(calls))]), 3, lambda: None)
    assert r["stable"] is False and r["digest"] == worker.digest(torch, torch.tensor([0.0]))


def test_flatten_names_every_tensor_of_a_nested_state():
    out: dict = {}
    worker.flatten(torch, {"m": {"w": torch.ones(1), "layers": [torch.zeros(1), (torch.ones(2),)]}, "n": 3}, "", out)
    assert list(out) == ["m.w", "m.layers.0", "m.layers.1.0"]
    single: dict = {}
    worker.flatten(torch, torch.ones(1), "", single)
    assert list(single) == ["<tensor>"]


def test_the_checkpoints_largest_2d_weights_become_kernels(tmp_path):
    state = {"emb": torch.ones(50, 20), "proj": torch.ones(30, 20), "head": torch.ones(10, 8), "bias": torch.ones(20),
             "ids": torch.ones(40, 40, dtype=torch.int64)}
    torch.save(state, tmp_path / "model.pt")
    ks, notes = worker.checkpoint_kernels(torch, {**SMALL, "checkpoint": str(tmp_path / "model.pt")},
                                          torch.device("cpu"), 7)
    assert [n for n, _ in ks] == ["ckpt:emb", "ckpt:proj"] and notes == []  # small: the two largest float matrices
    assert tuple(ks[0][1]().shape) == (worker.SIZES["small"]["ckpt_rows"], 50)
    from safetensors.torch import save_file

    (tmp_path / "st").mkdir()
    save_file({"w": torch.ones(4, 4), "v": torch.ones(4)}, str(tmp_path / "st" / "a.safetensors"))
    ks, notes = worker.checkpoint_kernels(torch, {**SMALL, "checkpoint": str(tmp_path / "st")}, torch.device("cpu"), 7)
    assert [n for n, _ in ks] == ["ckpt:w"] and notes == []
    assert worker.checkpoint_kernels(torch, SMALL, torch.device("cpu"), 7) == ([], [])


def test_checkpoints_it_cannot_use_are_notes(tmp_path):
    (tmp_path / "empty").mkdir()
    assert worker.checkpoint_kernels(torch, {**SMALL, "checkpoint": str(tmp_path / "empty")}, torch.device("cpu"), 7) \
        == ([], [f"{tmp_path / 'empty'}: no .pt/.pth/.bin/.safetensors file (DCP folders: use certify)"])
    torch.save({"b": torch.ones(3)}, tmp_path / "vec.pt")
    assert worker.checkpoint_kernels(torch, {**SMALL, "checkpoint": str(tmp_path / "vec.pt")}, torch.device("cpu"), 7) \
        == ([], [f"{tmp_path / 'vec.pt'}: no 2-D floating tensor to replay"])
    torch.save({"f": subprocess.Popen}, tmp_path / "code.pt")  # a global: weights_only refuses it
    ks, notes = worker.checkpoint_kernels(torch, {**SMALL, "checkpoint": str(tmp_path / "code.pt")},
                                          torch.device("cpu"), 7)
    assert ks == [] and len(notes) == 1 and "not loadable with weights_only=True" in notes[0], notes


def test_the_protocol(monkeypatch, capsys):
    """main() as the launcher drives it (the script itself, run with the rank's interpreter, is
    test_replay_cli's and test_replay_e2e's): a ready line, one round per "go", nothing for other lines."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\ngo 4\nquit\ngo 5\n"))
    try:
        assert worker.main(["worker.py", json.dumps(SMALL)]) == 0
    finally:
        torch.use_deterministic_algorithms(False)  # main sets it for its process: not for the tests after
    ready, rnd = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert ready["event"] == "ready" and ready["device"] == "cpu" and ready["torch"] == torch.__version__
    assert ready["kernels"][0] == "gemm_float32" and ready["notes"] == []
    assert rnd["event"] == "round" and rnd["round"] == 4 and set(rnd["kernels"]) == set(ready["kernels"])
    assert all(k["stable"] for k in rnd["kernels"].values())
    # a failure is one JSON line and status 3
    try:
        assert worker.main(["worker.py", json.dumps({**SMALL, "device": "nosuch:0"})]) == 3
    finally:
        torch.use_deterministic_algorithms(False)
    [err] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert err["event"] == "error" and "\n" not in err["error"], err
