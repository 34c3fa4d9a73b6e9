"""Process groups from the ranks' TCP connections (probes/pgroups.py): the pure learner on socket
tables shaped as Gloo leaves them (measured on torch 2.13, docs/layouts.md), and the live reader."""

from __future__ import annotations

import os
import socket

from scout_sys.probes.pgroups import ESTABLISHED, LISTEN, Sock, current_groups, learn, socket_fds, tcp_table

IP = "127.0.0.1"


class Mesh:
    """Builds socks/table as Gloo does: per group, a listener in each member, then one connection per
    pair (the later member connects to the earlier one's listener), fds in one block per group."""

    def __init__(self) -> None:
        self.socks: dict[int, list[tuple[int, int]]] = {}
        self.table: dict[int, Sock] = {}
        self.fd: dict[int, int] = {}
        self.ino = 1000
        self.port = 30000

    def _new(self, rank: int, sock: Sock) -> int:
        self.ino += 1
        fd = self.fd.get(rank, 6) + 1
        self.fd[rank] = fd
        self.socks.setdefault(rank, []).append((fd, self.ino))
        self.table[self.ino] = sock
        return fd

    def group(self, members, sent=None, remote: int = 0) -> None:
        lst = {}
        for m in members:
            self.port += 1
            lst[m] = (IP, self.port)
            self._new(m, Sock((IP, self.port), ("0.0.0.0", 0), LISTEN))
        for i, a in enumerate(members):
            for b in members[:i]:
                self.port += 1
                eph = (IP, self.port)
                t = (sent or {}).get((a, b), (5000, 5000))
                self._new(a, Sock(eph, lst[b], ESTABLISHED, *t))
                t = (sent or {}).get((b, a), (5000, 5000))
                self._new(b, Sock(lst[b], eph, ESTABLISHED, *t))
        for _ in range(remote):  # a member on another host connects to the first member's listener
            self.port += 1
            self._new(members[0], Sock(lst[members[0]], ("10.0.0.9", self.port), ESTABLISHED, 5000, 5000))


def test_dp2_tp2_groups_and_where_ranks_wait():
    m = Mesh()
    m.group([0, 1, 2, 3])
    # Megatron order: tp {0,1} {2,3}, dp {0,2} {1,3}; each rank creates only its own groups, in order
    for members in ([0, 1], [2, 3]):
        m.group(members)
    # (waiter, peer) -> (ms since sent, ms since received): 0 and 1 sent last in dp, unanswered;
    # 3 sent last in tp to 2; 2 sent long ago
    m.group([0, 2], sent={(0, 2): (3012, 3080), (2, 0): (3080, 3012)})
    m.group([1, 3], sent={(1, 3): (3012, 3068), (3, 1): (3068, 3012)})
    learned = learn(m.socks, m.table)
    assert sorted(learned.groups) == [(0, 1), (0, 1, 2, 3), (0, 2), (1, 3), (2, 3)]
    assert learned.partial == ()
    # rank 3 sent last on the tp socket to 2 (the dp one was answered later)
    (ino,) = [i for fd, i in m.socks[3] if m.table[i].remote[1] in
              {m.table[j].local[1] for _, j in m.socks[2]} and learned.group_of[(3, fd)] ==
              learned.groups.index((2, 3))]
    m.table[ino] = Sock(m.table[ino].local, m.table[ino].remote, ESTABLISHED, 3016, 3080)
    where = {r: learned.groups[g] for r, g in current_groups(learned, m.socks, m.table).items()}
    assert where[0] == (0, 2) and where[1] == (1, 3) and where[3] == (2, 3)


def test_groups_with_the_same_members_stay_apart_and_singletons_are_left_out():
    m = Mesh()
    for members in ([0, 1], [0, 1], [0], [0, 1, 2]):
        m.group(members)
    learned = learn(m.socks, m.table)
    assert list(learned.groups) == [(0, 1), (0, 1), (0, 1, 2)]


def test_members_on_another_host_make_a_group_partial():
    m = Mesh()
    m.group([0, 1], remote=1)
    learned = learn(m.socks, m.table)
    assert learned.groups == ((0, 1),) and learned.partial == (0,)


def test_the_store_listener_is_not_a_group():
    m = Mesh()
    m.group([0, 1, 2])
    store = m.table[m.socks[0][0][1]].local[1]
    assert learn(m.socks, m.table, exclude_ports=[store]).groups == ((1, 2),)


def test_live_socket_table_sees_our_own_connection():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    cli = socket.create_connection(srv.getsockname())
    acc, _ = srv.accept()
    try:
        cli.sendall(b"x")
        acc.recv(1)
        table, timed = tcp_table()
        mine = dict(socket_fds(os.getpid()))
        s = table[mine[cli.fileno()]]
        assert s.state == ESTABLISHED and s.remote == srv.getsockname()
        assert table[mine[srv.fileno()]].state == LISTEN
        if timed:
            assert s.last_sent_ms is not None and s.last_sent_ms < 60_000
    finally:
        for x in (cli, acc, srv):
            x.close()


def test_connecting_to_a_member_on_another_host_makes_the_group_partial_and_where_it_waits():
    m = Mesh()
    m.group([0, 1], sent={(1, 0): (4000, 4000), (0, 1): (4000, 4000)})
    # a group {0, <remote>}: rank 0's listener, then its connection to the remote member's listener
    m.port += 1
    m._new(0, Sock((IP, m.port), ("0.0.0.0", 0), LISTEN))
    m.port += 1
    m._new(0, Sock((IP, m.port), ("10.0.0.9", 29400), ESTABLISHED, 2000, 2600))
    learned = learn(m.socks, m.table)
    assert learned.groups == ((0, 1), (0,)) and learned.partial == (1,)
    assert current_groups(learned, m.socks, m.table) == {0: 1, 1: 0}


