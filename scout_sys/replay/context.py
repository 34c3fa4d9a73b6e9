"""Where and how a replay worker runs: the job's devices, and each rank's execution context.

A worker runs *as its rank runs*: the rank's interpreter (its venv kept: the rank's ``argv[0]``
when it is the same file as ``/proc/PID/exe``), the directory of the torch the rank loaded first on
``sys.path`` (from ``/proc/PID/maps``), the rank's environment (``/proc/PID/environ``, as it was at
exec), working directory, CPU affinity and cgroups, at a lower priority and with bounded memory.

A rank in a container (another mount namespace: a Kubernetes pod seen by the DaemonSet, a docker or
podman rank seen from the host) names its interpreter, torch and working directory in its own
namespace's terms. ``Context.mntns`` is then set and the worker enters that namespace before exec
(``replay/child.py``); every path here stays in the rank's terms, and checks on them are made through
``/proc/PID/root`` (:func:`in_root`), never against the monitor's own files.

GPU ranks: the device is the rank's GPU by physical index and UUID, from NVML (pid → device) when
the driver answers, else from ``CUDA_VISIBLE_DEVICES`` and ``LOCAL_RANK`` (``Rank.device``). One
worker per GPU, whatever the number of ranks on it. CPU ranks: each rank is its own device.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scout_sys.job import _environ
from scout_sys.model import Job, Rank

NICE_DELTA = 10  # workers run this much nicer than their rank
WORKER_MARK = "SCOUT_REPLAY_WORKER"  # in every worker's environment (job discovery skips them)


@dataclass(frozen=True)
class Device:
    name: str  # "cpu/rank2", "cuda:3"
    kind: str  # "cpu" | "cuda"
    model: str  # CPU model name / GPU product name: devices of one model are peers
    ranks: tuple[int, ...]
    pid: int  # the rank whose execution context the worker takes
    index: int | None = None  # physical GPU index (NVML, nvidia-smi)
    uuid: str | None = None
    visible: str | None = None  # CUDA_VISIBLE_DEVICES for the worker (uuid, else index)


@dataclass(frozen=True)
class Context:
    python: str
    env: dict[str, str] = field(hash=False)
    cwd: str
    cpus: frozenset[int]
    nice: int
    cgroup_procs: tuple[str, ...]  # cgroup.procs files of the rank's cgroups (to join)
    torch_site: str | None  # the directory holding the torch package the rank loaded
    notes: tuple[str, ...] = ()
    uid: int | None = None  # the rank's user and group: the worker runs as them
    gid: int | None = None
    # the rank's mount namespace (inode of /proc/PID/ns/mnt) when it is not the monitor's: the worker
    # enters it, and python / cwd / torch_site are paths in it. None: the same namespace as ours
    mntns: int | None = None
    error: str | None = None  # why no worker can run as this rank runs (one line, "...: replay off for that device")


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith(("model name", "Processor", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def _nvml_devices() -> dict[int, tuple[int, str, str]]:
    """pid -> (physical index, UUID, product name) for every process NVML sees on a GPU; {} without NVML."""
    try:
        import pynvml as nv

        nv.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver: fall back to CUDA_VISIBLE_DEVICES
        return {}
    out: dict[int, tuple[int, str, str]] = {}
    try:
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            uuid, name = _text(nv.nvmlDeviceGetUUID(h)), _text(nv.nvmlDeviceGetName(h))
            procs = []
            for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                try:
                    procs += getattr(nv, fn)(h)
                except Exception:  # noqa: BLE001
                    continue
            for p in procs:
                out.setdefault(int(p.pid), (i, uuid, name))
    except Exception:  # noqa: BLE001 - what was read so far is kept
        pass
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return out


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def devices_of(job: Job, nvml: Callable[[], dict[int, tuple[int, str, str]]] = _nvml_devices) -> list[Device]:
    """One device per GPU used by the job's ranks on this host, and one per CPU rank."""
    gpu_ranks = [r for r in job.ranks if r.device.startswith("cuda")]
    by_pid = nvml() if gpu_ranks else {}
    gpus: dict[str, dict[str, Any]] = {}
    out: list[Device] = []
    model = cpu_model()
    for r in sorted(job.ranks, key=lambda r: r.rank):
        if not r.device.startswith("cuda"):
            out.append(Device(f"cpu/rank{r.rank}", "cpu", model, (r.rank,), r.pid))
            continue
        index, uuid, name = _gpu_of(r, by_pid)
        key = uuid or f"cuda:{index}"
        g = gpus.setdefault(key, {"ranks": [], "pid": r.pid, "index": index, "uuid": uuid, "name": name})
        g["ranks"].append(r.rank)
    for _key, g in sorted(gpus.items(), key=lambda kv: (kv[1]["index"] is None, kv[1]["index"] or 0, kv[0])):
        name = f"cuda:{g['index']}" if g["index"] is not None else f"cuda:{g['uuid']}"
        out.append(Device(name, "cuda", g["name"] or "cuda", tuple(g["ranks"]), g["pid"], g["index"], g["uuid"],
                          g["uuid"] or str(g["index"])))
    return out


