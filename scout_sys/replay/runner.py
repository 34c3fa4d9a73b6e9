"""Start one worker per device beside the live job, run replay rounds, decide, keep a ledger.

The monitor side of replay: it never imports torch. Workers (``worker.py``) are started in their
own sessions (they never join the job's process group), die with us (``PR_SET_PDEATHSIG``), and
are killed by process group when the round ends, on error and on SIGINT. A worker for a rank in
another mount namespace (a container) enters that namespace before exec (``_preexec``).
"""

from __future__ import annotations

import errno
import json
import os
import selectors
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from scout_sys.consensus import replay as rules
from scout_sys.errors import ScoutError
from scout_sys.model import DeviceRound, Diagnosis, Incident, Job, KernelResult, RankView
from scout_sys.replay.child import preexec as _preexec
from scout_sys.replay.context import (
    Context,
    Device,
    context_of,
    devices_of,
    memory_available,
    memory_headroom,
    rank_path,
)

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
MEMORY_SHARE = 0.25  # of MemAvailable (CPU) / free device memory (GPU), for all workers together
WORKER_BASELINE = 640 << 20  # what a worker needs beyond its kernels: the interpreter and torch
MIN_HEADROOM = 1 << 30  # a rank's memory cgroup is joined only with this much left under its limit
READY_TIMEOUT = 120.0
ROUND_TIMEOUT = 300.0


class ReplayError(ScoutError):
    """Replay could not run (no memory to spare, workers that failed to start...)."""


class ReplayCancelled(ReplayError):
    """``stop`` was set while a round ran (the workers are stopped all the same)."""


@dataclass
class _Worker:
    device: Device
    ctx: Context
    proc: subprocess.Popen[bytes] | None  # None: it could not start (``error`` says why)
    stderr: IO[bytes] | None
    buf: bytes = b""
    ready: dict[str, Any] | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)


def _cgroups_of(pid: int) -> set[str]:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return {ln.split(":", 2)[2] for ln in f.read().splitlines() if ln.count(":") >= 2}
    except OSError:
        return set()


