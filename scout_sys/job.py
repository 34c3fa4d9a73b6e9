"""Job selector → :class:`~scout_sys.model.Job`.

A *rank process* is a process whose environment names its rank and world size (``RANK`` and
``WORLD_SIZE`` as torchrun sets them, or the MPI / Slurm equivalents). Selectors:

- ``PID``: any process of the job. A launcher (torchrun, a shell script, mpirun, an srun step):
  its descendants are searched. A rank: its sibling ranks under the same launcher are searched
  (torchrun workers call setsid, so process groups alone would miss them).
- ``pgid:N``: every process of process group N and their descendants.
- ``PID,PID,...``: explicit rank processes.
- ``env:NAME=VALUE``: this host's rank processes whose environment holds NAME=VALUE (a Slurm job:
  ``env:SLURM_JOB_ID=1234``). Processes whose environment cannot be read are skipped; only when no
  readable one matches does the error say how many were skipped and why. ``env:NAME`` (no value):
  the ranks that have NAME at all, e.g. ``env:TORCHELASTIC_RUN_ID``, which torchrun sets for every job:
  whatever job runs on the host (a node-level agent); two such jobs at once are refused (BadSelector).

Ranks in their own PID namespace (containers, ``unshare --pid``) are found from the host: every pid
here is the host's (``/proc``, py-spy and eBPF all use it), and :attr:`Rank.container_pid` is the
rank's pid inside its namespace (the last ``NSpid`` of ``/proc/PID/status``), as the job's own logs
name it.

PyTorch Lightning's own launcher (``python train.py`` with ``Trainer(strategy="ddp", devices=N)``):
the script the user started is local rank 0 and the parent of the others, which carry LOCAL_RANK and
NODE_RANK but no RANK (scout_sys/lightning_ranks.py numbers them; that script is the launcher).

Ranks of one job share a job key (``TORCHELASTIC_RUN_ID``, else ``MASTER_ADDR:MASTER_PORT``).
Helpers of a rank (DataLoader workers, compile workers) inherit its environment; the topmost
Python process of each rank is the rank.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import replace

import psutil

from scout_sys import launchers, lightning_ranks
from scout_sys.errors import BadSelector, NoRanks, PermissionDenied, TargetGone
from scout_sys.model import Job, Rank
from scout_sys.rankenv import (
    LIGHTNING,
    _Candidate,
    _candidate,
    _environ,
    _int,
    container_pid,
    denied_hint,
    host_name,
    key_label,
)

__all__ = ["container_pid", "denied_hint", "find_job", "group_members", "with_layout", "_environ"]
from scout_sys.text import ranks_text

_ELSEWHERE = "run on other hosts"
_SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "fish"}


def _process(pid: int) -> psutil.Process:
    try:
        p = psutil.Process(pid)
        p.status()
        return p
    except psutil.NoSuchProcess as e:
        raise TargetGone(f"no process with pid {pid}", pid=pid) from e
    except psutil.AccessDenied as e:
        raise PermissionDenied(f"cannot inspect pid {pid}: {denied_hint()}", pid=pid) from e


def _descendants(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _launcher_kind(proc: psutil.Process | None) -> str:
    if proc is None:
        return "explicit"
    try:
        argv = proc.cmdline()
        name = proc.name()
    except psutil.Error:
        return "unknown"
    cmd = " ".join(argv)
    if "torchrun" in cmd or "torch.distributed.run" in cmd or "torch.distributed.launch" in cmd:
        return "torchrun"
    words = [os.path.basename(w) for w in argv]
    # `accelerate launch` runs torchrun's agent in its own process; `deepspeed` starts deepspeed.launcher.launch
    if any(w == "accelerate" and nxt == "launch" for w, nxt in zip(words, words[1:])):
        return "accelerate"
    if "deepspeed" in words[:3] or "deepspeed.launcher.launch" in words:
        return "deepspeed"
    for word, kind in (("mpirun", "mpirun"), ("mpiexec", "mpirun"), ("prted", "mpirun"),
                       ("orted", "mpirun"), ("srun", "srun"), ("slurmstepd", "srun")):
        if word in name or word in cmd.split(" ")[0]:
            return kind
    if name in _SHELLS:
        return "shell"
    if "python" in name:
        return "python"
    return name or "unknown"


def _pick_ranks(cands: Iterable[_Candidate]) -> list[_Candidate]:
    """One process per rank: Python over wrappers, then the topmost (helpers are its children)."""
    by_rank: dict[int, list[_Candidate]] = {}
    for c in cands:
        by_rank.setdefault(c.rank, []).append(c)
    chosen = []
    for _rank, cs in sorted(by_rank.items()):
        py = [c for c in cs if c.is_python] or cs
        pids = {c.pid for c in py}
        top = [c for c in py if c.ppid not in pids] or py
        chosen.append(min(top, key=lambda c: c.pid))
    return chosen


def _device(c: _Candidate) -> str:
    try:
        with open(f"/proc/{c.pid}/maps") as f:
            maps = f.read()
    except OSError:
        return "cpu"
    if "libcuda.so" not in maps:
        return "cpu"
    idx = c.local_rank or 0
    visible = [v for v in c.env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and idx < len(visible):
        return f"cuda:{visible[idx].strip()}"
    return f"cuda:{idx}"


def _zombie_children(launcher: psutil.Process | None) -> list[psutil.Process]:
    if launcher is None:
        return []
    out = []
    try:
        for ch in launcher.children():
            try:
                if ch.status() == psutil.STATUS_ZOMBIE:
                    out.append(ch)
            except psutil.NoSuchProcess:
                continue
    except psutil.NoSuchProcess:
        pass
    return out


def _build(cands: list[_Candidate], launcher: psutil.Process | None, selector: str) -> Job:
    cands, spawner, lightning_notes = lightning_ranks.number(cands)
    if spawner is not None:  # the script the user started is rank 0 and its peers' parent: the job's launcher
        try:
            launcher = psutil.Process(spawner)
        except psutil.NoSuchProcess:
            launcher = None
    if not cands:
        raise NoRanks(f"no rank processes found for --job {selector} "
                      "(looked for RANK/WORLD_SIZE in the environment of the process and its descendants; "
                      "the ranks may not have started yet: `watch` waits for them)")
    keys = sorted({c.key for c in cands})
    if len(keys) > 1:
        raise BadSelector(f"--job {selector} covers {len(keys)} different jobs ({', '.join(keys)}); "
                          "select one of them by a rank's pid")
    ranks_c = _pick_ranks(cands)
    host = host_name()
    world = max(c.world_size for c in ranks_c)
    found = {c.rank for c in ranks_c}
    notes: list[str] = list(lightning_notes)
    # Which ranks live on this host: the launcher's own facts (scout_sys/launchers.py), never a guess
    place = launchers.placement((c.rank, c.world_size, c.env) for c in ranks_c)
    expected: set[int] = set(place.ranks or ())
    anchor = next((c for c in ranks_c if c.local_rank is not None), None)
    unplaced = 0
    if place.ranks is not None:
        notes.append(f"{len(expected)} ranks expected on this host ({place.source})")
        why = _ELSEWHERE
    elif place.count is not None:
        unplaced = max(0, place.count - len(found))
        notes.append(f"{place.count} ranks live on this host ({place.source})")
        why = (f"{unplaced} of them should run on this host and were not found; which ones, the launcher does "
               "not say" if unplaced else _ELSEWHERE)
    else:
        why = "nothing in the ranks' environment says which ranks live on this host"
    missing = tuple(sorted(expected - found))
    # Ranks of the job not seen here: they can be neither witness nor origin, never missing.
    remote = tuple(sorted(set(range(world)) - (expected or found)))
    if remote:
        said = "run on other hosts: not observed here" if why == _ELSEWHERE else f"not observed here: {why}"
        notes.append(f"{ranks_text(remote)} {said} (one agent per host sees the whole job: docs/cluster.md)")
    ranks = tuple(
        Rank(
            rank=c.rank,
            pid=c.pid,
            host=host,
            local_rank=c.local_rank,
            world_size=c.world_size,
            group_rank=c.group_rank,
            device=_device(c),
            run_id=c.env.get("TORCHELASTIC_RUN_ID"),
            name=c.name,
            container_pid=container_pid(c.pid),
        )
        for c in ranks_c
    )
    if missing:
        zombies = _zombie_children(launcher)
        if len(missing) == 1 and len(zombies) == 1:
            # A dead rank whose launcher has not reaped it yet: its exit status is still readable.
            ranks += (Rank(rank=missing[0], pid=zombies[0].pid, host=host, world_size=world,
                           local_rank=missing[0] - (anchor.rank - (anchor.local_rank or 0)) if anchor else None,
                           name="<zombie>"),)
            notes.append(f"rank {missing[0]} is the zombie pid {zombies[0].pid}: the only rank missing and "
                         "the only unreaped child of the launcher")
            missing = ()
        elif zombies:
            notes.append("unreaped (zombie) children of the launcher: " + ", ".join(str(z.pid) for z in zombies))
    return Job(
        ranks=ranks,
        world_size=world,
        launcher=LIGHTNING if spawner is not None else _launcher_kind(launcher),
        launcher_pid=launcher.pid if launcher else None,
        host=host,
        missing=missing,
        notes=tuple(notes),
        remote=remote,
        unplaced=unplaced,
    )


def _candidates(pool: Iterable[psutil.Process]) -> list[_Candidate]:
    """Rank processes among ``pool``; unreadable ones are skipped unless nothing else is found."""
    out: list[_Candidate] = []
    denied: PermissionDenied | None = None
    for p in pool:
        try:
            c = _candidate(p)
        except PermissionDenied as e:
            denied = e
            continue
        if c is not None:
            out.append(c)
    if not out and denied is not None:
        raise denied
    return out


def _env_candidates(name: str, value: str | None) -> list[_Candidate]:
    """This host's rank processes whose environment holds ``name=value`` (``value`` None: ``name`` with
    any value). A process whose environment
    cannot be read (PID 1 of a sandbox, another user's as non-root) is skipped, never the end of the
    scan; when nothing matches, :class:`NoRanks` says how many were skipped and what would help."""
    out: list[_Candidate] = []
    denied: list[int] = []
    for p in _all_processes():
        try:
            c = _candidate(p)
        except PermissionDenied:
            denied.append(p.pid)
            continue
        if c is not None and (c.env.get(name) == value if value is not None else name in c.env):
            out.append(c)
    if out:
        return out
    msg = f"no rank process on this host has {name}{'' if value is None else '=' + value} in its environment"
    if denied:
        msg += (f" ({len(denied)} process{'es' if len(denied) > 1 else ''} whose environment could not be read "
                f"{'were' if len(denied) > 1 else 'was'} skipped, e.g. pid {denied[0]}: {denied_hint()})")
    raise NoRanks(msg)


def _nearest_launcher(proc: psutil.Process, key: str) -> psutil.Process | None:
    """The nearest ancestor that is not a rank process of the same job (None if that is init)."""
    cur = proc
    while True:
        try:
            parent = cur.parent()
        except psutil.NoSuchProcess:
            return None
        if parent is None or parent.pid <= 1:
            return None
        c = _candidate(parent)
        if c is None or c.key != key:
            return parent
        cur = parent


def _all_processes() -> list[psutil.Process]:
    return list(psutil.process_iter())


def with_layout(job: Job, topology: str | None = None) -> Job:
    """The job with its peer groups and each rank's coordinates (scout_sys.topology): from
    ``topology`` (``--topology``), else from the ranks' or launcher's command line and the config
    files it names; unchanged when neither says anything (consensus then groups by activity)."""
    from scout_sys import topology as topo

    pids = [r.pid for r in sorted(job.ranks, key=lambda r: r.rank)]
    if job.launcher_pid:
        pids.append(job.launcher_pid)
    cmdlines = (topo.read_cmdline(p) for p in ([] if topology else pids))
    found = topo.find_layout(job.world_size, topology, cmdlines)
    if found is None:
        return job
    lay, groups = found.layout, found.layout.groups()
    ranks = tuple(replace(r, coords=tuple(lay.coords(r.rank).items()) if 0 <= r.rank < lay.world_size else ())
                  for r in job.ranks)
    return replace(job, ranks=ranks, peer_groups=groups, layout=found.text, layout_source=found.source,
                   layout_from=found.where, notes=job.notes + (topo.note(found.text, groups),))


def find_job(selector: str, topology: str | None = None, key: str | None = None) -> Job:
    """Resolve a ``--job`` selector, with its layout (see :func:`with_layout`). ``key``: only the ranks of
    that job (one of :func:`job_keys`; a node monitor's selector covers several). Raises a
    :class:`~scout_sys.errors.ScoutError` subclass."""
    return with_layout(_find_job(selector, key), topology)


def job_keys(selector: str) -> dict[str, str]:
    """The jobs an ``env:`` selector covers on this host now, key → label (a node monitor's jobs, one
    watch each: watch/node.py); none yet: empty. The key is the one :func:`find_job` takes."""
    name, eq, value = _env_selector(selector)
    try:
        cands = _env_candidates(name, value if eq else None)
    except NoRanks:
        return {}
    return {k: key_label(k) for k in sorted({c.key for c in cands})}


def _env_selector(selector: str) -> tuple[str, str, str]:
    name, eq, value = selector.strip()[4:].partition("=") if selector.strip().startswith("env:") else ("", "", "")
    if not name or "\0" in name:
        raise BadSelector(f"bad selector {selector!r}: env:NAME=VALUE or env:NAME, e.g. env:SLURM_JOB_ID=1234")
    return name, eq, value


def group_members(pgid: int) -> list[psutil.Process]:
    """Every live process of process group ``pgid`` (race-safe: vanished ones are skipped)."""
    members = []
    for p in _all_processes():
        try:
            if os.getpgid(p.pid) == pgid:
                members.append(p)
        except OSError:
            continue
    return members


def _find_job(selector: str, key: str | None = None) -> Job:
    """The job ``selector`` names (``key``: only that job's candidates, as if the others were not there)."""
    def build(cands: list[_Candidate], launcher: psutil.Process | None) -> Job:
        return _build([c for c in cands if key is None or c.key == key], launcher, selector)

    sel = selector.strip()
    if sel.startswith("pgid:"):
        pgid = _int(sel[5:])
        if pgid is None or pgid <= 0:
            raise BadSelector(f"bad selector {selector!r}: pgid:N needs a positive number")
        members = group_members(pgid)
        if not members:
            raise TargetGone(f"no process in process group {pgid}")
        seen: dict[int, psutil.Process] = {}
        for p in members:
            seen[p.pid] = p
            for d in _descendants(p):
                seen[d.pid] = d
        cands = _candidates(seen.values())
        leader = next((p for p in members if p.pid == pgid), None)
        return build(cands, leader)
    if sel.startswith("env:"):
        # env:NAME=VALUE: this host's rank processes whose environment holds NAME=VALUE (e.g.
        # SLURM_JOB_ID, TORCHELASTIC_RUN_ID): how an agent started beside the job finds it.
        # env:NAME: the ranks that have NAME at all (whatever job runs here: a node-level agent).
        name, eq, value = _env_selector(sel)
        cands = [c for c in _env_candidates(name, value if eq else None) if key is None or c.key == key]
        if not cands:
            raise NoRanks(f"no rank process of job {key_label(key or '')} has {sel[4:]} in its environment any more")
        try:
            launcher = _nearest_launcher(psutil.Process(cands[0].pid), cands[0].key)
        except psutil.NoSuchProcess:
            launcher = None
        return build(cands, launcher)
    if "," in sel:
        pids = [_int(x.strip()) for x in sel.split(",") if x.strip()]
        if not pids or any(p is None or p <= 0 for p in pids):
            raise BadSelector(f"bad selector {selector!r}: expected PID,PID,... of rank processes")
        cands = []
        for pid in pids:
            assert pid is not None
            c = _candidate(_process(pid))
            if c is None:
                raise NoRanks(f"pid {pid} is not a rank process (no RANK/WORLD_SIZE in its environment)",
                              pid=pid)
            cands.append(c)
        job = build(cands, None)
        return job
    pid = _int(sel)
    if pid is None or pid <= 0:
        raise BadSelector(f"bad selector {selector!r}: expected PID, pgid:N, env:NAME=VALUE, env:NAME or PID,PID,...")
    proc = _process(pid)
    me = _candidate(proc)
    if me is not None:
        launcher = _nearest_launcher(proc, me.key)
        if launcher is not None:
            pool = _descendants(launcher)
        else:  # orphaned ranks (launcher gone or init): the same job anywhere on this host
            pool = _all_processes()
        cands = [c for c in _candidates(pool) if c.key == me.key]
        if me.pid not in {c.pid for c in cands}:
            cands.append(me)
        return build(cands, launcher)
    cands = _candidates(_descendants(proc))
    return build(cands, proc)