def test_a_newest_send_on_a_socket_of_no_group_names_no_group():
    m = Mesh()
    m.group([0, 1], sent={(1, 0): (4000, 4000), (0, 1): (4000, 4000)})
    m.port += 1
    m._new(0, Sock((IP, m.port), (IP, 1), ESTABLISHED, 900, 950))  # e.g. the store, sent last
    learned = learn(m.socks, m.table, exclude_ports=[1])
    assert current_groups(learned, m.socks, m.table) == {1: 0}


def test_probe_follows_the_contract_and_reads_a_live_job_shape():
    from scout_sys.model import Job, ProcessGroupSample, Rank
    from scout_sys.probes import Probe
    from scout_sys.probes.pgroups import ProcessGroupProbe

    p = ProcessGroupProbe(every=0.0)
    assert isinstance(p, Probe) and p.check() is None
    p.start(Job(ranks=(Rank(rank=0, pid=os.getpid(), host="h"),), world_size=1, launcher="explicit",
                launcher_pid=None, host="h"))
    (s,) = p.sample(123.0)
    assert isinstance(s, ProcessGroupSample) and s.time == 123.0 and s.groups == ()
    assert p.health().notes == () or "sock_diag" in p.health().notes[0]
    p.close()
    p.close()


def test_a_tie_of_unanswered_sends_goes_to_the_peer_heard_from_longest_ago():
    # rank 1 (dp=2 x pp=2 shape, measured on the 8-rank mix): in one 4 ms tick it sent its gradient to
    # the other stage (whose ready notice came just before) and its data into the dp all-reduce, where
    # the peer last spoke a step earlier: it waits in the dp group
    m = Mesh()
    m.group([0, 1], sent={(1, 0): (6212, 6216), (0, 1): (6216, 6212)})  # pp: the completed send
    m.group([1, 2], sent={(1, 2): (6212, 6268), (2, 1): (6268, 6212)})  # dp: waiting for 2
    learned = learn(m.socks, m.table)
    assert {r: learned.groups[g] for r, g in current_groups(learned, m.socks, m.table).items()}[1] == (1, 2)
    # the same recv times: still no group rather than a guess
    m.table.update({i: Sock(s.local, s.remote, ESTABLISHED, 6212, 6216) for i, s in m.table.items()
                    if s.state == ESTABLISHED})
    assert 1 not in current_groups(learned, m.socks, m.table)


def test_sends_all_answered_in_one_tick_are_a_tie_between_their_groups():
    # measured on the 8-rank mix: rank 3 posted its recv to 7 and finished its tp all-reduce with 2 in
    # one tick, both answered in that tick: which one it waits in is left to the wait-for graph
    m = Mesh()
    m.group([2, 3], sent={(3, 2): (15028, 15028), (2, 3): (15028, 15028)})
    m.group([3, 7], sent={(3, 7): (15028, 15028), (7, 3): (15028, 15088)})
    learned = learn(m.socks, m.table)
    ties: dict[int, tuple[int, ...]] = {}
    assert 3 not in current_groups(learned, m.socks, m.table, ties=ties)
    assert sorted(learned.groups[g] for g in ties[3]) == [(2, 3), (3, 7)]


def test_an_answered_send_written_late_does_not_hide_the_unanswered_wait():
    # measured on the 8-rank mix under load: rank 0 waits in the dp all-reduce (sent 19696 ms ago,
    # unanswered); the end of its finished tp all-reduce was written 8 ms later (answered)
    m = Mesh()
    m.group([0, 1], sent={(0, 1): (19688, 19688), (1, 0): (19688, 19688)})
    m.group([0, 2], sent={(0, 2): (19696, 19752), (2, 0): (19752, 19696)})
    learned = learn(m.socks, m.table)
    assert learned.groups[current_groups(learned, m.socks, m.table)[0]] == (0, 2)
    # an unanswered send from 10 s before is no wait: the newest send names the group
    m.table.update({i: Sock(s.local, s.remote, ESTABLISHED, 29696, 39752) for i, s in m.table.items()
                    if s.state == ESTABLISHED and s.last_sent_ms == 19696})
    assert learned.groups[current_groups(learned, m.socks, m.table)[0]] == (0, 1)


def test_probe_reads_every_few_seconds_when_polled_and_at_once_at_a_window_end(monkeypatch):
    # measured in the watch on the 8-rank mix: its confirmation came 1-3 s after the ranks began to
    # wait, and the newest read (a poll's, up to 2 s older) saw them before they did
    from scout_sys.model import Job, Rank
    from scout_sys.probes import pgroups

    clock = [100.0]
    monkeypatch.setattr(pgroups.time, "monotonic", lambda: clock[0])
    p = pgroups.ProcessGroupProbe(every=2.0)
    p.start(Job(ranks=(Rank(rank=0, pid=os.getpid(), host="h"),), world_size=1, launcher="explicit",
                launcher_pid=None, host="h"))
    reads = []
    for dt in (0.0, 0.5, 0.5, 0.5, 0.5, 1.3, 0.5):  # polls every 0.5 s, then a 1.3 s window's end
        clock[0] += dt
        reads.append(len(p.sample(clock[0])))
    assert reads == [1, 0, 0, 0, 1, 1, 0], reads
