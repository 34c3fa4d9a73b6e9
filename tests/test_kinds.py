"""The table of incident kinds (consensus/kinds.py) and the rule registry (consensus/rules.py):
every list of kinds is derived from the one table, and every place that decides runs the registry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scout_sys.consensus import kinds, rules
from scout_sys.exporters import prometheus
from scout_sys.model import (
    ATTRIBUTED,
    DESYNC,
    HANG,
    HARDWARE,
    PROCESS_EXIT,
    PROCESS_STALL,
    Incident,
    Job,
    Rank,
)

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _job(n: int = 4) -> Job:
    return Job(ranks=tuple(Rank(rank=r, pid=1000 + r, host="h") for r in range(n)), world_size=n,
               launcher="torchrun", launcher_pid=999, host="h")


def test_the_json_docs_list_the_kinds_of_the_table() -> None:
    text = (DOCS / "json.md").read_text()
    line = next(ln for ln in text.splitlines() if '{"kind":' in ln)
    assert re.findall(r'"([a-z_]+)"', line.split('{"kind":', 1)[1]) == list(kinds.KINDS)


def test_every_list_of_kinds_comes_from_the_table() -> None:
    from scout_sys.consensus import groups
    from scout_sys.watch import HANG_KINDS

    assert kinds.HANG_KINDS == {HANG, PROCESS_STALL, PROCESS_EXIT, DESYNC} == HANG_KINDS
    assert kinds.STUCK_KINDS == {HANG, PROCESS_STALL, PROCESS_EXIT} == groups.STUCK_KINDS
    assert prometheus.KINDS is kinds.KINDS
    assert len(set(kinds.KINDS)) == len(kinds.KINDS) and all(k.description for k in kinds.TABLE)


def test_every_rule_finds_kinds_of_the_table_at_known_cadences() -> None:
    names = [r.name for r in rules.RULES]
    assert len(names) == len(set(names))
    for r in rules.RULES:
        assert r.kinds <= set(kinds.KINDS) and r.cadences and r.cadences <= set(rules.CADENCES) and r.reads


def test_each_rule_runs_once_in_registry_order_and_sees_the_findings_before_it() -> None:
    seen: list[tuple[str, list[str]]] = []

    def rule(name: str, kind: str, cadences: frozenset[str]) -> rules.Rule:
        def run(ctx: rules.Context) -> rules.Found:
            seen.append((name, list(ctx.found)))
            return rules.Found([Incident(kind=kind, status=ATTRIBUTED, ranks=(len(seen),), hosts=("h",), since=1.0,
                                         summary=name)], [f"{name} note"])
        return rules.Rule(name, frozenset({kind}), cadences, (object,), run)

    registry = (rule("a", HANG, frozenset({rules.WINDOW})), rule("b", HARDWARE, frozenset({rules.POLL, rules.WINDOW})),
                rule("c", DESYNC, frozenset({rules.WINDOW})))
    d = rules.decide(_job(), [], cadence=rules.WINDOW, rules=registry)
    assert seen == [("a", []), ("b", ["a"]), ("c", ["a", "b"])]
    assert [i.summary for i in d.incidents] == ["a", "b", "c"] and d.notes == ["a note", "b note", "c note"]
    seen.clear()
    assert [i.summary for i in rules.decide(_job(), [], cadence=rules.POLL, rules=registry).listed] == ["b"]
    assert rules.decide(_job(), [], cadence=rules.WINDOW, kinds={DESYNC}, rules=registry).found[0][0] == "c"
    with pytest.raises(ValueError, match="cadence"):
        rules.decide(_job(), [], cadence="hourly")


def test_the_desync_rule_runs_once_per_window() -> None:
    """One desync finding per window: a second desync rule at the window cadence would report the
    cross-group desync twice (once per equivalent group's view)."""
    window = [r for r in rules.RULES if rules.WINDOW in r.cadences and DESYNC in r.kinds and r.name != "hang"]
    assert [r.name for r in window] == ["desync"]
    d = rules.decide(_job(), [], cadence=rules.WINDOW, window=(0.0, 3.0))
    assert [n for n, _ in d.found] == ["hang", "lifecycle", "desync", "hardware", "straggler_window"]
