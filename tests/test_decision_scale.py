"""The decision step's output is what it was before it was made fast (issue 40): every window rule over
generated tp=8 x pp=4 x dp jobs (benchmarks/_cases.py) — hang, process exit, stopped, desync, common
mode, straggler, healthy — at several sizes and faulty ranks, against tests/data/decision_verdicts.json,
written by the code before the speed-up. What is compared: every incident in full (kind, status, ranks,
hosts, since, summary, every evidence with its data), the notes and each rank's state; the file keeps a
digest of that and, readable, each case's verdicts.

``SCOUT_SNAPSHOT_UPDATE=1`` rewrites the file (only for a change of behaviour meant as one: say so in
the commit)."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import pytest

from benchmarks import _cases

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "decision_verdicts.json")
SIZES = (64, 256, 1024)


def _cases_list() -> list[tuple[int, str, int | None]]:
    out: list[tuple[int, str, int | None]] = []
    for n in SIZES:
        for fault in _cases.FAULTS:
            for at in (None, 0, n - 1):
                out.append((n, fault, at))
    return out


def _name(n: int, fault: str, at: int | None) -> str:
    return f"{fault}-{n}-{'default' if at is None else at}"


def _output(n: int, fault: str, at: int | None) -> dict[str, Any]:
    job = _cases.job_of(n)
    d = _cases.decide(job, _cases.observations(n, fault, at=at))
    full = {"incidents": [i.to_json() for i in d.incidents], "listed": [i.to_json() for i in d.listed],
            "notes": list(d.notes), "states": {str(r): a.state for r, a in sorted(d.acts.items())}}
    text = json.dumps(full, sort_keys=True, default=repr)
    return {"digest": hashlib.sha256(text.encode()).hexdigest(),
            "verdicts": [[i.kind, i.status, list(i.ranks)] for i in d.incidents]}


def _golden() -> dict[str, Any]:
    if os.environ.get("SCOUT_SNAPSHOT_UPDATE") == "1":
        out = {_name(*c): _output(*c) for c in _cases_list()}
        with open(DATA, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
            f.write("\n")
    with open(DATA) as f:
        return json.load(f)


GOLDEN = _golden()


@pytest.mark.parametrize("case", _cases_list(), ids=lambda c: _name(*c))
def test_the_decision_is_what_it_was(case: tuple[int, str, int | None]) -> None:
    want = GOLDEN[_name(*case)]
    got = _output(*case)
    assert got["verdicts"] == want["verdicts"]
    assert got["digest"] == want["digest"]  # every text, evidence and note as before


def test_the_cases_cover_every_fault_with_only_its_origin_named() -> None:
    """The generated cases are the faults they say (else the comparison above proves little), and each
    names its faulty rank alone: the tp partners of a stuck rank, which wait in their all-reduce while
    the rest wait in the dp one, are its witnesses, never a desync beside it (they once were)."""
    want = {"hang": "hang", "exit": "process_exit", "stopped": "process_stall", "desync": "collective_desync",
            "straggler": "straggler"}
    for n in SIZES:
        for fault, kind in want.items():
            for at in (None, 0, n - 1):
                origin = _cases.origin(n) if at is None else at
                got = GOLDEN[_name(n, fault, at)]["verdicts"]
                assert got == [[kind, "attributed", [origin]]], (fault, n, at, got)
        assert GOLDEN[_name(n, "common", None)]["verdicts"] == [["hang", "inconclusive", []]]
        assert GOLDEN[_name(n, "healthy", None)]["verdicts"] == []
