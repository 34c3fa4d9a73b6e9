"""replay/checkpoint.py on real files written here: torch.save (zip and legacy), safetensors and a
torch.distributed.checkpoint folder, each read with weights_only; a pickle that needs code is refused
and never runs; non-finite values counted exactly, digests equal only for equal bits."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from scout_sys.replay import checkpoint

pytestmark = pytest.mark.torch  # the replay extra


class _Payload:
    """A pickle that runs code when loaded (what weights_only must refuse before it runs)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _state() -> dict:
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    w[1, 2] = float("nan")
    w[2, 0] = float("inf")
    return {"layer": {"w": w, "b": torch.zeros(4, dtype=torch.bfloat16)}, "step": torch.tensor(7),
            "ids": torch.arange(5)}


def test_kinds_by_name_by_magic_and_folders(tmp_path):
    torch.save(_state(), tmp_path / "rank0")  # no extension: the zip magic says torch
    (tmp_path / "notes.txt").write_text("hello")
    from safetensors.torch import save_file

    save_file({"x": torch.ones(2)}, str(tmp_path / "weights"))  # no extension: the header says safetensors
    assert checkpoint.kind_of(str(tmp_path / "rank0")) == "torch"
    assert checkpoint.kind_of(str(tmp_path / "weights")) == "safetensors"
    assert checkpoint.kind_of(str(tmp_path / "notes.txt")) is None
    assert checkpoint.kind_of(str(tmp_path / "x.PT")) == "torch" and checkpoint.kind_of(str(tmp_path / "y.safetensors")) \
        == "safetensors"  # by name alone, before any read
    assert checkpoint.kind_of(str(tmp_path / "missing")) is None
    assert checkpoint.kind_of(str(tmp_path)) == "folder"
    assert checkpoint.folder_files(str(tmp_path)) == [str(tmp_path / "rank0"), str(tmp_path / "weights")]
    (tmp_path / "empty").mkdir()
    assert checkpoint.kind_of(str(tmp_path / "empty")) is None
    (tmp_path / "dcp").mkdir()
    (tmp_path / "dcp" / ".metadata").write_bytes(b"")
    assert checkpoint.kind_of(str(tmp_path / "dcp")) == "dcp"


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_a_torch_save_file_layout_nonfinite_and_digests(tmp_path, legacy):
    path = tmp_path / "ckpt.pt"
    torch.save(_state(), path, _use_new_zipfile_serialization=not legacy)
    rep = checkpoint.read(str(path), digests=True)
    assert rep.error is None and rep.fmt == "torch"
    assert rep.layout == {"layer.w": ((3, 4), "float32"), "layer.b": ((4,), "bfloat16"), "step": ((), "int64"),
                          "ids": ((5,), "int64")}
    assert rep.nonfinite == {"layer.w": 2}
    # the same tensors give the same digests; one bit changed, another
    again = tmp_path / "again.pt"
    torch.save(_state(), again)
    assert checkpoint.read(str(again), digests=True).digests == rep.digests
    changed = _state()
    changed["ids"][4] = 6
    torch.save(changed, tmp_path / "changed.pt")
    other = checkpoint.read(str(tmp_path / "changed.pt"), digests=True).digests
    assert {k for k in rep.digests if rep.digests[k] != other[k]} == {"ids"}
    assert rep.signature() == tuple(sorted(rep.layout.items()))


def test_a_pickle_that_needs_code_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(2), "x": _Payload(str(marker))}, path)
    rep = checkpoint.read(str(path))
    assert not marker.exists(), "the checkpoint's code ran"
    assert rep.error is not None and rep.error.startswith("pickle needs code to load") and \
        "never executed" in rep.error, rep.error
    # a plain pickle with the same payload (not torch's format): refused the same way
    path.write_bytes(pickle.dumps({"x": _Payload(str(marker))}, protocol=2))
    rep = checkpoint.read(str(path))
    assert not marker.exists() and rep.error is not None, rep


def test_safetensors(tmp_path):
    from safetensors.torch import save_file

    w = torch.ones(3, 2, dtype=torch.float16)
    w[0, 0] = float("-inf")
    save_file({"a.w": w, "a.n": torch.arange(3, dtype=torch.int32)}, str(tmp_path / "m.safetensors"))
    rep = checkpoint.read(str(tmp_path / "m.safetensors"), digests=True)
    assert (rep.error, rep.fmt) == (None, "safetensors")
    assert rep.layout == {"a.w": ((3, 2), "float16"), "a.n": ((3,), "int32")} and rep.nonfinite == {"a.w": 1}
    assert rep.digests["a.w"] == checkpoint.tensor_digest(w)
    (tmp_path / "bad.safetensors").write_bytes(b"\x10" + b"\0" * 7 + b"{not json at all")
    assert checkpoint.read(str(tmp_path / "bad.safetensors")).error


def test_a_distributed_checkpoint_folder(tmp_path):
    import torch.distributed.checkpoint as dcp

    state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.tensor([1.0, float("nan")])}
    dcp.save(state, checkpoint_id=str(tmp_path / "dcp"))
    rep = checkpoint.read(str(tmp_path / "dcp"), digests=True)
    assert (rep.error, rep.fmt) == (None, "dcp")
    assert rep.layout == {"w": ((2, 3), "float32"), "b": ((2,), "float32")} and rep.nonfinite == {"b": 1}
    assert rep.digests["w"] == checkpoint.tensor_digest(state["w"])
    # a chunk file cut short: said, not read past its end
    [data] = [n for n in os.listdir(tmp_path / "dcp") if n.endswith(".distcp")]
    with open(tmp_path / "dcp" / data, "r+b") as f:
        f.truncate(8)
    rep = checkpoint.read(str(tmp_path / "dcp"))
    assert rep.error is not None and rep.error.startswith("truncated:"), rep.error


def test_a_dcp_metadata_that_would_build_anything_else_is_refused(tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "dcp").mkdir()
    (tmp_path / "dcp" / ".metadata").write_bytes(pickle.dumps(_Payload(str(marker))))
    rep = checkpoint.read(str(tmp_path / "dcp"))
    assert not marker.exists()
    assert rep.error == ("pickle needs code to load (posix.system); refused by torch.load(weights_only=True), "
                         "never executed"), rep.error


def test_nonfinite_counted_exactly_across_chunks(monkeypatch):
    monkeypatch.setattr(checkpoint, "CHUNK", 4)
    t = torch.zeros(10)
    t[1], t[6], t[9] = float("nan"), float("inf"), float("-inf")
    assert checkpoint.count_nonfinite(torch, t) == 3
    big = torch.full((8,), 3e38)  # finite values whose sum overflows: counted exactly, none bad
    assert checkpoint.count_nonfinite(torch, big) == 0
    assert checkpoint.count_nonfinite(torch, torch.tensor([1, 2])) == 0  # integers: never non-finite
    assert checkpoint.count_nonfinite(torch, torch.tensor([complex(float("nan"), 0), 1j])) == 1


def test_digest_of_a_view_and_of_its_copy_agree_and_dtype_counts():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert checkpoint.tensor_digest(t.t()) == checkpoint.tensor_digest(t.t().contiguous())
    assert checkpoint.tensor_digest(t) != checkpoint.tensor_digest(t.view(torch.int32))  # same bytes, other dtype
    assert checkpoint.tensor_digest(t) != checkpoint.tensor_digest(t.reshape(4, 3))  # other shape
