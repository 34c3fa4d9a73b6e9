"""The dashboard's Source protocol: every source the dashboard is given answers every member the app
reads, and one that lacks a member is refused when the app is made, not rendered with a guessed
default."""

from __future__ import annotations

import re
from typing import Any

import pytest

from scout_sys.cluster.source import ClusterSource
from scout_sys.tui.source import (
    SOURCE_MEMBERS,
    ReportSource,
    Source,
    SourceDefaults,
    check_source,
    report_json,
)
from scout_sys.tui.synthetic import ScriptedSource, synthetic_snapshot
from scout_sys.watch import WatchConfig, Watcher


def _sources(tmp_path: Any) -> dict[str, Any]:
    snap = synthetic_snapshot(4, hung=2)
    return {
        "watch --job": Watcher("999999999", config=WatchConfig(ebpf=False, state_dir=str(tmp_path / "w"))),
        "watch --cluster": ClusterSource(lambda: None, config=WatchConfig(interval=1.0, state_dir=str(tmp_path / "c")),
                                          store="node0:29450"),
        "saved report": ReportSource(report_json(snap)),
        "scripted": ScriptedSource([(snap, [])]),
    }


def test_the_protocol_names_what_the_app_reads() -> None:
    """A member the app starts to read is added to the protocol (and so to every source)."""
    import scout_sys.tui.app as app
    import scout_sys.tui.commands as commands

    reads: set[str] = set()
    for mod in (app, commands):  # the app and its commands (d, s, r)
        with open(mod.__file__) as f:
            reads |= set(re.findall(r"(?:self\.|(?<![.\w]))source\.(\w+)", f.read()))  # not tui.source.X
    assert reads | {"close"} == set(SOURCE_MEMBERS)  # close: run_dashboard's caller closes its source


def test_every_source_is_a_complete_source(tmp_path: Any) -> None:
    for name, src in _sources(tmp_path).items():
        assert isinstance(src, Source), name
        check_source(src)
        # its own members, not found through a __getattr__ (ClusterSource once delegated that way)
        missing = [m for m in SOURCE_MEMBERS if not hasattr(type(src), m) and m not in vars(src)]
        assert not missing, (name, missing)


def test_each_source_answers_for_itself(tmp_path: Any) -> None:
    s = _sources(tmp_path)
    w, c, r, p = s["watch --job"], s["watch --cluster"], s["saved report"], s["scripted"]
    assert (w.live, w.path, w.can_replay, w.snapshot, w.ever_opened) == (True, None, True, None, False)
    assert w.state_dir == str(tmp_path / "w") and w.interval == w.config.interval
    assert not w.replay_now()  # no job bound yet: no replay part
    assert (c.live, c.path, c.can_replay, c.replay_now(), c.snapshot) == (True, None, False, False, None)
    assert c.waiting and c.state_dir == str(tmp_path / "c")
    assert (r.live, r.path, r.state_dir, r.can_replay, r.waiting) == (False, None, None, False, None)
    assert r.snapshot is not None and not r.ever_opened
    assert (p.live, p.interval, p.path, p.state_dir, p.can_replay) == (True, 0.25, None, None, False)


def test_a_saved_file_names_itself(tmp_path: Any) -> None:
    import json

    f = tmp_path / "r.json"
    f.write_text(json.dumps(report_json(synthetic_snapshot(4, hung=2))))
    r = ReportSource(str(f))
    assert (r.path, r.state_dir, r.live) == (str(f), str(tmp_path), False)


class _Methods:
    """The methods every source has (these tests are about its attributes)."""

    def poll(self) -> list[Any]:
        return []

    def diagnose_now(self, window: float = 3.0) -> Any:
        raise NotImplementedError

    def interrupt(self) -> None:
        pass

    def close(self) -> None:
        pass


class Incomplete(_Methods):
    """A source from before the protocol: no ``path``, ``waiting``, ``ever_opened``, replay."""

    live = True
    interval = 0.5
    state_dir = None
    snapshot = None


def test_a_source_missing_members_is_refused() -> None:
    from scout_sys.tui.app import make_app

    src = Incomplete()
    assert not isinstance(src, Source)
    with pytest.raises(TypeError, match="lacks can_replay, ever_opened, path, replay_now, waiting"):
        check_source(src)
    with pytest.raises(TypeError, match="Incomplete is not a dashboard Source"):
        make_app(src)  # type: ignore[arg-type]


def test_defaults_complete_a_source_that_sets_only_what_differs() -> None:
    class Minimal(SourceDefaults, _Methods):
        snapshot = None

    src = Minimal()
    check_source(src)
    assert (src.live, src.interval, src.path, src.waiting, src.ever_opened, src.can_replay) == (
        True, 0.5, None, None, False, False)
    assert not src.replay_now()