def _gpu_of(r: Rank, by_pid: dict[int, tuple[int, str, str]]) -> tuple[int | None, str | None, str]:
    if r.pid in by_pid:
        return by_pid[r.pid]
    sel = r.device.split(":", 1)[1] if ":" in r.device else "0"  # job.py: CUDA_VISIBLE_DEVICES[LOCAL_RANK]
    if sel.isdigit():
        return int(sel), None, ""
    return None, sel, ""


# --------------------------------------------------------------------------- execution context


def _mounts(mountinfo: str = "/proc/self/mountinfo") -> list[tuple[str, str, str, set[str]]]:
    """(root, mount point, fstype, options) of every cgroup / cgroup2 mount."""
    out = []
    try:
        with open(mountinfo) as f:
            for line in f:
                pre, _, post = line.partition(" - ")
                a, b = pre.split(), post.split()
                if len(a) >= 5 and len(b) >= 3 and b[0] in ("cgroup", "cgroup2"):
                    out.append((a[3], a[4], b[0], set(b[2].split(","))))
    except OSError:
        pass
    return out


def cgroup_procs(pid: int, mountinfo: str = "/proc/self/mountinfo") -> tuple[str, ...]:
    """The ``cgroup.procs`` files of every cgroup ``pid`` belongs to (v1 hierarchies and v2)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return ()
    mounts = _mounts(mountinfo)
    out = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _hid, ctrls, path = parts
        want = set(ctrls.split(",")) if ctrls else set()
        for root, point, fstype, opts in mounts:
            if (not want and fstype == "cgroup2") or (want and fstype == "cgroup" and want <= opts):
                rel = path[len(root):] if root != "/" and path.startswith(root) else path
                procs = os.path.join(point, rel.lstrip("/"), "cgroup.procs")
                if os.path.exists(procs) and procs not in out:
                    out.append(procs)
                break
    return tuple(out)


def _same_file(a: str, b: str) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def mount_ns(pid: int | str) -> int:
    """The inode of ``pid``'s mount namespace (``"self"``: ours). Raises OSError."""
    return os.stat(f"/proc/{pid}/ns/mnt").st_ino


def foreign_mount_ns(pid: int) -> int | None:
    """``pid``'s mount namespace when it is not ours (a rank in a container), else None. Raises OSError
    when it cannot be told (the rank is gone, or its namespace is not ours to look at)."""
    theirs = mount_ns(pid)
    return None if theirs == mount_ns("self") else theirs


MAX_LINKS = 40  # symbolic links followed in one path (the kernel's own bound)


