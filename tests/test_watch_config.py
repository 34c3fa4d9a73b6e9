"""WatchConfig: the watch's settings built once from the command line (watch/config.py)."""

from __future__ import annotations

import argparse

import pytest

from scout_sys.errors import ScoutError
from scout_sys.watch.config import WatchConfig


def _args(**kw: object) -> argparse.Namespace:
    base = {"interval": 0.5, "stall_after": None, "state_dir": None, "ebpf": True, "topology": None,
            "wait_ranks": None, "replay": True, "replay_every": None, "job": "1", "json": False}
    return argparse.Namespace(**{**base, **kw})


def test_from_args_takes_the_watch_options_and_leaves_the_rest() -> None:
    c = WatchConfig.from_args(_args(interval=2.0, ebpf=False, topology="dp=2"))
    assert (c.interval, c.ebpf, c.topology, c.stack_period) == (2.0, False, "dp=2", 4.0)


@pytest.mark.parametrize("bad", [{"interval": 0}, {"stall_after": -1.0}, {"wait_ranks": 0.0}, {"replay_every": -2}])
def test_from_args_refuses_values_that_are_not_positive(bad: dict) -> None:
    with pytest.raises(ScoutError, match="must be positive"):
        WatchConfig.from_args(_args(**bad))


def test_settings_one_by_one_override_the_config_and_unknown_ones_are_refused() -> None:
    assert WatchConfig(interval=1.0).with_settings({"stall_after": 3.0}) == WatchConfig(interval=1.0, stall_after=3.0)
    with pytest.raises(TypeError, match="intervall"):
        WatchConfig().with_settings({"intervall": 1.0})
