"""Real jobs for the eBPF tests: a 4-rank torchrun Gloo job started and killed by pid, never by name."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from scout_sys.demo.launch import free_port  # below the ephemeral range: no connect() takes it
from scout_sys.model import Job, Rank
from tests._host import ebpf_reason

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "tests" / "jobs" / "gloo_job.py"


def ebpf_skip_reason() -> str | None:
    """Why real eBPF cannot run here (the tests skip with this reason), or None: checked by the tests
    themselves (tests/_host.py), never by the product's availability functions."""
    return ebpf_reason()




class TorchrunJob:
    """``torchrun --nproc-per-node N tests/jobs/gloo_job.py ARGS``; waits on a go-file to step."""

    def __init__(self, tmp: Path, *args: str, nproc: int = 4) -> None:
        self.tmp = tmp
        self.go = tmp / "go"
        self.nproc = nproc
        self.log = tmp / "job.log"
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
               "--master-addr=127.0.0.1", f"--master-port={free_port()}",
               str(JOB), "--go", str(self.go), *args]
        self._logf = open(self.log, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._logf, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, cwd=ROOT)
        self.rank_pids: dict[int, int] = {}

    def wait_ranks(self, timeout: float = 90.0) -> Job:
        """The rank processes, once all are past ``init_process_group`` (they hold the go-wait)."""
        deadline = time.monotonic() + timeout
        launcher = psutil.Process(self.proc.pid)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"torchrun exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            found: dict[int, int] = {}
            for child in launcher.children(recursive=True):
                try:
                    env = child.environ()
                except (psutil.Error, OSError):
                    continue
                if "RANK" in env and "LOCAL_RANK" in env:
                    found.setdefault(int(env["RANK"]), child.pid)
            if len(found) == self.nproc and all(self._mapped_torch(p) for p in found.values()):
                self.rank_pids = found
                time.sleep(0.5)
                ranks = tuple(Rank(rank=r, pid=p, host=socket.gethostname(), local_rank=r,
                                   world_size=self.nproc) for r, p in sorted(found.items()))
                return Job(ranks=ranks, world_size=self.nproc, launcher="torchrun",
                           launcher_pid=self.proc.pid, host=socket.gethostname())
            time.sleep(0.2)
        raise TimeoutError(f"ranks did not come up:\n{self.log.read_text()[-3000:]}")

    @staticmethod
    def _mapped_torch(pid: int) -> bool:
        try:
            return "libtorch_cpu.so" in Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            return False

    def start_stepping(self) -> None:
        self.go.touch()

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL the ranks (and their process groups: torchrun workers call setsid) and the launcher."""
        for pid in list(self.rank_pids.values()) + [self.proc.pid]:
            for fn in (os.killpg, os.kill):
                try:
                    fn(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self._logf.close()

    def __enter__(self) -> TorchrunJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
