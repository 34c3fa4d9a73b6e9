"""The job's process groups, learned from the TCP connections between its rank processes (Gloo).

Measured on torch 2.13 / Gloo (docs/layouts.md, "Process groups without a flag"): every Gloo process
group opens its own listening socket in each member and a full mesh of connections among its
members, one per pair; a member's sockets of one group sit in one block of file descriptors right
after that group's listener (groups are created one after another). So, from ``/proc/PID/fd`` and
the kernel's socket table (``sock_diag`` over netlink, or ``/proc/net/tcp{,6}``):

- a socket whose local address is a rank's listener was *accepted* for that listener's group;
- a socket that connects to another rank's listener belongs to that listener's group, and so does
  the listener heading its own block of descriptors: the two listeners are of one group;
- groups are the connected components of listeners; their members, the listeners' owners.

Which group a waiting rank waits in: a rank that waits in a Gloo collective has sent (its data, or
Gloo's "ready to receive" notice) on that group's sockets and nothing since, so its most recent send
(``tcpi_last_data_sent``) is on a socket of the group it waits in; sends answered later are left
out when that ties. Ranks on other hosts appear as addresses that are no rank's: their groups are
*partial* (members not observed here).

NCCL's bootstrap sockets do not follow this shape; NCCL jobs' groups come from the eBPF probe at
communicator creation (probes/ebpf/comms.py, a watch started with the job) or ``--topology``.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from scout_sys.errors import ProbeUnavailable
from scout_sys.model import Job, Observation, ProcessGroupSample
from scout_sys.probes import Health

LISTEN, ESTABLISHED = 10, 1
QUIET_MS = 500  # a waiting rank's last send is at least this old
WINDOW_END = 1.0  # s without a call: the next one ends a window (the watch polls every 0.5 s)
LATE_WRITE_MS = 50  # an answered send written this much after the wait's own send (see current_groups)


@dataclass(frozen=True)
class Sock:
    local: tuple[str, int]
    remote: tuple[str, int]
    state: int
    last_sent_ms: int | None = None  # ms since the last data sent (None: not known)
    last_recv_ms: int | None = None


# --------------------------------------------------------------------------- reading (I/O)


def _addr(family: int, raw: bytes) -> str:
    if family == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, raw[:4])
    a = socket.inet_ntop(socket.AF_INET6, raw[:16])
    return a.removeprefix("::ffff:") if a.startswith("::ffff:") and "." in a else a


def _diag(family: int) -> dict[int, Sock]:
    """inode -> Sock for every TCP socket of ``family`` (sock_diag, with tcp_info times)."""
    out: dict[int, Sock] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4) as s:  # NETLINK_SOCK_DIAG
        states = (1 << ESTABLISHED) | (1 << LISTEN)
        req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 1 << (2 - 1), 0, states) + bytes(48)
        hdr = struct.pack("=IHHII", 16 + len(req), 20, 0x1 | 0x300, 1, 0)  # SOCK_DIAG_BY_FAMILY, REQUEST|DUMP
        s.sendto(hdr + req, (0, 0))
        while True:
            data = s.recv(1 << 20)
            off = 0
            while off + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, off)
                if kind == 3:  # NLMSG_DONE
                    return out
                if kind == 2:  # NLMSG_ERROR
                    raise OSError("sock_diag refused the request")
                body = off + 16
                fam, state = struct.unpack_from("=BB", data, body)
                sport, dport = struct.unpack_from(">HH", data, body + 4)
                src = data[body + 8:body + 24]
                dst = data[body + 24:body + 40]
                inode, = struct.unpack_from("=I", data, body + 68)
                sent = recv = None
                a = body + 72
                while a + 4 <= off + length:
                    alen, atype = struct.unpack_from("=HH", data, a)
                    if alen < 4:
                        break
                    if atype == 2 and alen >= 4 + 56:  # INET_DIAG_INFO: struct tcp_info
                        sent, recv = struct.unpack_from("=I4xI", data, a + 4 + 44)
                    a += (alen + 3) & ~3
                out[inode] = Sock((_addr(fam, src), sport), (_addr(fam, dst), dport), state, sent, recv)
                off += (length + 3) & ~3
            if not data:
                return out


def _proc_net(path: str) -> dict[int, Sock]:
    out: dict[int, Sock] = {}
    try:
        with open(path) as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return out
    for line in lines:
        p = line.split()
        if len(p) < 10:
            continue

        def ep(text: str) -> tuple[str, int]:
            h, port = text.rsplit(":", 1)
            raw = bytes.fromhex(h)
            if len(raw) == 4:
                return socket.inet_ntop(socket.AF_INET, raw[::-1]), int(port, 16)
            words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
            a = socket.inet_ntop(socket.AF_INET6, words)
            return (a.removeprefix("::ffff:") if "." in a else a), int(port, 16)
        out[int(p[9])] = Sock(ep(p[1]), ep(p[2]), int(p[3], 16))
    return out


def tcp_table() -> tuple[dict[int, Sock], bool]:
    """(inode -> Sock, whether send/receive times are known)."""
    try:
        table = _diag(socket.AF_INET)
        table.update(_diag(socket.AF_INET6))
        return table, True
    except OSError:
        table = _proc_net("/proc/net/tcp")
        table.update(_proc_net("/proc/net/tcp6"))
        return table, False


def socket_fds(pid: int, proc: str = "/proc") -> list[tuple[int, int]]:
    """(fd, socket inode) of a process, sorted by fd; [] when it is gone or not ours."""
    out = []
    try:
        fds = os.listdir(f"{proc}/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            t = os.readlink(f"{proc}/{pid}/fd/{fd}")
        except OSError:
            continue
        if t.startswith("socket:["):
            out.append((int(fd), int(t[8:-1])))
    return sorted(out)


def store_port(pid: int, proc: str = "/proc") -> int | None:
    """MASTER_PORT of a rank (the c10d store's listener is not a process group)."""
    try:
        with open(f"{proc}/{pid}/environ", "rb") as f:
            for kv in f.read().split(b"\0"):
                if kv.startswith(b"MASTER_PORT="):
                    return int(kv[12:])
    except (OSError, ValueError):
        return None
    return None


# --------------------------------------------------------------------------- learning (pure)


@dataclass(frozen=True)
class Learned:
    groups: tuple[tuple[int, ...], ...]  # global members, sorted; groups of one are left out
    partial: tuple[int, ...]  # indices of groups with members not observed here (other hosts)
    group_of: Mapping[tuple[int, int], int]  # (rank, fd) -> group index, for every group socket
    notes: tuple[str, ...] = ()


def _same(a: tuple[str, int], b: tuple[str, int]) -> bool:
    return a[1] == b[1] and (a[0] == b[0] or b[0] in ("0.0.0.0", "::"))


def learn(socks: Mapping[int, Sequence[tuple[int, int]]], table: Mapping[int, Sock],
          exclude_ports: Iterable[int] = ()) -> Learned:
    """Process groups from ``socks`` (rank -> its (fd, inode) sockets) and the socket ``table``."""
    skip = set(exclude_ports)
    listeners: dict[tuple[int, int], tuple[str, int]] = {}  # (rank, fd) -> address
    by_port: dict[int, list[tuple[int, int]]] = {}
    conns: list[tuple[int, int, Sock]] = []
    for rank, fds in socks.items():
        for fd, ino in fds:
            s = table.get(ino)
            if s is None:
                continue
            if s.state == LISTEN and s.local[1] not in skip:
                listeners[(rank, fd)] = s.local
                by_port.setdefault(s.local[1], []).append((rank, fd))
            elif s.state == ESTABLISHED:
                conns.append((rank, fd, s))
    parent = {k: k for k in listeners}

    def find(k):
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    own_fds: dict[int, list[int]] = {}
    for rank, fd in sorted(listeners):
        own_fds.setdefault(rank, []).append(fd)

    def block(rank: int, fd: int) -> tuple[int, int] | None:
        below = [f for f in own_fds.get(rank, ()) if f < fd]
        return (rank, below[-1]) if below else None

    def listener_at(addr: tuple[str, int]) -> tuple[int, int] | None:
        return next((k for k in by_port.get(addr[1], ()) if _same(addr, listeners[k])), None)

    sock_listener: dict[tuple[int, int], tuple[int, int]] = {}
    remote_members: dict[tuple[int, int], int] = {}
    local_addrs = {s.local for _, _, s in conns}
    local_ips = {a[0] for a in local_addrs} | {a[0] for a in listeners.values()}
    for rank, fd, s in conns:
        accepted = listener_at(s.local)
        if accepted is not None and accepted[0] == rank:
            sock_listener[(rank, fd)] = accepted
            if s.remote not in local_addrs:  # the connecting end is no rank we see
                remote_members[accepted] = remote_members.get(accepted, 0) + 1
            continue
        target = listener_at(s.remote) if s.remote[0] in local_ips else None
        if target is None and s.remote[0] not in local_ips and s.remote[1] not in skip:
            # connects to a listener on another host: a member elsewhere, of its own block's group
            mine = block(rank, fd)
            if mine is not None:
                sock_listener[(rank, fd)] = mine
                remote_members[mine] = remote_members.get(mine, 0) + 1
            continue
        if target is None or target[0] == rank:
            continue  # not a group socket (the store, the launcher, something else)
        sock_listener[(rank, fd)] = target
        mine = block(rank, fd)
        if mine is not None:
            parent[find(mine)] = find(target)
    comps: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for k in listeners:
        comps.setdefault(find(k), []).append(k)
    groups: list[tuple[int, ...]] = []
    index: dict[tuple[int, int], int] = {}
    partial: list[int] = []
    notes: list[str] = []
    bad = 0
    for root, ks in sorted(comps.items(), key=lambda kv: min(kv[1])):
        members = sorted(r for r, _ in ks)
        if len(set(members)) != len(members):
            bad += 1  # two listeners of one rank in one group: the descriptor blocks interleave
            continue
        if len(members) < 2 and not any(remote_members.get(k) for k in ks):
            continue
        index[root] = len(groups)
        if any(remote_members.get(k) for k in ks):
            partial.append(len(groups))
        groups.append(tuple(members))
    if bad:
        notes.append(f"{bad} socket group(s) could not be told apart (descriptor blocks interleave); left out")
    group_of = {rf: index[find(lst)] for rf, lst in sock_listener.items() if find(lst) in index}
    return Learned(tuple(groups), tuple(partial), group_of, tuple(notes))


def current_groups(learned: Learned, socks: Mapping[int, Sequence[tuple[int, int]]],
                   table: Mapping[int, Sock], quiet_ms: int = QUIET_MS,
                   ties: dict[int, tuple[int, ...]] | None = None) -> dict[int, int]:
    """rank -> the group its most recent send went to, when that send is at least ``quiet_ms``
    old and names one group.

    The send a waiting rank made into its wait is *unanswered*: the awaited peer has not spoken
    since. An answered send can look a few ms newer (Gloo's IO thread may write the end of a
    finished collective late, on a loaded machine), so unanswered sends within ``LATE_WRITE_MS`` of
    the newest one are taken first. Sends of one step often fall in one tick of the clock (4 ms): a
    tie of unanswered sends goes to the peer heard from longest ago (a completed send had its
    receiver's ready notice just before it; the peer of the collective a rank waits in last spoke in
    an earlier call). A tie left between known groups (or answered sends in one tick) goes to
    ``ties`` (rank -> the candidate groups), not to the result."""
    out: dict[int, int] = {}
    for rank, fds in socks.items():
        latest: list[tuple[int, int | None, bool, int]] = []  # (ms since sent, group, unanswered, ms since heard)
        for fd, ino in fds:
            s = table.get(ino)
            if s is None or s.state != ESTABLISHED or s.last_sent_ms is None or s.last_recv_ms is None:
                continue
            # a socket of no known group counts too: a newest send there names no group
            latest.append((s.last_sent_ms, learned.group_of.get((rank, fd)), s.last_sent_ms < s.last_recv_ms,
                           s.last_recv_ms))
        if not latest:
            continue
        newest = min(t for t, _, _, _ in latest)
        if newest < quiet_ms:
            continue
        pending = [x for x in latest if x[2] and x[0] <= newest + LATE_WRITE_MS]
        pool = pending or latest
        first = min(t for t, _, _, _ in pool)
        tied = [(g, heard) for t, g, _, heard in pool if t == first]
        gs = {g for g, _ in tied}
        if len(gs) > 1 and pending:
            oldest = max(heard for _, heard in tied)
            gs = {g for g, heard in tied if heard == oldest}
        if len(gs) == 1 and None not in gs:
            out[rank] = gs.pop()  # type: ignore[assignment]
        elif len(gs) > 1 and None not in gs and ties is not None:
            ties[rank] = tuple(sorted(gs))  # type: ignore[arg-type]
    return out


# --------------------------------------------------------------------------- the probe


class ProcessGroupProbe:
    """Probe contract (scout_sys.probes): one :class:`ProcessGroupSample` per sample."""

    name = "process-groups"

    def __init__(self, proc: str = "/proc", every: float = 2.0) -> None:
        self.proc = proc
        self.every = every  # seconds between two reads (a watch polls twice a second)
        self._job: Job | None = None
        self._last = float("-inf")
        self._called = float("-inf")
        self._notes: tuple[str, ...] = ()

    def check(self) -> str | None:
        return None if os.path.isdir(self.proc) else f"{self.proc} is not mounted"

    def start(self, job: Job) -> None:
        if not job.ranks:
            raise ProbeUnavailable("no rank process to read sockets from")
        self._job = job

    def health(self) -> Health:
        return Health(notes=self._notes)

    def sample(self, now: float | None = None) -> list[Observation]:
        job = self._job
        t = time.monotonic()
        # Polled (called again within WINDOW_END s): read every ``every`` s. A call after a longer quiet
        # ends a window (diagnose, the watch's confirmation): read now, or the graph would judge the
        # ranks' waits by a read from before they began.
        polled, self._called = t - self._called < WINDOW_END, t
        if job is None or (polled and t - self._last < self.every):
            return []
        self._last = t
        socks = {r.rank: socket_fds(r.pid, self.proc) for r in job.ranks}
        table, timed = tcp_table()
        ports = {p for p in (store_port(r.pid, self.proc) for r in job.ranks) if p is not None}
        learned = learn(socks, table, ports)
        ties: dict[int, tuple[int, ...]] = {}
        waits = current_groups(learned, socks, table, ties=ties) if timed else {}
        notes = list(learned.notes)
        if not timed:
            notes.append("sock_diag unavailable: which group a rank waits in is unknown (groups from /proc/net/tcp)")
        self._notes = tuple(notes)
        return [ProcessGroupSample(time=time.time() if now is None else now, groups=learned.groups,
                                   partial=learned.partial, waits_in=tuple(sorted(waits.items())),
                                   waits_in_one_of=tuple(sorted(ties.items())),
                                   notes=tuple(notes))]

    def close(self) -> None:
        self._job = None
