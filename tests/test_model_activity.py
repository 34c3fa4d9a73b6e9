"""A rank's window as consensus sees it (model_activity.py): the signature C3 votes on, the view
people are shown and its JSON, on records built by hand."""

from __future__ import annotations

from dataclasses import FrozenInstanceError

import pytest

from scout_sys import model
from scout_sys.model_activity import STATES, Activity, CollectiveWait, RankView

LOC = (("train.py", "step"), ("train.py", "main"))
WAIT = CollectiveWait(op="all_reduce", site="train.py:42", depth=3)


def test_the_states_in_their_documented_order_and_the_model_re_exports_them() -> None:
    assert STATES == ("waiting", "running", "busy", "idle", "stopped", "disk-sleep", "exited", "unknown")
    assert (model.Activity, model.RankView, model.CollectiveWait) == (Activity, RankView, CollectiveWait)


def test_a_collective_wait_is_labelled_by_op_and_site_and_defaults_to_a_direct_collective() -> None:
    assert WAIT.label() == "all_reduce at train.py:42"
    assert (WAIT.direct, WAIT.p2p) == (True, False)
    assert CollectiveWait("send", "pp.py:7", 0, direct=True, p2p=True).label() == "send at pp.py:7"


def test_a_waiting_rank_signs_with_its_collective_and_its_site() -> None:
    a = Activity(rank=0, pid=10, state="waiting", wait=WAIT, location=LOC)
    assert a.signature() == ("waiting", "all_reduce", "train.py:42")
    # the same op at another site is another witness; the depth does not count
    other = Activity(rank=1, pid=11, state="waiting", wait=CollectiveWait("all_reduce", "train.py:50", 3))
    deeper = Activity(rank=2, pid=12, state="waiting", wait=CollectiveWait("all_reduce", "train.py:42", 9))
    assert other.signature() == ("waiting", "all_reduce", "train.py:50")
    assert deeper.signature() == a.signature()


def test_a_waiting_rank_with_no_collective_found_signs_with_its_state_alone() -> None:
    assert Activity(rank=0, pid=10, state="waiting", location=LOC).signature() == ("waiting",)


def test_busy_and_idle_at_the_same_place_are_one_witness() -> None:
    busy = Activity(rank=0, pid=10, state="busy", location=LOC, main_cpu=0.99)
    idle = Activity(rank=1, pid=11, state="idle", location=LOC, main_cpu=0.0)
    assert busy.signature() == idle.signature() == ("still", LOC)
    elsewhere = Activity(rank=2, pid=12, state="busy", location=(("data.py", "load"),))
    assert elsewhere.signature() == ("still", (("data.py", "load"),))
    # a wait recorded on a rank that is not waiting does not enter its signature
    assert Activity(rank=3, pid=13, state="idle", wait=WAIT, location=LOC).signature() == ("still", LOC)


@pytest.mark.parametrize("state", ["running", "stopped", "disk-sleep", "exited", "unknown"])
def test_every_other_state_signs_with_the_state_alone(state: str) -> None:
    assert Activity(rank=0, pid=None, state=state, wait=WAIT, location=LOC).signature() == (state,)


def test_the_view_of_a_waiting_rank_carries_its_collective_cpu_percent_and_stack() -> None:
    stack = ("gloo.py:1 wait", "train.py:42 step")
    a = Activity(rank=5, pid=10, state="waiting", where="train.py:42 step", wait=WAIT, stack=stack, cpu=0.25,
                 main_cpu=0.01, wrote=4096, status="S (sleeping)")
    assert a.view() == RankView(rank=5, state="waiting", where="train.py:42 step",
                                collective="all_reduce at train.py:42", cpu_percent=25.0, stack=stack)


def test_the_view_of_a_rank_with_no_wait_and_no_cpu_reading() -> None:
    v = Activity(rank=2, pid=None, state="exited", exit_code=1).view()
    assert v == RankView(rank=2, state="exited", where="", collective=None, cpu_percent=None, stack=())
    assert Activity(rank=2, pid=7, state="idle", cpu=0.0).view().cpu_percent == 0.0


def test_a_view_in_json_is_its_state_and_place_with_collective_and_cpu_only_when_known() -> None:
    assert RankView(rank=0, state="unknown").to_json() == {"state": "unknown", "where": ""}
    v = RankView(rank=3, state="waiting", where="t.py:1 f", collective="all_reduce at t.py:1",
                 cpu_percent=12.345, stack=("t.py:1 f",))
    assert v.to_json() == {"state": "waiting", "where": "t.py:1 f", "collective": "all_reduce at t.py:1",
                           "cpu_percent": 12.3}
    # a CPU of zero is a reading (kept); an empty collective is none (left out)
    assert RankView(rank=1, state="idle", collective="", cpu_percent=0.0).to_json() == {
        "state": "idle", "where": "", "cpu_percent": 0.0}
    assert RankView(rank=1, state="busy", cpu_percent=99.96).to_json()["cpu_percent"] == 100.0


def test_the_records_are_frozen_and_hashable() -> None:
    a = Activity(rank=0, pid=10, state="busy", location=LOC, stack=("x",))
    with pytest.raises(FrozenInstanceError):
        a.state = "idle"  # type: ignore[misc]
    assert len({a, Activity(rank=0, pid=10, state="busy", location=LOC, stack=("x",))}) == 1
    assert len({RankView(0, "idle"), RankView(0, "idle"), RankView(1, "idle")}) == 2
