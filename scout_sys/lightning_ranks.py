"""PyTorch Lightning's own launcher: the ranks it starts, numbered from the facts it leaves.

``Trainer(strategy="ddp", devices=N)`` run as ``python train.py`` (no torchrun, no Slurm) starts the
job from inside the script (lightning.fabric's ``_SubprocessScriptLauncher``): the process the user
started is local rank 0, and it starts a copy of itself (``[sys.executable, script] + argv[1:]``) for
each local rank 1..N-1, whose environment holds MASTER_ADDR, MASTER_PORT, NODE_RANK, LOCAL_RANK and
WORLD_SIZE (N x nodes), and no RANK. Rank 0 itself carries none of them in /proc (it set them in its
own ``os.environ`` after it started). So:

- the children are found by their variables (:func:`scout_sys.rankenv.is_lightning_child`);
- their common parent, when it runs the same script with the same arguments, is local rank 0, with
  the children's job key and environment (LOCAL_RANK=0);
- the ranks per node are the local ranks seen (rank 0 and its children: 1 + the highest LOCAL_RANK),
  and the global rank is ``NODE_RANK * per_node + LOCAL_RANK`` (Lightning's own arithmetic). On node 0
  that is LOCAL_RANK whatever the count; on another node a count that does not divide WORLD_SIZE
  means a child is gone and no rank can be numbered: the job is not found (never numbered wrong);
- the process the user started (rank 0) is the job's launcher: its end is the job's end.

Which ranks live on this host is :mod:`scout_sys.launchers`' answer, as for every launcher (a
loopback MASTER_ADDR: every rank; else nothing is said, and ranks not seen are not observed here).
"""

from __future__ import annotations

import os
from dataclasses import replace

import psutil

from scout_sys.errors import NoRanks
from scout_sys.rankenv import LIGHTNING, _Candidate


def _script_args(argv: list[str]) -> tuple[str, list[str]] | None:
    """(what runs: the script's file name or ``-m module``, its arguments) of a Python command line."""
    if len(argv) < 2:
        return None
    if argv[1] == "-m" and len(argv) >= 3:
        return f"-m {argv[2]}", argv[3:]
    if argv[1].startswith("-"):
        return None
    return os.path.basename(argv[1]), argv[2:]


def _same_script(parent: psutil.Process, child: psutil.Process) -> bool:
    """``parent`` runs what its Lightning child runs, with the same arguments (the child is a copy of it)."""
    try:
        mine, theirs = _script_args(parent.cmdline()), _script_args(child.cmdline())
    except psutil.Error:
        return False
    return mine is not None and mine == theirs


def number(cands: list[_Candidate]) -> tuple[list[_Candidate], int | None, list[str]]:
    """``cands`` with Lightning's children numbered globally and their parent added as local rank 0;
    the parent's pid (the launcher) or None when no Lightning child is among them; notes for people.
    Children whose parent is not a copy of them are dropped (their global rank cannot be told)."""
    kids = [c for c in cands if c.family == LIGHTNING]
    if not kids:
        return cands, None, []
    rest = [c for c in cands if c.family != LIGHTNING]
    kid_pids = {c.pid for c in kids}
    kids = [c for c in kids if c.ppid not in kid_pids]  # not a rank's helpers (DataLoader workers)
    by_parent: dict[tuple[str, int], list[_Candidate]] = {}
    for c in kids:
        by_parent.setdefault((c.key, c.ppid), []).append(c)
    out, launcher, notes = list(rest), None, []
    for (_key, ppid), group in sorted(by_parent.items()):
        try:
            parent = psutil.Process(ppid)
            ok = _same_script(parent, psutil.Process(group[0].pid))
            name, grandparent = parent.name(), parent.ppid()
        except psutil.Error:
            ok, name, grandparent = False, "", 0
        if not ok:
            notes.append(f"pids {', '.join(str(c.pid) for c in group)} carry Lightning's launcher variables but "
                         f"their parent {ppid} does not run their script: not numbered")
            continue
        world = group[0].world_size
        node = int(group[0].env["NODE_RANK"])
        per_node = 1 + max(int(c.env["LOCAL_RANK"]) for c in group)
        if node > 0 and world % per_node:
            raise NoRanks(f"Lightning's launcher on node {node}: {per_node} local ranks seen, which does not divide "
                          f"WORLD_SIZE={world} (a local rank is gone): the global ranks cannot be told")
        base = node * per_node
        out += [replace(c, rank=base + int(c.env["LOCAL_RANK"])) for c in group]
        if all(c.pid != ppid for c in rest):
            out.append(replace(group[0], pid=ppid, ppid=grandparent, rank=base, local_rank=0, name=name,
                               is_python=True, env={**group[0].env, "LOCAL_RANK": "0"}))
        launcher = ppid
        notes.append(f"PyTorch Lightning's launcher: pid {ppid} (the script started) is local rank 0 of node {node} "
                     f"and started local ranks 1-{per_node - 1}; global rank = NODE_RANK x {per_node} + LOCAL_RANK")
    return out, launcher, notes
