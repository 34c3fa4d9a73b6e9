"""Which ranks live on this host: the one answer, from each launcher's own environment, never a guess.

A rank process's environment says, depending on who started it, how many ranks share its host and
sometimes which ones. Read in this order (the first family whose variables a rank carries, and whose
rank variable is the rank we number it by, answers for that rank):

- **torchrun** (also ``accelerate launch``, TorchX's ``dist.ddp`` and Kubernetes' elastic PyTorchJob,
  which run torchrun): ``LOCAL_WORLD_SIZE`` ranks, from ``RANK - LOCAL_RANK`` on (torchrun numbers
  a node's workers contiguously).
- **DeepSpeed's launcher**: ``LOCAL_SIZE`` with ``CROSS_RANK`` / ``CROSS_SIZE`` (its own variables),
  contiguous from ``RANK - LOCAL_RANK``; ``CROSS_SIZE=1``: every rank.
- **PyTorch Lightning's launcher** (``python train.py`` that starts its other local ranks itself:
  NODE_RANK and LOCAL_RANK, no RANK; scout_sys/lightning_ranks.py numbers them): a loopback
  ``MASTER_ADDR`` (its default) is every rank; otherwise it never says how many ranks each node runs
  (the Trainer's ``devices``, in the script), so nothing is said.
- **Slurm** (``srun python train.py``): ``SLURM_PROCID``, ``SLURM_LOCALID`` and this node's task count
  from ``SLURM_STEP_TASKS_PER_NODE`` / ``SLURM_TASKS_PER_NODE`` (``4(x2)``, ``2(x3),1``) at
  ``SLURM_NODEID``, else ``SLURM_NTASKS_PER_NODE``; ``SLURM_NNODES=1``: every rank. Which ranks: only
  for Slurm's block distribution (its default; ``SLURM_DISTRIBUTION`` unset or ``block*``), checked
  against ``SLURM_PROCID - SLURM_LOCALID``; any other distribution says only how many.
- **Open MPI**: ``OMPI_COMM_WORLD_LOCAL_SIZE`` says how many, never which (``--map-by`` decides);
  equal to ``OMPI_COMM_WORLD_SIZE``: every rank.
- **MPICH / Intel MPI (Hydra, PMI)**: ``MPI_LOCALNRANKS`` with ``PMI_RANK`` / ``PMI_SIZE``: how many.
- **Kubernetes training operators** without torchrun in the pod: ``PET_NPROC_PER_NODE`` ranks from
  ``PET_NODE_RANK * PET_NPROC_PER_NODE`` (torchrun's own arithmetic); ``PET_NNODES=1``: every rank.
- ``MASTER_ADDR`` a loopback address: every rank connects to this host's loopback, so every rank
  lives here. ``MASTER_ADDR`` naming this host says nothing of the kind (a multi-node job's master).

Where nothing says, :data:`NOTHING`: a rank not seen is *not observed here*, never missing.

Pure: environments in, a :class:`Placement` out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "ip6-localhost"})


@dataclass(frozen=True)
class Placement:
    """This host's share of the job, as the launcher says it."""

    ranks: frozenset[int] | None = None  # the global ranks that live here, when the launcher says which
    count: int | None = None  # how many live here (set whenever ``ranks`` is; alone: which ones is not said)
    source: str = ""  # the variables that said so, for people

    @property
    def known(self) -> bool:
        return self.count is not None


NOTHING = Placement()


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def tasks_per_node(spec: str | None) -> list[int] | None:
    """Slurm's tasks-per-node list, one count per node: ``4(x2)`` → [4, 4], ``2(x3),1`` → [2, 2, 2, 1];
    None when ``spec`` is absent or not of that form."""
    if not spec:
        return None
    out: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if m is None:
            return None
        out += [int(m[1])] * int(m[2] or 1)
    return out or None


def _block(rank: int, local: int | None, count: int | None, source: str) -> Placement | None:
    """``count`` ranks numbered contiguously from ``rank - local`` (None when the facts are inconsistent)."""
    if count is None or count <= 0 or local is None or not 0 <= local < count:
        return None
    base = rank - local
    return Placement(frozenset(range(base, base + count)), count, source) if base >= 0 else None


def _everyone(world: int, source: str) -> Placement:
    return Placement(frozenset(range(world)), world, source)


def _owns(env: Mapping[str, str], var: str, rank: int) -> bool:
    """The family's own rank variable is present and is the rank we number this process by (a wrapper
    that renumbers, e.g. RANK set from something else, makes the family's map say nothing of ours)."""
    return _int(env.get(var)) == rank


def _torchrun(env: Mapping[str, str], rank: int, world: int) -> Placement | None:
    lws = _int(env.get("LOCAL_WORLD_SIZE"))
    if lws is None or not _owns(env, "RANK", rank):
        return None
    return _block(rank, _int(env.get("LOCAL_RANK")), lws, "LOCAL_WORLD_SIZE")


