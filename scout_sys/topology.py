"""Parallel layouts: which ranks are equivalent peers (replicas of one another).

A layout is a grid of dimensions ``dp`` (data), ``tp`` (tensor), ``pp`` (pipeline), ``cp`` (context)
and ``ep`` (expert) and a *rank order*: which dimension varies fastest as the global rank grows.
Two ranks are equivalent peers when every coordinate but ``dp`` is equal: they run the same code on
the same shard of the model, so a strict-majority vote among them is sound. Ranks at different
pipeline stages or tensor-parallel positions run different code and wait in different collectives.

Sources, in order (:func:`find_layout`): an explicit ``--topology`` string; the launch command
line and config files of Megatron-Core, DeepSpeed or TorchTitan; else none (consensus then groups
ranks by the shape of their activity, see ``consensus/groups.py``). Rank orders are documented in
``docs/layouts.md``.

Pure: no torch import. The only I/O is :func:`read_cmdline` and the config files a command line names.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from scout_sys.errors import ScoutError
from scout_sys.model_job import LayoutSource

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.9 and 3.10 (RHEL 9, Ubuntu 22.04): the same parser, from PyPI
    import tomli as tomllib

DIMS = ("dp", "tp", "pp", "cp", "ep")
# Rank orders, fastest-varying dimension first (Megatron-Core's notation).
ORDERS = {
    "megatron": ("tp", "cp", "ep", "dp", "pp"),  # megatron.core.parallel_state RankGenerator default
    "deepspeed": ("tp", "dp", "pp"),  # deepspeed PipeModelDataParallelTopology: axes pipe, data, model
    "torchtitan": ("tp", "cp", "ep", "dp", "pp"),  # ParallelDims mesh ["pp", "dp", "cp", "tp"], row-major
}
_ALIASES = {"data": "dp", "tensor": "tp", "model": "tp", "mp": "tp", "pipe": "pp", "pipeline": "pp",
            "context": "cp", "expert": "ep"}


class BadTopology(ScoutError):
    """A --topology string (or a framework config) does not describe the job."""


@dataclass(frozen=True)
class Layout:
    sizes: tuple[tuple[str, int], ...]  # every dimension with its size, in the order given
    order: tuple[str, ...]  # fastest-varying first; covers every dimension in ``sizes``
    order_name: str  # "mesh", "megatron", "deepspeed", "torchtitan" or "custom"

    @property
    def world_size(self) -> int:
        n = 1
        for _, s in self.sizes:
            n *= s
        return n

    def size(self, dim: str) -> int:
        return dict(self.sizes).get(dim, 1)

    def coords(self, rank: int) -> dict[str, int]:
        """Coordinates of a global rank, for every dimension of size > 1 (in the order given)."""
        out: dict[str, int] = {}
        rest = rank
        for d in self.order:
            s = self.size(d)
            out[d] = rest % s
            rest //= s
        return {d: out[d] for d, s in self.sizes if s > 1} or {"dp": 0}

    def peer_key(self, rank: int) -> tuple[tuple[str, int], ...]:
        return tuple((d, c) for d, c in self.coords(rank).items() if d != "dp")

    def groups(self) -> tuple[tuple[int, ...], ...]:
        """Peer groups: ranks with identical non-dp coordinates, ordered by their first rank."""
        by: dict[tuple, list[int]] = {}
        for r in range(self.world_size):
            by.setdefault(self.peer_key(r), []).append(r)
        return tuple(sorted(tuple(g) for g in by.values()))

    def dims(self) -> str:
        """``dp=2,tp=2``: the sizes, in the order given."""
        return ",".join(f"{d}={s}" for d, s in self.sizes)

    def describe(self) -> str:
        return f"{self.dims()} (order {self.order_name}: {'-'.join(self.order)}, fastest first)"


def parse(text: str, world_size: int | None = None) -> Layout:
    """``dp=4,tp=2,pp=2[,order=mesh|megatron|deepspeed|torchtitan|tp-dp-pp]``.

    ``order=mesh`` (the default) is torch's DeviceMesh: row-major over the dimensions as written,
    the last one fastest. A dimension given as ``dp=-1`` (or left out while ``world_size`` is known)
    takes what is left of the world size.
    """
    sizes: list[tuple[str, int]] = []
    order_text = "mesh"
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, val = part.partition("=")
        key = key.strip().lower()
        if not sep:
            raise BadTopology(f"bad --topology part {part!r}: expected NAME=SIZE (e.g. dp=4,tp=2)")
        if key == "order":
            order_text = val.strip().lower()
            continue
        key = _ALIASES.get(key, key)
        if key not in DIMS:
            raise BadTopology(f"unknown dimension {key!r} in --topology (known: {', '.join(DIMS)}, order)")
        if key in dict(sizes):
            raise BadTopology(f"dimension {key} given twice in --topology")
        try:
            n = int(val)
        except ValueError:
            raise BadTopology(f"bad size {val!r} for {key} in --topology") from None
        if n == 0 or n < -1:
            raise BadTopology(f"bad size {n} for {key} in --topology")
        sizes.append((key, n))
    if not sizes:
        raise BadTopology("empty --topology (expected e.g. dp=4,pp=2)")
    sizes = _fill(sizes, world_size)
    return Layout(tuple(sizes), _order(order_text, [d for d, _ in sizes]), _order_name(order_text))


def _fill(sizes: list[tuple[str, int]], world_size: int | None) -> list[tuple[str, int]]:
    known = 1
    for _, s in sizes:
        known *= s if s > 0 else 1
    free = [d for d, s in sizes if s == -1]
    if len(free) > 1:
        raise BadTopology("at most one dimension may be -1")
    if world_size is not None:
        if not free and "dp" not in dict(sizes) and world_size % known == 0 and world_size != known:
            sizes = [("dp", -1), *sizes]
            free = ["dp"]
        if free:
            if world_size % known:
                raise BadTopology(f"world size {world_size} is not a multiple of {known}")
            sizes = [(d, world_size // known if s == -1 else s) for d, s in sizes]
        total = 1
        for _, s in sizes:
            total *= s
        if total != world_size:
            raise BadTopology(f"--topology {','.join(f'{d}={s}' for d, s in sizes)} has {total} ranks; "
                              f"the job has {world_size}")
    elif free:
        raise BadTopology("a dimension of -1 needs the world size")
    return sizes


def _order_name(text: str) -> str:
    return text if text in ORDERS or text == "mesh" else "custom"


def _order(text: str, dims: Sequence[str]) -> tuple[str, ...]:
    if text == "mesh":
        return tuple(reversed(dims))
    if text in ORDERS:
        base = ORDERS[text]
    else:
        base = tuple(_ALIASES.get(d, d) for d in re.split(r"[-\s>]+", text) if d)
        bad = [d for d in base if d not in DIMS]
        if bad or not base:
            raise BadTopology(f"bad order {text!r}: use mesh, megatron, deepspeed, torchtitan or "
                              "dimensions fastest first, e.g. tp-cp-ep-dp-pp")
    missing = [d for d in dims if d not in base]
    if missing:
        if text in ORDERS:
            raise BadTopology(f"order {text} has no dimension {', '.join(missing)}")
        raise BadTopology(f"order {text!r} does not name {', '.join(missing)}")
    return tuple(d for d in base if d in dims)


# --------------------------------------------------------------------------- frameworks' command lines


def _flag(argv: Sequence[str], *names: str) -> str | None:
    """The value of ``--name V`` or ``--name=V`` (the last one wins, as argparse does)."""
    val = None
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                val = argv[i + 1]
            elif a.startswith(n + "="):
                val = a[len(n) + 1:]
    return val


def _int_flag(argv: Sequence[str], *names: str) -> int | None:
    v = _flag(argv, *names)
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _both(name: str) -> tuple[str, str]:
    """``--a-b`` and ``--a_b`` (Megatron accepts dashes, many scripts pass underscores)."""
    return name, name.replace("-", "_")


def _read_config(path: str, cwd: str | None) -> str | None:
    full = path if os.path.isabs(path) or not cwd else os.path.join(cwd, path)
    try:
        with open(full, encoding="utf-8", errors="replace") as f:
            return f.read(1 << 20)
    except OSError:
        return None


class Found(NamedTuple):
    """A layout and where it came from (a Job's ``layout_source``, ``layout_from`` and ``layout``)."""

    layout: Layout
    source: LayoutSource  # TOPOLOGY or FRAMEWORK
    where: str  # short: "--topology dp=2,tp=2", "Megatron-Core command line", "DeepSpeed config ds.json"
    text: str  # the sentence people read: where, and the grid with its rank order


def _framework(lay: Layout, where: str, detail: str = "") -> Found:
    return Found(lay, LayoutSource.FRAMEWORK, where, f"{where}{detail}: {lay.describe()}")


def from_cmdline(argv: Sequence[str], world_size: int, cwd: str | None = None) -> Found | None:
    """A layout from a rank's command line (and the config files it names, relative to ``cwd``):
    Megatron-Core flags, a DeepSpeed JSON config, a TorchTitan TOML config (+ CLI overrides)."""
    # Megatron-Core
    tp = _int_flag(argv, *_both("--tensor-model-parallel-size"))
    pp = _int_flag(argv, *_both("--pipeline-model-parallel-size"))
    cp = _int_flag(argv, *_both("--context-parallel-size"))
    if tp or pp or cp:
        sizes = [("tp", tp or 1), ("cp", cp or 1), ("pp", pp or 1)]
        lay = _sized(sizes, world_size, "megatron")
        if lay:
            return _framework(lay, "Megatron-Core command line", " (" + " ".join(
                f"{d}={s}" for d, s in sizes if s > 1) + "; expert parallelism reuses data-parallel ranks)")
    # DeepSpeed
    ds_path = _flag(argv, "--deepspeed_config", "--deepspeed-config", "--ds_config", "--ds-config")
    if ds_path:
        text = _read_config(ds_path, cwd)
        if text is not None:
            try:
                cfg = json.loads(text)
            except ValueError:
                cfg = None
            if isinstance(cfg, dict):
                tpc = cfg.get("tensor_parallel") or {}
                ppc = cfg.get("pipeline") or {}
                tp = _first_int(tpc, "autotp_size", "tp_size") if isinstance(tpc, dict) else None
                pp = _first_int(ppc, "stages", "pipe_parallel_size", "num_stages") if isinstance(ppc, dict) else None
                pp = pp or _first_int(cfg, "pipeline_parallel_size")
                if tp or pp:
                    lay = _sized([("tp", tp or 1), ("pp", pp or 1)], world_size, "deepspeed")
                    if lay:
                        return _framework(lay, f"DeepSpeed config {ds_path}")
    # TorchTitan
    tt_path = _flag(argv, "--job.config_file", "--job.config-file")
    over = {k: _int_flag(argv, f"--parallelism.{k}") for k in
            ("data_parallel_shard_degree", "data_parallel_replicate_degree", "tensor_parallel_degree",
             "pipeline_parallel_degree", "context_parallel_degree")}
    par: dict = {}
    if tt_path:
        text = _read_config(tt_path, cwd)
        if text is not None:
            try:
                par = dict(tomllib.loads(text).get("parallelism") or {})
            except tomllib.TOMLDecodeError:
                par = {}
    par.update({k: v for k, v in over.items() if v is not None})
    tp, pp, cp = (_first_int(par, k) for k in ("tensor_parallel_degree", "pipeline_parallel_degree",
                                                  "context_parallel_degree"))
    if tt_path or any(v is not None for v in over.values()):
        lay = _sized([("tp", tp or 1), ("cp", cp or 1), ("pp", pp or 1)], world_size, "torchtitan")
        if lay:
            return _framework(lay, "TorchTitan " + (f"config {tt_path}" if tt_path else "command line"))
    return None


def _first_int(d: Mapping, *keys: str) -> int | None:
    for k in keys:
        v = d.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _sized(sizes: list[tuple[str, int]], world_size: int, order: str) -> Layout | None:
    model = 1
    for _, s in sizes:
        model *= s
    if model <= 0 or world_size % model:
        return None
    full = [("dp", world_size // model), *((d, s) for d, s in sizes if s > 1)]
    return Layout(tuple(full), _order(order, [d for d, _ in full]), order)


def read_cmdline(pid: int) -> tuple[list[str], str | None]:
    """(argv, cwd) of a process; ([], None) when unreadable (gone, or not ours)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return [], None
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = None
    return argv, cwd


# --------------------------------------------------------------------------- the entry point


def find_layout(world_size: int, topology: str | None = None,
                cmdlines: Iterable[tuple[Sequence[str], str | None]] = ()) -> Found | None:
    """The layout of a job of ``world_size`` ranks and where it came from: ``topology``
    (``--topology``), else the first of ``cmdlines`` ((argv, cwd) of the job's processes, ranks first,
    then their launcher) that names a framework layout. None when neither says anything: consensus
    groups the ranks by the shape of their activity."""
    if topology:
        lay = parse(topology, world_size)
        return Found(lay, LayoutSource.TOPOLOGY, f"--topology {lay.dims()}", f"--topology {lay.describe()}")
    for argv, cwd in cmdlines:
        if len(argv) > 0:
            found = from_cmdline(list(argv), world_size, cwd)
            if found:
                return found
    return None


def note(text: str, groups: Sequence[Sequence[int]]) -> str:
    """The job's note that says its peer groups and where they came from (``text``: the layout sentence)."""
    return f"peer groups from {text}: " + "; ".join(
        "(" + ",".join(map(str, g)) + ")" for g in groups[:8]) + (" ..." if len(groups) > 8 else "")


def split_cmdline(text: str) -> list[str]:
    """A shell-quoted command line as argv (for tests and people)."""
    return shlex.split(text)
