"""WatchConfig: the watch's settings built once from the command line (watch/config.py)."""

from __future__ import annotations

import argparse

import pytest

from scout_sys.cluster.watch import ClusterWatcher
from scout_sys.errors import ScoutError
from scout_sys.watch import Watcher
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


def test_the_watchers_take_their_settings_as_one_value_only() -> None:
    config = WatchConfig(interval=1.5, stall_after=3.0, ebpf=False)
    assert Watcher("999999999", config).config is config
    assert Watcher("999999999").config == WatchConfig()
    assert ClusterWatcher(lambda: None, config).config is config
    assert ClusterWatcher(lambda: None).config == WatchConfig(interval=1.0)
    with pytest.raises(TypeError):
        Watcher("999999999", interval=1.0)
    with pytest.raises(TypeError):
        ClusterWatcher(lambda: None, stall_after=2.0)