def _deepspeed(env: Mapping[str, str], rank: int, world: int) -> Placement | None:
    if "CROSS_SIZE" not in env or not _owns(env, "RANK", rank):
        return None
    if _int(env.get("CROSS_SIZE")) == 1:
        return _everyone(world, "CROSS_SIZE=1 (deepspeed)")
    return _block(rank, _int(env.get("LOCAL_RANK")), _int(env.get("LOCAL_SIZE")), "LOCAL_SIZE (deepspeed)")


def _lightning(env: Mapping[str, str], rank: int, world: int) -> Placement | None:
    if "RANK" in env or "NODE_RANK" not in env or "LOCAL_RANK" not in env:
        return None
    return _loopback(env, rank, world) or NOTHING


def _slurm(env: Mapping[str, str], rank: int, world: int) -> Placement | None:
    if not _owns(env, "SLURM_PROCID", rank) or _int(env.get("SLURM_NTASKS")) not in (None, world):
        return None
    nnodes = _int(env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES"))
    if nnodes == 1:
        return _everyone(world, "SLURM_NNODES=1")
    tasks = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE"))
    node = _int(env.get("SLURM_NODEID"))
    local = _int(env.get("SLURM_LOCALID"))
    count, source = None, ""
    if tasks and node is not None and 0 <= node < len(tasks):
        count, source = tasks[node], "SLURM_TASKS_PER_NODE at SLURM_NODEID"
    elif _int(env.get("SLURM_NTASKS_PER_NODE")):
        count, source = _int(env.get("SLURM_NTASKS_PER_NODE")), "SLURM_NTASKS_PER_NODE"
    elif tasks and len(set(tasks)) == 1:
        count, source = tasks[0], "SLURM_TASKS_PER_NODE"
    if count is None or local is None or not 0 <= local < count:
        return None
    dist = env.get("SLURM_DISTRIBUTION", "")
    placed = _block(rank, local, count, f"{source}, block distribution (Slurm)")
    if placed is not None and tasks and node is not None and node < len(tasks) and sum(tasks[:node]) != rank - local:
        placed = None  # the list and the task's own numbers disagree: no block layout
    if dist and not dist.startswith("block"):
        placed = None
    return placed or Placement(None, count, f"{source} (Slurm; which ranks: SLURM_DISTRIBUTION {dist or '?'})")


def _count_only(rank_var: str, size_var: str, local_var: str, name: str) -> Callable[..., Placement | None]:
    def read(env: Mapping[str, str], rank: int, world: int) -> Placement | None:
        n = _int(env.get(local_var))
        if n is None or n <= 0 or not _owns(env, rank_var, rank):
            return None
        if n == world and _int(env.get(size_var)) == world:
            return _everyone(world, f"{local_var} = {size_var} ({name})")
        return Placement(None, n, f"{local_var} ({name}; which ranks: its mapping, not in the environment)")
    return read


def _kubeflow(env: Mapping[str, str], rank: int, world: int) -> Placement | None:
    if "PET_NNODES" not in env and "PET_NPROC_PER_NODE" not in env:
        return None
    nnodes = env.get("PET_NNODES", "")
    if nnodes.strip() == "1" or nnodes.strip() == "1:1":
        return _everyone(world, "PET_NNODES=1 (Kubernetes training operator)")
    nproc, node = _int(env.get("PET_NPROC_PER_NODE")), _int(env.get("PET_NODE_RANK"))
    if nproc is None or node is None or nproc <= 0:
        return None
    return _block(rank, rank - node * nproc, nproc, "PET_NPROC_PER_NODE at PET_NODE_RANK (Kubernetes)")


def _loopback(env: Mapping[str, str], rank: int, world: int) -> Placement | None:
    if env.get("MASTER_ADDR", "").strip().lower() in _LOOPBACK:
        return _everyone(world, "MASTER_ADDR is a loopback address: single host")
    return None


_FAMILIES: tuple[Callable[[Mapping[str, str], int, int], Placement | None], ...] = (
    _torchrun,
    _deepspeed,
    _lightning,
    _slurm,
    _count_only("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI"),
    _count_only("PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS", "MPICH/PMI"),
    _kubeflow,
    _loopback,
)


def of_rank(env: Mapping[str, str], rank: int, world: int) -> Placement:
    """What one rank's environment says of its host's share of the job (:data:`NOTHING` if nothing)."""
    for family in _FAMILIES:
        p = family(env, rank, world)
        if p is not None:
            if p.ranks is not None and (rank not in p.ranks or max(p.ranks) >= world):
                continue  # the arithmetic does not hold for this rank: the family says nothing here
            return p
    return NOTHING


def placement(ranks: Iterable[tuple[int, int, Mapping[str, str]]]) -> Placement:
    """This host's share, from every found rank's ``(rank, world size, environment)``: what they all
    say, or :data:`NOTHING` when one says nothing or two disagree (no launcher fact, no answer)."""
    said = {of_rank(env, rank, world) for rank, world, env in ranks}
    if len(said) != 1:
        counts = {p.count for p in said}
        if len(counts) == 1 and None not in counts:  # same count, the ranks' own sets differ
            (n,) = counts
            return Placement(None, n, "; ".join(sorted({p.source for p in said})))
        return NOTHING
    return next(iter(said))
