"""Snapshot tests of the dashboard's layout, grouped per feature (as pytest-textual-snapshot's
``snap_compare`` does; that plugin pins syrupy 4.8, which requires pytest < 9, and the project pins
pytest 9, so the comparison is done here with textual's own SVG export).

A snapshot is the SVG of the screen after a scripted source's snapshot was drawn. On a mismatch the
new SVG is written beside the test run (path in the failure) to look at; after looking at it,
``SCOUT_SNAPSHOT_UPDATE=1 pytest tests/test_tui_snapshots.py`` accepts it.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from scout_sys.tui.app import make_app
from scout_sys.tui.synthetic import ScriptedSource, synthetic_snapshot

HERE = os.path.dirname(os.path.abspath(__file__))
SNAPSHOTS = os.path.join(HERE, "snapshots", "tui")


@pytest.fixture(autouse=True)
def utc() -> Any:
    """Incident clocks are local time: pin the zone so that snapshots do not depend on the machine's."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


def snap_compare(name: str, snapshot: Any, *, size: tuple[int, int] = (140, 44),
                 run_before: Callable[[Any], Awaitable[None]] | None = None) -> None:
    async def shoot() -> str:
        app = make_app(ScriptedSource([(snapshot, [])], interval=3600))
        async with app.run_test(size=size) as pilot:
            for _ in range(50):
                if app.snapshot is not None:
                    break
                await pilot.pause(0.05)
            await pilot.pause()
            if run_before is not None:
                await run_before(pilot)
                await pilot.pause()
            await pilot.wait_for_scheduled_animations()
            return app.export_screenshot(title=name)

    svg = asyncio.run(shoot())
    path = os.path.join(SNAPSHOTS, f"{name}.svg")
    if os.environ.get("SCOUT_SNAPSHOT_UPDATE") == "1":
        os.makedirs(SNAPSHOTS, exist_ok=True)
        with open(path, "w") as f:
            f.write(svg)
        return
    if not os.path.exists(path):
        pytest.fail(f"no snapshot {path}: SCOUT_SNAPSHOT_UPDATE=1 writes it; look at it, commit it")
    with open(path) as f:
        want = f.read()
    if svg != want:
        fd, got = tempfile.mkstemp(prefix=f"scout-snapshot-{name}-", suffix=".svg")
        with os.fdopen(fd, "w") as f:
            f.write(svg)
        pytest.fail(f"snapshot {name} differs from {path}; this run's is {got} "
                    "(look at both; SCOUT_SNAPSHOT_UPDATE=1 accepts it)")


def test_hang_8_ranks_with_devices() -> None:
    snap_compare("hang_8_ranks", synthetic_snapshot(8, per_host=4, hung=2, devices=True))


def test_hang_1024_ranks() -> None:
    snap_compare("hang_1024_ranks", synthetic_snapshot(1024, per_host=8, hung=515), size=(160, 48))


def test_healthy_filtered() -> None:
    async def filter_(pilot: Any) -> None:
        await pilot.press("slash", *"node001", "enter")

    snap_compare("healthy_filtered", synthetic_snapshot(16, per_host=8, hung=None, closed=False),
                 run_before=filter_)


def test_help_screen() -> None:
    async def help_(pilot: Any) -> None:
        await pilot.press("question_mark")

    snap_compare("help", synthetic_snapshot(8, hung=2), run_before=help_)


def test_rank_details_literal_text() -> None:
    async def details(pilot: Any) -> None:
        await pilot.press("enter")

    snap_compare("rank_details_untrusted", synthetic_snapshot(4, hung=2, evil=True), run_before=details)
