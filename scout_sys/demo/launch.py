"""Start and stop demo jobs (used by ``scout-sys demo``, the tests and the benchmarks).

Never imports torch: the job runs in its own processes. Every process of a job carries a marker
variable (``SCOUT_DEMO_JOB=<id>``) in its environment, so :meth:`DemoJob.stop` finds and kills all of
them — ranks in their own sessions (torchrun workers call setsid), helpers they forked, orphans —
by pid and process group, never by name.
"""

from __future__ import annotations

import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

MARKER = "SCOUT_DEMO_JOB"


# Below the kernel's ephemeral range (ip_local_port_range, 32768-60999 by default), which every
# outgoing connection draws from: a port from bind(0) is free only until the next connect() of any
# job on the host takes it (Gloo opens one per peer), and the launcher's later bind then fails with
# EADDRINUSE. Here only another explicit bind can collide, and that is checked.
PORTS = (15000, 32000)


def free_port() -> int:
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        port = rng.randrange(*PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # everything taken: let the kernel choose
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pids_with_marker(job_id: str) -> list[int]:
    """Every process whose environment carries ``SCOUT_DEMO_JOB=job_id``."""
    needle = f"{MARKER}={job_id}".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.append(int(name))
        except OSError:
            continue
    return out


class DemoJob:
    """A demo (or any) training job started in its own session, with its output in a log file.

    ``launcher``: ``torchrun`` (python -m torch.distributed.run) or ``shell`` (one plain process
    per rank under ``bash``, with RANK / WORLD_SIZE / MASTER_* set by the script).
    ``module`` / ``script``: what each rank runs (default: the demo trainer).
    ``nnodes`` / ``node_rank`` / ``port``: one node's launcher of a multi-node torchrun job (static
    rendezvous on 127.0.0.1:``port``); start one DemoJob per node rank with the same port.
    """

    def __init__(self, nproc: int = 4, *, fault: str = "none", fault_rank: int = 2, fault_step: int = 5,
                 launcher: str = "torchrun", args: list[str] | None = None, script: str | None = None,
                 module: str = "scout_sys.demo.train", torchrun_args: list[str] | None = None,
                 python: str | None = None, env: dict[str, str] | None = None, nnodes: int = 1,
                 node_rank: int = 0, port: int | None = None, cwd: str | None = None) -> None:
        self.nproc = nproc
        self.launcher = launcher
        self.id = uuid.uuid4().hex[:12]
        self.python = python or sys.executable
        target = [script] if script else ["-m", module]
        train_args = list(args or [])
        if script is None:
            train_args += ["--fault", fault, "--fault-rank", str(fault_rank), "--fault-step", str(fault_step)]
        self.port = port or free_port()
        if launcher == "torchrun":
            tr = ["--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port",
                  str(self.port), *(torchrun_args or [])]
            if nnodes > 1:  # one launcher of a multi-node job (run the others with the same port)
                tr += ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--rdzv-backend", "static"]
            if script is None:
                tr.append("-m")
                target = [module]
            self.cmd = [self.python, "-m", "torch.distributed.run", *tr, *target, *train_args]
        elif launcher == "shell":
            run = " ".join(shlex.quote(x) for x in [self.python, *target, *train_args])
            body = (f"export MASTER_ADDR=127.0.0.1 MASTER_PORT={self.port} WORLD_SIZE={nproc}\n"
                    f"for r in $(seq 0 {nproc - 1}); do RANK=$r LOCAL_RANK=$r {run} & done\nwait\n")
            self.cmd = ["bash", "-c", body]
        else:
            raise ValueError(f"unknown launcher {launcher!r}")
        self.env = dict(os.environ, **(env or {}))
        self.env[MARKER] = self.id
        self.env.setdefault("OMP_NUM_THREADS", "1")
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.log_path = os.path.join(tempfile.gettempdir(), f"scout-demo-{self.id}.log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.cwd = cwd

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> DemoJob:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd,
                                         start_new_session=True, stdin=subprocess.DEVNULL)
        return self

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def wait_for(self, pattern: str, timeout: float = 60.0, count: int = 1) -> re.Match[str]:
        """Wait until ``pattern`` has appeared ``count`` times in the job's output."""
        rx = re.compile(pattern)
        end = time.time() + timeout
        while True:
            found = list(rx.finditer(self.log()))
            if len(found) >= count:
                return found[count - 1]
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"job ended (exit {self.proc.returncode}) before {pattern!r}:\n{self.log()[-3000:]}")
            if time.time() > end:
                raise TimeoutError(f"no {pattern!r} within {timeout:g}s:\n{self.log()[-3000:]}")
            time.sleep(0.1)

    # A job's first steps wait for its ranks to import torch (a few CPU-seconds each): on a 2-core host
    # that other jobs keep busy, four ranks and their launcher can take a minute.
    def wait_fault(self, timeout: float = 120.0) -> int:
        """Wait for the fault marker; returns the faulty rank's pid."""
        m = self.wait_for(r"SCOUT-DEMO fault kind=\S+ rank=\d+ step=\d+ pid=(\d+)", timeout)
        return int(m.group(1))

    def wait_steps(self, n: int = 1, timeout: float = 120.0) -> None:
        self.wait_for(r"SCOUT-DEMO step ", timeout, count=n)

    def pids(self) -> list[int]:
        return pids_with_marker(self.id)

    def stop(self) -> None:
        """Kill every process of the job (SIGKILL works on stopped ones too) and reap the launcher."""
        for _ in range(3):
            pids = self.pids()
            if self.proc is not None and self.proc.poll() is None:
                pids.append(self.proc.pid)
            if not pids:
                break
            groups = set()
            for p in pids:
                try:
                    groups.add(os.getpgid(p))
                except OSError:
                    pass
            for g in groups:
                if g > 1 and g != os.getpgrp():
                    try:
                        os.killpg(g, signal.SIGKILL)
                    except OSError:
                        pass
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            if self.proc is not None:
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            time.sleep(0.2)
        try:
            os.unlink(self.log_path)
        except OSError:
            pass

    def __enter__(self) -> DemoJob:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
