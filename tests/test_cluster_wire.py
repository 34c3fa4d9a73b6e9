"""The cluster's wire format and the whole-job merge, on synthetic data (pure: no store, no processes)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from scout_sys.cluster import answer, heartbeat, wire
from scout_sys.cluster.heartbeat import RankBeat
from scout_sys.cluster.merge import ANSWERED, AgentState, Answer, decide
from scout_sys.consensus import hang
from scout_sys.errors import BadToken
from scout_sys.model import CollectiveSample, ExitRecord, Fingerprint, Job, Rank
from scout_sys.model_job import WIRE, job_from_json, job_to_json
from tests.test_hang_rules import SLEEPING, T0, WAIT_AR, _rank_obs

TOKEN = b"0123456789abcdef0123456789abcdef"


def test_sealed_values_verify_only_with_the_token_the_key_and_the_run():
    raw = wire.seal(TOKEN, wire.hb_key(1), "n1", {"node": 1, "ranks": []})
    assert wire.unseal(TOKEN, wire.hb_key(1), raw, "n1")["node"] == 1
    with pytest.raises(wire.Forged):
        wire.unseal(b"another token of sixteen bytes!!", wire.hb_key(1), raw, "n1")
    with pytest.raises(wire.Forged):  # moved to another node's slot
        wire.unseal(TOKEN, wire.hb_key(2), raw, "n1")
    env = json.loads(raw)
    env["b"] = env["b"].replace('"node":1', '"node":2')
    with pytest.raises(wire.Forged):  # body changed
        wire.unseal(TOKEN, wire.hb_key(1), json.dumps(env).encode(), "n1")
    with pytest.raises(wire.Stale):  # a valid message of an earlier run
        wire.unseal(TOKEN, wire.hb_key(1), raw, "n2")
    with pytest.raises(wire.Forged):
        wire.unseal(TOKEN, wire.hb_key(1), b"not json", "n1")
    assert TOKEN not in raw


def test_token_file_errors_are_one_line(tmp_path):
    with pytest.raises(BadToken, match="cannot read"):
        wire.read_token(str(tmp_path / "none"))
    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(BadToken, match="too short") as e:
        wire.read_token(str(short))
    assert "abc" not in str(e.value)
    good = tmp_path / "good"
    good.write_bytes(TOKEN + b"\n")
    assert wire.read_token(str(good)) == TOKEN


def test_activities_and_records_round_trip_through_json():
    obs = []
    for r in range(3):
        obs += _rank_obs(r, stacks=SLEEPING if r == 2 else WAIT_AR)
    job = Job(ranks=tuple(Rank(rank=r, pid=1000 + r, host="h", local_rank=r) for r in range(3)), world_size=3,
              launcher="torchrun", launcher_pid=9, host="h")
    acts = hang.activities(job, obs)
    for a in acts.values():
        assert wire.activity_from_json(json.loads(json.dumps(wire.activity_to_json(a)))) == a
    packed = json.loads(json.dumps(wire.activities_to_json(acts.values())))
    assert len(packed["stacks"]) == 2 and len(packed["waits"]) == 1  # each distinct stack, wait, place once
    assert wire.activities_from_json(packed) == acts
    assert {hash(a) for a in wire.activities_from_json(packed).values()} == {hash(a) for a in acts.values()}
    # the earlier form (place and wait in full for each rank) still reads the same
    earlier = {"stacks": packed["stacks"], "locations": packed["locations"],
               "acts": [{**x, **{k: wire.activity_to_json(acts[x["rank"]])[k] for k in ("where", "wait") if k in x}}
                        for x in packed["acts"]]}
    assert wire.activities_from_json(earlier) == acts
    odd = job_to_json(replace(job, ranks=(replace(job.ranks[0], host="elsewhere", coords=(("dp", 1),)),)), WIRE)
    assert job_from_json(json.loads(json.dumps(odd)), WIRE).ranks[0].coords == (("dp", 1),)
    assert job_from_json(odd, WIRE).ranks[0].host == "elsewhere" and "host" not in job_to_json(job, WIRE)["ranks"][0]
    fp = Fingerprint(seq=3, op="allreduce", time=T0, count=10, dtype="float32", redop="sum")
    recs = [CollectiveSample(time=T0, rank=1, pid=1001, backend="gloo", group="gloo:0", seq=3, completed=2,
                             inside=True, last_enter=T0, last_exit=None, last=fp, recent=(fp,)),
            ExitRecord(time=T0, rank=2, pid=1002, exit_code=None, signal=9)]
    assert [wire.record_from_json(json.loads(json.dumps(wire.record_to_json(o)))) for o in recs] == recs
    assert job_from_json(json.loads(json.dumps(job_to_json(job, WIRE))), WIRE) == job


def _answer(node: int, ranks: range, host: str, idle: int | None = None) -> Answer:
    obs = []
    for r in ranks:
        obs += _rank_obs(r, stacks=SLEEPING if r == idle else WAIT_AR)
    job = Job(ranks=tuple(Rank(rank=r, pid=1000 + r, host=host, local_rank=r - ranks.start) for r in ranks),
              world_size=8, launcher="torchrun", launcher_pid=9, host=host)
    return Answer(node=node, host=host, job=job, acts=hang.activities(job, obs), window=(T0, T0 + 4))


def test_the_origin_on_another_host_is_named_with_its_host():
    answers = [_answer(0, range(0, 4), "a"), _answer(1, range(4, 8), "b", idle=6)]
    states = [AgentState(0, "a", ANSWERED), AgentState(1, "b", ANSWERED)]
    d, cluster = decide(answers, states, world_size=8, source="s:1", now=T0 + 5)
    assert [(i.kind, i.ranks, i.hosts) for i in d.incidents] == [("hang", (6,), ("b",))]
    assert cluster["not_observed"] == []
    assert {r["rank"]: r["host"] for r in d.to_json()["job"]["ranks"]}[6] == "b"


def test_ranks_of_a_silent_agent_are_not_observed_never_blamed():
    # the origin (rank 6) is on the host whose agent is gone: the rest wait in common mode
    answers = [_answer(0, range(0, 4), "a")]
    states = [AgentState(0, "a", ANSWERED), AgentState(1, "b", "no answer", "no answer within 6 s",
                                                        ranks=(4, 5, 6, 7))]
    d, cluster = decide(answers, states, world_size=8, source="s:1", now=T0 + 5)
    assert [(i.kind, i.status, i.ranks) for i in d.incidents] == [("hang", "inconclusive", ())]
    assert [(u["rank"], u["host"]) for u in cluster["not_observed"]] == [(4, "b"), (5, "b"), (6, "b"), (7, "b")]
    assert any("ranks 4-7 not observed" in n for n in d.notes)


def test_a_rank_missing_on_another_host_is_named_with_that_host():
    a = _answer(1, range(4, 8), "b")
    job = Job(ranks=tuple(r for r in a.job.ranks if r.rank != 5), world_size=8, launcher="torchrun",
              launcher_pid=9, host="b", missing=(5,))
    answers = [_answer(0, range(0, 4), "a"),
               Answer(node=1, host="b", job=job, acts={r: x for r, x in a.acts.items() if r != 5}, window=a.window)]
    d, _ = decide(answers, [AgentState(0, "a", ANSWERED), AgentState(1, "b", ANSWERED)], world_size=8,
                  source="s:1", now=T0 + 5)
    assert [(i.kind, i.ranks, i.hosts) for i in d.incidents] == [("process_exit", (5,), ("b",))]
    assert [r["host"] for r in d.to_json()["job"]["ranks"] if r["rank"] == 5] == ["b"]


def test_a_window_answer_round_trips_through_its_codec_and_keeps_its_node():
    a = replace(_answer(1, range(4, 8), "b", idle=6), probes={"ebpf": None, "nvml": "no GPU"},
                records=(ExitRecord(time=T0, rank=5, pid=1005, exit_code=1, signal=None),))
    body = json.loads(json.dumps(answer.encode(a)))  # as unseal gives it back
    back = answer.decode(body, 1)
    assert back == a and back.acts == a.acts and back.probes == a.probes
    assert set(body) == {"node", "host", "window", "job", "acts", "records", "probes"}
    failed = answer.encode(Answer(node=0, host="a", job=None, error="no ranks found yet"))
    assert failed == {"node": 0, "host": "a", "error": "no ranks found yet"}
    assert answer.decode(failed, 0).error == "no ranks found yet"
    with pytest.raises(wire.Forged):  # node 0's answer passed off as node 1's
        answer.decode(failed, 1)


def test_heartbeat_beats_round_trip_compact_and_read_version_1():
    beats = [RankBeat(rank=r, pid=4000 + r, state="running", pause=0.0, stall=7.25 if r == 3 else 0.5,
                      signal="collectives", where="train.py:151 wait_for_buckets (in work.py:20 is_completed)",
                      stack="0a1b2c3d", seqs=(("gloo:0", 1200 + r), ("gloo:1", 7)), step=0.0512)
             for r in range(8)]
    beats[3] = RankBeat(rank=3, pid=4003, state="stopped", pause=9.0, stall=9.0, signal="main thread", dead=True,
                        where="train.py:78 load_next_batch", stack="ffee0011")
    part = json.loads(json.dumps(heartbeat.encode_ranks(beats)))
    assert part["v"] == heartbeat.HB_VERSION and len(part["places"]) == 2  # each distinct place once
    hb = heartbeat.Heartbeat(node=1, host="b", time=T0, seq=4, world_size=8, missing=(9,), busy_for=3.0, body=part)
    sent = heartbeat.encode(hb)
    back = heartbeat.decode(json.loads(json.dumps({**sent, "nonce": "n1"})))  # as unseal gives it
    assert back == hb and dict(back.body) == sent  # the body less the envelope's nonce (a bundle keeps it)
    assert [b.rank for b in back.beats] == list(range(8))
    assert back.beats[3] == beats[3]
    assert back.beats[0] == beats[0]
    assert back.ranks() == list(range(8))
    assert back.stalls()[3] == (3, 9.0, "main thread", True)
    # bounded: about 50 bytes a rank of JSON with two groups' sequence numbers, tables included
    assert len(json.dumps(part, separators=(",", ":"))) / 8 < 70
    many = heartbeat.encode_ranks([RankBeat(rank=0, where="x" * 500, seqs=tuple((f"g{i:02}", i) for i in range(40)))])
    assert len(many["places"][0][1]) == heartbeat.MAX_WHERE and len(many["groups"]) == heartbeat.MAX_GROUPS
    assert heartbeat.decode(many).beats[0].seqs == tuple((f"g{i:02}", i) for i in range(heartbeat.MAX_GROUPS))
    # an agent of version 1 sends state and pause only: its pause is the stall, its state says dead
    old = heartbeat.decode({"node": 0, "ranks": [{"r": 2, "pid": 9, "s": "stopped", "p": 4.5},
                                                 {"r": 5, "s": "sleeping", "p": 1}]})
    assert [(b.rank, b.stall, b.signal, b.dead) for b in old.beats] == [(2, 4.5, "main thread", True),
                                                                        (5, 1.0, "main thread", False)]
    assert old.stalls() == [(2, 4.5, "main thread", True), (5, 1.0, "main thread", False)]
    assert heartbeat.decode({"ranks": [{"r": 2, "s": "sleeping"}]}).ranks() == [2]


def test_a_heartbeat_says_finishing_when_a_rank_ended_and_is_not_dead():
    # the agent calls a rank that ended with status 0 not dead (cluster/beat.py): the job may be finishing
    def beat(*ranks: RankBeat) -> heartbeat.Heartbeat:
        return heartbeat.decode(json.loads(json.dumps(heartbeat.encode(
            heartbeat.Heartbeat(node=0, body=heartbeat.encode_ranks(ranks))))))
    running = RankBeat(rank=0, state="running")
    assert not beat(running, RankBeat(rank=1, state="sleeping")).finishing()
    assert beat(running, RankBeat(rank=1, state="gone", dead=False)).finishing()
    assert not beat(running, RankBeat(rank=1, state="zombie", dead=True)).finishing()  # killed: dead
    assert not beat(running, RankBeat(rank=1, state="stopped", dead=True)).finishing()
    assert heartbeat.decode({"ranks": [{"r": 2, "s": "gone"}]}).finishing() is False  # version 1: dead