class WorkerSet:
    """The workers of one replay session: ``start()``, ``round(n)`` any number of times, ``close()``."""

    def __init__(self, job: Job, *, size: str = "default", reps: int = 3, seed: int = 1234,
                 checkpoint: str | None = None, memory_share: float = MEMORY_SHARE,
                 devices: Sequence[Device] | None = None, stop: threading.Event | None = None) -> None:
        self.job = job
        self.stop = stop or threading.Event()
        self.devices = list(devices) if devices is not None else devices_of(job)
        self.spec = {"size": size, "reps": reps, "seed": seed,
                     "checkpoint": os.path.abspath(checkpoint) if checkpoint else None}
        self.memory_share = memory_share
        self.workers: list[_Worker] = []
        self.notes: list[str] = []
        self._sel = selectors.DefaultSelector()

    # ------------------------------------------------------------------ start / stop
    def _budget(self) -> int:
        n_cpu = sum(1 for d in self.devices if d.kind == "cpu")
        if not n_cpu:
            return 0
        each = int(memory_available() * self.memory_share / n_cpu)
        if each < WORKER_BASELINE:
            raise ReplayError(f"not enough free memory for {n_cpu} replay workers: {self.memory_share:.0%} of "
                              f"MemAvailable is {each >> 20} MiB each, a worker needs {WORKER_BASELINE >> 20} MiB")
        return min(each, 4 * WORKER_BASELINE)

    def start(self, timeout: float = READY_TIMEOUT) -> None:
        if not self.devices:
            raise ReplayError("the job has no rank on this host to replay beside")
        budget = self._budget()
        try:
            ctxs = [context_of(dev.pid) for dev in self.devices]
            ckpts = self._checkpoints(ctxs)
            for dev, ctx, ckpt in zip(self.devices, ctxs, ckpts):
                self._spawn(dev, budget, ctx, ckpt)
            self._wait(lambda w: w.ready is not None or w.error is not None, timeout, "start")
            for w in self.workers:
                if w.ready is not None:
                    self._join_cgroups(w)
        except BaseException:
            self.close()
            raise

    def _checkpoints(self, ctxs: Sequence[Context]) -> list[str | None]:
        """The checkpoint's path for each device's worker, in its rank's mount namespace. Every worker
        replays it or none does: a worker without its kernels would disagree with its peers on them."""
        path = self.spec["checkpoint"]
        if not path:
            return [None] * len(ctxs)
        out = [path if ctx.mntns is None else rank_path(dev.pid, path) for dev, ctx in zip(self.devices, ctxs)]
        missing = [dev.name for dev, ctx, p in zip(self.devices, ctxs, out) if p is None and ctx.error is None]
        if missing:
            self.notes.append(f"checkpoint {path} is not visible in the mount namespace of the rank(s) of "
                              f"{', '.join(missing)} (a container that does not mount it): its kernels are not "
                              "replayed on any device")
            return [None] * len(ctxs)
        return out

    def _spawn(self, dev: Device, budget: int, ctx: Context | None = None, checkpoint: str | None = None) -> None:
        ctx = ctx or context_of(dev.pid)
        if ctx.error:
            self._failed(dev, ctx, ctx.error)
            return
        env = dict(ctx.env)
        spec = dict(self.spec, device="cpu", checkpoint=checkpoint)
        if dev.kind == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = dev.visible or "0"
            env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
            spec.update(device="cuda:0", memory_bytes=self._gpu_budget(dev))
        with open(WORKER) as f:
            source = f.read()
        what = f"cannot enter the mount namespace of rank pid {dev.pid}: {{}}: replay off for that device"
        nsfd = rd = wr = None
        try:
            if ctx.mntns is not None:
                try:
                    nsfd = os.open(f"/proc/{dev.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
                    if os.fstat(nsfd).st_ino != ctx.mntns:  # the pid is another process's now
                        raise OSError(errno.ESRCH, "the rank is gone")
                except OSError as e:
                    self._failed(dev, ctx, what.format(e.strerror or e))
                    return
                rd, wr = os.pipe2(os.O_CLOEXEC)
            err = tempfile.TemporaryFile()
            try:
                # CPython's _posixsubprocess (child_exec, the same order in 3.9 to 3.13: dup2 of stdio,
                # chdir(cwd), umask, setsid, setgroups/setregid/setreuid, preexec_fn, close fds, exec;
                # never vfork with a preexec_fn) chdirs to cwd= *before* preexec_fn, i.e. still in our
                # namespace, where the rank's folder may not exist. (A preexec_fn sees cwd= as its
                # working directory on 3.9.18, 3.10.13, 3.11.7, 3.12.1 and 3.13.0, checked.) So cwd= is
                # our "/" and the preexec goes to the rank's folder once inside its namespace.
                proc = subprocess.Popen([ctx.python, "-c", source, json.dumps(spec)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=err,
                                        cwd="/" if ctx.mntns is not None else ctx.cwd, env=env,
                                        start_new_session=True,
                                        preexec_fn=_preexec(ctx, budget if dev.kind == "cpu" else None, nsfd, wr,
                                                            what))
            except (OSError, subprocess.SubprocessError) as e:
                err.close()
                said = b""
                if rd is not None and wr is not None:
                    os.close(wr)
                    wr = None
                    os.set_blocking(rd, False)  # another thread's child may hold it until its own exec
                    try:
                        said = os.read(rd, 4096)
                    except BlockingIOError:
                        pass
                where = " in its mount namespace" if ctx.mntns is not None else ""
                self._failed(dev, ctx, said.decode(errors="replace") if said else
                             f"cannot start the worker ({ctx.python}{where}): {getattr(e, 'strerror', None) or e}")
                return
        finally:
            for fd in (nsfd, rd, wr):
                if fd is not None:
                    os.close(fd)
        w = _Worker(dev, ctx, proc, err, notes=list(ctx.notes))
        self.workers.append(w)
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        self._sel.register(proc.stdout, selectors.EVENT_READ, w)

    def _failed(self, dev: Device, ctx: Context, why: str) -> None:
        """A device whose worker could not start: no result for it, one line that says why."""
        self.workers.append(_Worker(dev, ctx, None, None, error=why, notes=list(ctx.notes)))

    def _join_cgroups(self, w: _Worker) -> None:
        """Move the worker (every thread) into its rank's cgroups, and lower its session's priority,
        once torch is imported: the kernels run under the rank's quotas and yield to the job, the
        start-up does not crawl through them."""
        try:  # with sched_autogroup a new session is its own scheduling group: nice the group too
            with open(f"/proc/{w.proc.pid}/autogroup", "w") as f:
                f.write(f"{w.ctx.nice}\n")
        except OSError:
            pass
        for procs in w.ctx.cgroup_procs:
            room = memory_headroom(procs)
            if room is not None and room < MIN_HEADROOM:
                w.notes.append(f"{w.device.name}: not joining {os.path.dirname(procs)}: {room >> 20} MiB left under "
                               "its memory limit, the worker could push the rank to the OOM killer")
                continue
            try:
                with open(procs, "w") as f:
                    f.write(f"{w.proc.pid}\n")
            except OSError:
                pass
        missing = _cgroups_of(w.device.pid) - _cgroups_of(w.proc.pid)
        if missing and not any("not joining" in n for n in w.notes):
            w.notes.append(f"{w.device.name}: could not join the rank's cgroup(s) {', '.join(sorted(missing))}")

    def _gpu_budget(self, dev: Device) -> int | None:
        try:
            import pynvml as nv

            nv.nvmlInit()
            try:
                h = nv.nvmlDeviceGetHandleByIndex(dev.index) if dev.index is not None else \
                    nv.nvmlDeviceGetHandleByUUID(dev.uuid)
                return int(nv.nvmlDeviceGetMemoryInfo(h).free * self.memory_share)
            finally:
                nv.nvmlShutdown()
        except Exception:  # noqa: BLE001 - without NVML, torch's own fraction of the total stays at 25%
            return None

    def close(self) -> None:
        """Every worker gone: ask them to quit, then kill their process groups, and reap."""
        for w in self.workers:
            if w.proc is None:
                continue
            try:
                if w.proc.poll() is None and w.proc.stdin:
                    w.proc.stdin.write(b"quit\n")
                    w.proc.stdin.flush()
            except OSError:
                pass
        end = time.monotonic() + 2.0
        for w in self.workers:
            if w.proc is None:
                continue
            try:
                w.proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            if w.proc.poll() is None:
                try:
                    os.killpg(w.proc.pid, signal.SIGKILL)  # its own session: never the job's group
                except OSError:
                    pass
                w.proc.wait()
            for f in (w.proc.stdin, w.proc.stdout, w.stderr):
                try:
                    if f:
                        f.close()
                except OSError:
                    pass
        self.workers = []
        self._sel.close()

    def __enter__(self) -> WorkerSet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ I/O
    def _pump(self, timeout: float) -> list[tuple[_Worker, dict[str, Any]]]:
        out = []
        for key, _ in self._sel.select(timeout):
            w: _Worker = key.data
            try:
                chunk = os.read(key.fileobj.fileno(), 1 << 16)  # type: ignore[union-attr]
            except BlockingIOError:
                continue
            if not chunk:
                self._sel.unregister(key.fileobj)
                if w.error is None:
                    w.error = self._died(w)
                continue
            w.buf += chunk
            while b"\n" in w.buf:
                line, w.buf = w.buf.split(b"\n", 1)
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if msg.get("event") == "ready":
                    w.ready = msg
                    w.notes += [f"{w.device.name}: {n}" for n in msg.get("notes", ())]
                elif msg.get("event") == "error":
                    w.error = str(msg.get("error"))
                out.append((w, msg))
        return out

    def _died(self, w: _Worker) -> str:
        assert w.proc is not None and w.stderr is not None
        w.proc.wait()
        w.stderr.seek(0)
        tail = [ln for ln in w.stderr.read()[-4000:].decode(errors="replace").splitlines() if ln.strip()]
        rc = w.proc.returncode
        how = f"killed by signal {-rc}" if rc < 0 else f"exited with {rc}"
        return f"worker {how}" + (f": {tail[-1][:300]}" if tail else "")

    def _wait(self, done: Callable[[_Worker], bool], timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while not all(done(w) for w in self.workers):
            self._check_stop()
            left = end - time.monotonic()
            if left <= 0:
                for w in self.workers:
                    if not done(w):
                        w.error = f"no answer within {timeout:g} s ({what})"
                return
            self._pump(min(left, 0.5))

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise ReplayCancelled("replay stopped")

    # ------------------------------------------------------------------ rounds
    def round(self, n: int, timeout: float = ROUND_TIMEOUT) -> list[DeviceRound]:
        """Every live worker runs the kernels once, at the same time; their results."""
        results: dict[int, dict[str, Any]] = {}
        live = [w for w in self.workers if w.error is None and w.ready is not None]
        for w in live:
            try:
                assert w.proc.stdin is not None
                w.proc.stdin.write(f"go {n}\n".encode())
                w.proc.stdin.flush()
            except OSError:
                w.error = self._died(w)
        end = time.monotonic() + timeout
        while any(id(w) not in results and w.error is None for w in live) and time.monotonic() < end:
            self._check_stop()
            for w, msg in self._pump(min(0.5, max(0.0, end - time.monotonic()))):
                if msg.get("event") == "round" and msg.get("round") == n:
                    results[id(w)] = msg
        out = []
        for w in self.workers:
            info = {k: w.ready.get(k) for k in ("torch", "capability", "threads", "device_name", "uid")} \
                if w.ready else {}
            info = {k: v for k, v in info.items() if v is not None}
            if w.ready:
                info["python"] = w.ctx.python
            msg = results.get(id(w))
            if msg is None:
                err = w.error or f"no result within {timeout:g} s"
                out.append(DeviceRound(w.device.name, w.device.ranks, _kind(w), error=err, info=info))
                continue
            ks = {k: KernelResult(str(v["digest"]), float(v["seconds"]), bool(v.get("stable", True)))
                  for k, v in msg["kernels"].items()}
            out.append(DeviceRound(w.device.name, w.device.ranks, _kind(w), ks, info=info))
        return out

    def all_notes(self) -> list[str]:
        return self.notes + [n for w in self.workers for n in w.notes]


def _kind(w: _Worker) -> str:
    torch = (w.ready or {}).get("torch", "?")
    return f"{w.device.kind}:{(w.ready or {}).get('device_name') if w.device.kind == 'cuda' else w.device.model}" \
           f" torch {torch}"


# --------------------------------------------------------------------------- one replay session


@dataclass(frozen=True)
class ReplayResult:
    """What ``replay`` prints: the Diagnosis, every round's per-device results, and per round the
    digest and time verdicts (for the human table and the ledger)."""

    diagnosis: Diagnosis
    rounds: tuple[tuple[DeviceRound, ...], ...]
    digests: tuple[rules.DigestVerdict, ...]
    times: tuple[rules.SlowVerdict, ...]
    ended: tuple[float, ...] = ()  # when each round ended (clock; the ledger's "time")


def run_rounds(job: Job, rounds: int = 2, *, size: str = "default", reps: int = 3, seed: int = 1234,
               checkpoint: str | None = None, state_dir: str | None = None,
               clock: Callable[[], float] = time.time, stop: threading.Event | None = None,
               ident: dict[str, Any] | None = None, covers: str | None = None) -> ReplayResult:
    """Start the workers, run ``rounds`` rounds, stop them; decide; append each round to the ledger
    under ``state_dir`` (none when ``state_dir`` is None). The library entry point of ``replay``
    (and of ``watch``, to tell a slow device from a slow network: see ``replay/live.py``). Setting
    ``stop`` from another thread ends it within a second with ReplayCancelled, workers gone.
    ``ident``: the job's identity for the ledger (``ledger.identity``, read now when None);
    ``covers``: the newest checkpoint the job wrote before this session (recorded with each round)."""
    if rounds < 1:
        raise ScoutError("--rounds must be at least 1")
    t0 = clock()
    all_rounds: list[tuple[DeviceRound, ...]] = []
    digests: list[rules.DigestVerdict] = []
    times: list[rules.SlowVerdict] = []
    ended: list[float] = []
    ws = WorkerSet(job, size=size, reps=reps, seed=seed, checkpoint=checkpoint, stop=stop)
    if state_dir and ident is None:
        from scout_sys.replay.ledger import identity

        ident = identity(job)  # while the job runs: its pids and cwd are gone after it
    uuids = {d.name: d.uuid for d in ws.devices if d.uuid}
    with ws:
        for n in range(1, rounds + 1):
            started = clock()
            res = tuple(ws.round(n))
            ended.append(clock())
            all_rounds.append(res)
            digests.append(rules.vote_digests(res))
            times.append(rules.vote_times(res))
            if state_dir:
                from scout_sys.replay.ledger import append

                append(state_dir, job, started, ended[-1], res, digests[-1], times[-1], ident=ident,
                       checkpoint=covers, uuids=uuids)
        notes = ws.all_notes()
    return ReplayResult(_diagnose(job, all_rounds, digests, times, t0, clock(), notes),
                        tuple(all_rounds), tuple(digests), tuple(times), tuple(ended))


def run_round(job: Job, **kw: Any) -> ReplayResult:
    """One round (digests only: a slow device needs ``run_rounds(job, 2)`` to be confirmed)."""
    return run_rounds(job, 1, **kw)


def _diagnose(job: Job, rounds: Sequence[Sequence[DeviceRound]], digests: Sequence[rules.DigestVerdict],
              times: Sequence[rules.SlowVerdict], t0: float, t1: float, notes: list[str]) -> Diagnosis:
    incidents: list[Incident] = []
    seen: set[tuple] = set()
    for res, dv in zip(rounds, digests):
        for inc in rules.sdc_incidents(job, res, dv, t0):
            if inc.key() not in seen:  # the same finding in several rounds is one incident
                seen.add(inc.key())
                incidents.append(inc)
    slow = rules.confirm_slow(job, rounds[-1], times, t0)
    if slow is not None:
        incidents.append(slow)
    last = rounds[-1]
    errors = [d for d in last if d.error]
    views = {}
    slow_ranks = set(slow.ranks) if slow is not None else set()
    for d in last:
        state = "error" if d.error else "divergent" if d.device in digests[-1].divergent else \
            "slow" if slow_ranks & set(d.ranks) else "agrees"
        for r in d.ranks:
            views[r] = RankView(rank=r, state=state, where=d.device)
    out_notes = list(job.notes) + notes + [n for dv in digests[-1:] for n in dv.notes]
    out_notes += [f"{d.device}: no result ({d.error})" for d in errors]
    if len(rounds) < rules.CONFIRM:
        out_notes.append(f"times are judged over {rules.CONFIRM} rounds or more: a slow device cannot be "
                         "confirmed in one")
    return Diagnosis(time=t1, job=job, views=views, incidents=tuple(incidents),
                     probes={"replay": None if not errors else f"{len(errors)} device(s) gave no result"},
                     window=t1 - t0, notes=tuple(out_notes))