def in_root(pid: int, path: str) -> str:
    """Where ``path``, a path in rank ``pid``'s mount namespace, is seen from here: under
    ``/proc/PID/root``, with every symbolic link on the way resolved *inside* that root. (The kernel
    would resolve an absolute link target met under ``/proc/PID/root`` against our root: a venv's
    ``bin/python -> /usr/bin/python3`` would name the host's python, not the container's.) A missing
    component ends the resolution; the path then does not exist. Relative ``path``: from the root."""
    root = f"/proc/{pid}/root"
    todo = [p for p in path.split("/") if p]
    done: list[str] = []
    links = 0
    while todo:
        part = todo.pop(0)
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        here = "/".join([root, *done, part])
        try:
            target = os.readlink(here)
        except OSError:  # not a link (or not there): taken as it is
            done.append(part)
            continue
        links += 1
        if links > MAX_LINKS:
            return "/".join([root, *done, part, *todo])  # a loop: stat() of it fails as it should
        if target.startswith("/"):
            done = []
        todo = [p for p in target.split("/") if p] + todo
    return "/".join([root, *done])


def _seen(pid: int, path: str, foreign: bool) -> str:
    """``path`` (in the rank's terms) as this process can look at it."""
    return in_root(pid, path) if foreign else path


def _interpreter(pid: int, cwd: str, foreign: bool = False) -> str | None:
    """The rank's interpreter, by the name it was started with when that is the same file (a venv's
    ``bin/python`` link keeps the venv's site-packages; its target would not). In the rank's
    namespace's terms; None when, in another namespace, no path there names it."""
    exe = f"/proc/{pid}/exe"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0")[0].decode(errors="replace")
    except OSError:
        argv0 = ""
    if argv0:
        cand = argv0 if os.path.isabs(argv0) else os.path.join(cwd, argv0)
        if "/" in argv0 and _same_file(_seen(pid, cand, foreign), exe):
            return cand
    try:
        target = os.readlink(exe)  # the kernel writes it in the rank's namespace's terms
        if os.path.exists(_seen(pid, target, foreign)):
            return target
    except OSError:
        pass
    # /proc/PID/exe is a path of our /proc: inside the rank's namespace it would be another process's
    return None if foreign else exe


_TORCH_LIB = re.compile(r"\s(/\S+)/torch/lib/libtorch[\w.-]*\.so")


