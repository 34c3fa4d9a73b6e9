"""Read checkpoints without ever running code from them, and check their tensors.

Formats: ``torch.save`` files, read only with ``torch.load(weights_only=True)`` (memory-mapped when
the file allows it); safetensors; ``torch.distributed.checkpoint`` folders (``.metadata`` read by an
unpickler that builds only DCP's own metadata records, chunks by ``torch.load(weights_only=True)``
of their byte ranges). A pickle that needs code to load is refused by the loader before any of it
runs, and reported as such.

Imports torch (lazily): used by ``certify``, never by the monitor.
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import os
import pickle
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from scout_sys.extras import MissingExtra, require
from scout_sys.replay.worker import flatten  # the worker's script is standard library until it runs

TORCH_EXT = (".pt", ".pth", ".bin", ".ckpt", ".tar")
SAFE_EXT = (".safetensors",)
CHUNK = 1 << 24  # elements per isfinite() pass: bounded extra memory on huge tensors
DIGEST_BYTES = 1 << 26  # bytes hashed per update


@dataclass
class FileReport:
    """One checkpoint file (or one DCP folder) as read: its tensors' layout, digests on demand,
    non-finite counts, or why it could not be read."""

    path: str
    fmt: str  # "torch" | "safetensors" | "dcp"
    layout: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)  # name -> (shape, dtype)
    nonfinite: dict[str, int] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    def signature(self) -> tuple:
        return tuple(sorted(self.layout.items()))


def kind_of(path: str) -> str | None:
    """"torch" | "safetensors" | "dcp" | "folder" | None (does not look like a checkpoint)."""
    if os.path.isdir(path):
        names = os.listdir(path)
        if ".metadata" in names:
            return "dcp"
        return "folder" if any(kind_of(os.path.join(path, n)) for n in names
                               if not os.path.isdir(os.path.join(path, n))) else None
    low = path.lower()
    if low.endswith(SAFE_EXT):
        return "safetensors"
    if low.endswith(TORCH_EXT):
        return "torch"
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return None
    if head.startswith(b"PK\x03\x04"):  # torch.save's zip format
        return "torch"
    if len(head) >= 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 100 << 20:
        return "safetensors"
    return None


def folder_files(path: str) -> list[str]:
    """The checkpoint files of a folder of per-rank files (not recursive), sorted."""
    return sorted(os.path.join(path, n) for n in os.listdir(path)
                  if os.path.isfile(os.path.join(path, n)) and kind_of(os.path.join(path, n)) in ("torch", "safetensors"))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    m = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)", text)
    if m:
        return f"pickle needs code to load ({m.group(1)}); refused by torch.load(weights_only=True), never executed"
    if "Weights only load failed" in text:
        return "pickle needs code to load; refused by torch.load(weights_only=True), never executed"
    line = text.splitlines()[0] if text else type(e).__name__
    return line.split(". ")[0][:300]


# --------------------------------------------------------------------------- tensor checks


def count_nonfinite(torch: Any, t: Any) -> int:
    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return 0
    flat = t.reshape(-1)
    bad = 0
    for part in flat.split(CHUNK):
        # One reduction pass: any NaN or Inf makes the sum non-finite. Only then (or when a sum of
        # finite values overflows) count exactly.
        if not bool(torch.isfinite(part.sum())):
            bad += int(part.numel() - torch.isfinite(part).sum().item())
    return bad


def tensor_digest(t: Any) -> str:
    """SHA-256 of the tensor's raw bytes (SHA extensions make it the fastest exact hash on x86),
    read in place (no copy of a contiguous tensor)."""
    t = t.detach().contiguous()
    n = t.numel() * t.element_size()
    h = hashlib.sha256()
    h.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
    ptr = t.data_ptr()
    for off in range(0, n, DIGEST_BYTES):
        h.update((ctypes.c_char * min(DIGEST_BYTES, n - off)).from_address(ptr + off))
    return h.hexdigest()[:32]


def _check(torch: Any, rep: FileReport, tensors: Iterator[tuple[str, Any]], digests: bool) -> None:
    for name, t in tensors:
        prev = rep.layout.get(name)
        rep.layout[name] = (tuple(t.shape) if prev is None else prev[0], str(t.dtype).replace("torch.", ""))
        bad = count_nonfinite(torch, t)
        if bad:
            rep.nonfinite[name] = rep.nonfinite.get(name, 0) + bad
        if digests:
            rep.digests[name] = tensor_digest(t)


# --------------------------------------------------------------------------- readers


def read(path: str, *, digests: bool = False) -> FileReport:
    """Read one checkpoint (a file, or a DCP folder) and check every tensor. Never raises for bad
    content: the reason is in ``error``."""
    import torch

    kind = kind_of(path)
    rep = FileReport(path, kind or "?")
    try:
        if kind == "safetensors":
            _read_safetensors(torch, path, rep, digests)
        elif kind == "dcp":
            _read_dcp(torch, path, rep, digests)
        else:
            _read_torch(torch, path, rep, digests)
    except MissingExtra:
        raise
    except Exception as e:  # noqa: BLE001 - any failure to read is a reason to reject, in one line
        rep.error = _first_line(e)
    return rep


def _read_torch(torch: Any, path: str, rep: FileReport, digests: bool) -> None:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as e:
        if "mmap can only be used" not in str(e):
            raise
        obj = torch.load(path, map_location="cpu", weights_only=True)  # legacy (non-zip) format: no mmap
    tensors: dict[str, Any] = {}
    flatten(torch, obj, "", tensors)
    _check(torch, rep, iter(tensors.items()), digests)


def _read_safetensors(torch: Any, path: str, rep: FileReport, digests: bool) -> None:
    require("scout-sys certify", "replay", ("safetensors",))  # raised: a missing module is no bad content
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as f:
        _check(torch, rep, ((k, f.get_tensor(k)) for k in f.keys()), digests)


# DCP's own metadata records: the only things its .metadata pickle may build.
_DCP_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata", "BytesStorageMetadata",
        "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "collections": {"OrderedDict"},
    "pathlib": {"PosixPath", "PurePosixPath", "Path"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        import torch

        if name in _DCP_ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None),
                                                               (torch.dtype, torch.layout, torch.memory_format))):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"Unsupported global: GLOBAL {module}.{name}")


def _read_dcp(torch: Any, path: str, rep: FileReport, digests: bool) -> None:
    with open(os.path.join(path, ".metadata"), "rb") as f:
        md = _MetadataUnpickler(f).load()
    handles: dict[str, Any] = {}
    try:
        def chunks() -> Iterator[tuple[str, Any]]:
            for idx, info in md.storage_data.items():
                meta = md.state_dict_metadata.get(idx.fqn)
                if meta is None or not hasattr(meta, "chunks"):
                    continue  # non-tensor items are pickled objects: never loaded
                if getattr(info, "transform_descriptors", None):
                    raise ValueError(f"{idx.fqn}: stored with transforms {info.transform_descriptors} this "
                                     "reader does not apply")
                fpath = os.path.join(path, info.relative_path)
                if fpath not in handles:
                    handles[fpath] = open(fpath, "rb")  # noqa: SIM115 - closed below
                f = handles[fpath]
                size = os.fstat(f.fileno()).st_size
                if info.offset + info.length > size:
                    raise ValueError(f"truncated: {info.relative_path} has {size} bytes, the chunk of {idx.fqn} "
                                     f"ends at {info.offset + info.length}")
                f.seek(info.offset)
                t = torch.load(io.BytesIO(f.read(info.length)), map_location="cpu", weights_only=True)
                off = tuple(idx.offset) if idx.offset is not None else ()
                yield (idx.fqn if not any(off) else f"{idx.fqn}@{','.join(map(str, off))}"), t

        _check(torch, rep, chunks(), digests)
    finally:
        for f in handles.values():
            f.close()
    for fqn, meta in md.state_dict_metadata.items():
        if hasattr(meta, "size") and fqn in rep.layout:
            rep.layout[fqn] = (tuple(meta.size), rep.layout[fqn][1])
