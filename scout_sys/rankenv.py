"""One process seen as a possible rank: its environment, the rank variables in it, its pid in its own
PID namespace. :mod:`scout_sys.job` groups such candidates into a job.

Every pid here is the host's (the monitor's PID namespace): ``/proc``, py-spy and eBPF use it. A
process in a container has a second one, :func:`container_pid`, which the job's own logs print.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import psutil

from scout_sys.errors import SUDO_HINT, PermissionDenied

# torchrun's TORCHELASTIC_RUN_ID when no --rdzv-id was given (a static rendezvous: --master-port, or
# several nodes): every such job carries it, so it tells no two jobs apart; their master address does.
NO_RUN_ID = "none"

# _Candidate.family of a child of PyTorch Lightning's own launcher (scout_sys/lightning_ranks.py), and the
# job's launcher kind then
LIGHTNING = "lightning"

# (rank, world size, local rank) variables by launcher family, in order of preference.
_RANK_VARS = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
)


@dataclass(frozen=True)
class _Candidate:
    pid: int
    ppid: int
    rank: int
    world_size: int
    local_rank: int | None
    local_world_size: int | None
    group_rank: int | None
    key: str
    is_python: bool
    name: str
    env: dict[str, str]
    # LIGHTNING: a child of PyTorch Lightning's own launcher, numbered by LOCAL_RANK until its parent
    # (local rank 0, the script the user started) is found: lightning_ranks.number numbers it globally
    family: str = ""


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def denied_hint() -> str:
    """What to do about a process we may not read: become root, unless we are (then the process is
    protected from root itself: another user namespace, a missing capability in a container)."""
    if os.geteuid() != 0:
        return SUDO_HINT
    return ("it is protected even from root here (another user namespace, or a container without "
            "CAP_SYS_PTRACE: run the monitor with --pid=host and --privileged or --cap-add SYS_PTRACE)")


def container_pid(pid: int) -> int | None:
    """``pid``'s pid inside its own PID namespace when that is not ours (``NSpid`` lists the pid in
    each namespace from ours inwards), else None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    ids = line.split()[1:]
                    return int(ids[-1]) if len(ids) > 1 else None
    except (OSError, ValueError):
        return None
    return None


def _environ(pid: int) -> dict[str, str] | None:
    """The process's environment, or None when it cannot be read (gone, zombie, kernel thread)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except PermissionError as e:
        raise PermissionDenied(f"cannot read the environment of pid {pid}: {denied_hint()}", pid=pid) from e
    except OSError:
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def _candidate(proc: psutil.Process) -> _Candidate | None:
    """A rank process, or None. Never raises for vanished processes."""
    try:
        env = _environ(proc.pid)
        if not env or env.get("SCOUT_REPLAY_WORKER"):  # a replay worker carries its rank's environment
            return None
        family = ""
        for rv, wv, lv in _RANK_VARS:  # noqa: B007 (lv is used after the loop)
            rank, ws = _int(env.get(rv)), _int(env.get(wv))
            if rank is not None and ws is not None and 0 <= rank < ws:
                break
        else:
            if not is_lightning_child(env):
                return None
            rank, ws, lv, family = int(env["LOCAL_RANK"]), int(env["WORLD_SIZE"]), "LOCAL_RANK", LIGHTNING
        name = proc.name()
        try:
            exe = os.path.basename(proc.exe())
        except (psutil.AccessDenied, psutil.ZombieProcess, OSError):
            exe = name
        ppid = proc.ppid()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied as e:
        raise PermissionDenied(f"cannot inspect pid {proc.pid}: {denied_hint()}", pid=proc.pid) from e
    run_id = env.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != NO_RUN_ID:
        key = f"run:{run_id}"
    elif env.get("MASTER_ADDR") or env.get("MASTER_PORT"):
        key = f"master:{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
    else:
        key = f"env:{env.get('SLURM_JOB_ID') or env.get('OMPI_COMM_WORLD_SIZE') or ''}:{ws}"
    return _Candidate(
        pid=proc.pid,
        ppid=ppid,
        rank=rank,
        world_size=ws,
        local_rank=_int(env.get(lv)),
        local_world_size=_int(env.get("LOCAL_WORLD_SIZE") or env.get("OMPI_COMM_WORLD_LOCAL_SIZE")),
        group_rank=_int(env.get("GROUP_RANK")),
        key=key,
        is_python="python" in exe.lower() or "python" in name.lower(),
        name=name,
        env=env,
        family=family,
    )


def is_lightning_child(env: dict[str, str]) -> bool:
    """A process PyTorch Lightning's launcher started (``_SubprocessScriptLauncher``: the script the user
    ran is local rank 0 and starts a copy of itself per other local rank, with MASTER_ADDR/PORT,
    NODE_RANK, LOCAL_RANK 1..n-1 and WORLD_SIZE, and no RANK)."""
    if "RANK" in env or not all(k in env for k in ("MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")):
        return False
    local, node, world = _int(env["LOCAL_RANK"]), _int(env["NODE_RANK"]), _int(env["WORLD_SIZE"])
    return local is not None and node is not None and world is not None and 0 < local < world and node >= 0


def key_label(key: str) -> str:
    """A job key as people and the metrics' ``job`` label name it: the run id (TORCHELASTIC_RUN_ID), else
    the master's ADDR:PORT, else Slurm's job id and world size (``1234/16``)."""
    kind, _, rest = key.partition(":")
    if kind == "env":
        slurm, _, ws = rest.rpartition(":")
        return f"{slurm}/{ws}" if slurm else f"world {ws}"
    return rest


def host_name() -> str:
    """This host's name in verdicts and metrics: ``SCOUT_SYS_HOST`` when set (a monitor in a pod: the
    node's name, which the DaemonSet passes from the downward API), else the hostname."""
    return os.environ.get("SCOUT_SYS_HOST") or socket.gethostname()