def torch_site(pid: int) -> str | None:
    """The sys.path entry that holds the torch package the rank loaded (from its memory maps)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            m = _TORCH_LIB.search(f.read())
    except OSError:
        return None
    return m.group(1) if m else None


def context_of(pid: int) -> Context:
    """Everything needed to run a worker as rank ``pid`` runs. Raises TargetGone / PermissionDenied."""
    from scout_sys.errors import TargetGone

    env = _environ(pid)
    if env is None:
        raise TargetGone(f"rank process {pid} is gone", pid=pid)
    notes = []
    error = None
    try:
        mntns = foreign_mount_ns(pid)
    except OSError as e:
        mntns = None
        error = f"cannot tell the mount namespace of rank pid {pid}: {e.strerror or e}: replay off for that device"
    foreign = mntns is not None
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")  # in the rank's namespace's terms, as the kernel writes it
        if not os.path.isdir(_seen(pid, cwd, foreign)):
            cwd = "/"
    except OSError:
        cwd = "/"
    try:
        cpus = frozenset(os.sched_getaffinity(pid))
    except OSError:
        cpus = frozenset(os.sched_getaffinity(0))
    try:
        nice = min(19, os.getpriority(os.PRIO_PROCESS, pid) + NICE_DELTA)
    except OSError:
        nice = NICE_DELTA
    site = torch_site(pid)  # /proc/PID/maps: the rank's terms too
    env = dict(env)
    if site:
        env["PYTHONPATH"] = os.pathsep.join([site] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    else:
        notes.append(f"pid {pid} has not loaded torch yet: the worker imports whatever its interpreter finds")
    env[WORKER_MARK] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PYTHONSTARTUP", None)
    uid, gid = _ids(pid)
    python = _interpreter(pid, cwd, foreign)
    if python is None and error is None:
        error = (f"the interpreter of rank pid {pid} has no path in its mount namespace (replaced or deleted "
                 "since it started?): replay off for that device")
    return Context(python or "", env, cwd, cpus, nice, cgroup_procs(pid), site, tuple(notes), uid, gid,
                   mntns, error)


def rank_path(pid: int, path: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The path, in rank ``pid``'s mount namespace, of ``path`` (an existing file or folder of ours); None
    when the rank cannot see it. The same path when it names the same file there (a volume mounted at
    the same place); a path under ``/proc/P/root/`` of a process in that namespace, without the prefix;
    else a mount of its filesystem in the rank's namespace that shows it (``docker -v /data/ckpt:/ckpt``:
    ``/data/ckpt/step_9.pt`` is ``/ckpt/step_9.pt`` there), checked to be the same file."""
    path = os.path.abspath(path)
    try:
        st = os.stat(path)
    except OSError:
        return None

    def same(p: str) -> bool:
        try:
            s = os.stat(in_root(pid, p))
        except OSError:
            return False
        return (s.st_dev, s.st_ino) == (st.st_dev, st.st_ino)

    m = re.match(r"^/proc/(\d+)/root(/.*)?$", path)  # before realpath(), which would read that link as "/"
    if m:
        inside = m.group(2) or "/"
        return inside if same(inside) else None
    path = os.path.realpath(path)
    if same(path):
        return path
    ours = _mount_roots(mountinfo)
    theirs = _mount_roots(f"/proc/{pid}/mountinfo")
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    for root, point in sorted(ours.get(dev, ()), key=lambda rp: -len(rp[1])):  # the deepest mount first
        rel = _below(path, point)
        if rel is None:
            continue
        inside = os.path.normpath(os.path.join(root, rel))  # the path within the filesystem
        for troot, tpoint in theirs.get(dev, ()):
            trel = _below(inside, troot)
            if trel is None:
                continue
            cand = os.path.normpath(os.path.join(tpoint, trel))
            if same(cand):
                return cand
    return None


def _below(path: str, top: str) -> str | None:
    """``path`` relative to ``top`` when it lies under it (``"."``: itself), else None."""
    rel = os.path.relpath(path, top)
    return None if rel == ".." or rel.startswith("../") else rel


def _mount_roots(mountinfo: str) -> dict[str, list[tuple[str, str]]]:
    """major:minor -> [(root within the filesystem, mount point)] of every mount in ``mountinfo``."""
    out: dict[str, list[tuple[str, str]]] = {}
    try:
        with open(mountinfo) as f:
            for line in f:
                a = line.split(" - ")[0].split()
                if len(a) >= 5:
                    out.setdefault(a[2], []).append((_unescape(a[3]), _unescape(a[4])))
    except OSError:
        pass
    return out


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _ids(pid: int) -> tuple[int | None, int | None]:
    """The rank's effective user and group ids (/proc/PID/status)."""
    uid = gid = None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    uid = int(line.split()[2])
                elif line.startswith("Gid:"):
                    gid = int(line.split()[2])
    except (OSError, ValueError, IndexError):
        pass
    return uid, gid


def memory_headroom(procs: str) -> int | None:
    """Bytes left under the memory limit of the cgroup whose ``cgroup.procs`` is ``procs``; None
    when it has no memory controller or no limit."""
    d = os.path.dirname(procs)
    for limit_f, used_f in (("memory.max", "memory.current"), ("memory.limit_in_bytes", "memory.usage_in_bytes")):
        try:
            with open(os.path.join(d, limit_f)) as f:
                limit = f.read().strip()
            with open(os.path.join(d, used_f)) as f:
                used = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 1 << 60:
            return None
        return int(limit) - used
    return None


def memory_available(meminfo: str = "/proc/meminfo") -> int:
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
