"""The DeepSpeed and TorchTitan rows of consensus/patterns.py decide where no torch frame does.

On the CPU / Gloo jobs of test_frameworks_e2e.py the witnesses' innermost frame is torch's (its
``all_reduce`` in distributed_c10d, FSDP2's collectives), which wins over the framework's rows: those
tests pass with the rows removed. Here the stacks are those where a framework's own frame is the
innermost one that waits, built from the frameworks' installed source (the very lines, found by
their text, of the versions in .venv), as py-spy names them:

- DeepSpeed's coalesced all-gather (``deepspeed.comm.all_gather_coalesced``, synchronous, as ZeRO-3
  calls it): ``TorchBackend.all_gather_coalesced`` waits on the last work handle itself
  (``reqs[-1].wait()``, C++ below it), under ``deepspeed/comm/comm.py``'s function of the same name;
- DeepSpeed's pipeline engine waiting for its neighbours' sends and receives in ``p2p.wait()``
  (``op.wait()`` on each handle, C++ below it);
- TorchTitan's loss / norm reduction on a GPU (``dist_sum`` → ``_dist_reduce``): the functional
  all-reduce returns an AsyncCollectiveTensor, and its ``.item()`` blocks in the device-to-host copy
  inside ``AsyncCollectiveTensor.__torch_dispatch__`` (no collective row there: the NCCL wait_tensor
  only made the stream wait and returned); and ``set_pg_timeouts``, which waits in
  ``device_module.synchronize()`` after its barrier.

Each is checked with the table as it is and with the framework's rows taken out: the rows change the
verdict (None without them: the rank would be no witness)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from scout_sys.consensus import patterns
from scout_sys.model import Frame

TRAIN = "/home/u/train.py"


def _source(package: str, rel: str) -> Path:
    """A file of an installed package, found without importing it (torch stays out of this test)."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, f"{package} is not installed (make installs it)"
    path = Path(next(iter(spec.submodule_search_locations))) / rel
    assert path.is_file(), path
    return path


def _line(path: Path, text: str, after: str | None = None) -> int:
    """The number of the first line holding ``text`` (after the first line holding ``after``)."""
    lines = path.read_text().splitlines()
    start = 0 if after is None else next(i for i, ln in enumerate(lines) if after in ln)
    return next(i + 1 for i, ln in enumerate(lines[start:], start) if text in ln)


def _frame(function: str, path: Path, text: str, after: str | None = None) -> Frame:
    return Frame(function=function, file=str(path), line=_line(path, text, after))


def _without(monkeypatch: pytest.MonkeyPatch, part: str) -> None:
    """The table without the rows of ``part`` (as if they were never written)."""
    monkeypatch.setattr(patterns, "PATTERNS", tuple(p for p in patterns.PATTERNS if part not in p.path))
    patterns.collective_of.cache_clear()


@pytest.fixture(autouse=True)
def _fresh_cache():
    patterns.collective_of.cache_clear()
    yield
    patterns.collective_of.cache_clear()


def _deepspeed_coalesced_gather() -> tuple[Frame, ...]:
    torch_py = _source("deepspeed", "comm/torch.py")
    comm_py = _source("deepspeed", "comm/comm.py")
    return (
        _frame("TorchBackend.all_gather_coalesced", torch_py, "reqs[-1].wait()",
               after="def all_gather_coalesced"),
        _frame("stage_on_cpu.<locals>.wrapper", torch_py, "return func(self, *args, **kwargs)",
               after="def stage_on_cpu"),
        _frame("all_gather_coalesced", comm_py, "return cdb.all_gather_coalesced", after="def all_gather_coalesced"),
        Frame("gather_params", TRAIN, 41),
        Frame("<module>", TRAIN, 90),
    )


@pytest.mark.torch  # reads the installed framework's source: the dev venv, never .venv-oldest
def test_deepspeeds_own_wait_in_its_coalesced_all_gather_is_a_collective_wait(monkeypatch):
    stack = _deepspeed_coalesced_gather()
    w = patterns.collective_of(stack)
    # deepspeed.comm's function is the collective (an op row): its name, the caller's line as the site
    assert w is not None and (w.op, w.direct, w.depth, w.p2p, w.site) == (
        "all_gather_coalesced", True, 2, False, "/home/u/train.py:41"), w
    # without comm.py's rows the backend's frame (a wrapper row) still says where it waits...
    monkeypatch.setattr(patterns, "PATTERNS", tuple(p for p in patterns.PATTERNS if p.path != "deepspeed/comm/comm.py"))
    patterns.collective_of.cache_clear()
    w = patterns.collective_of(stack)
    assert w is not None and (w.op, w.direct, w.depth) == ("all_gather_coalesced", False, 0), w
    # ...and without DeepSpeed's rows at all the rank waits in no collective
    _without(monkeypatch, "deepspeed/")
    assert patterns.collective_of(stack) is None


@pytest.mark.torch  # reads the installed framework's source: the dev venv, never .venv-oldest
def test_deepspeeds_pipeline_wait_is_a_point_to_point_wait(monkeypatch):
    p2p = _source("deepspeed", "runtime/pipe/p2p.py")
    engine = _source("deepspeed", "runtime/pipe/engine.py")
    stack = (_frame("wait", p2p, "op.wait()", after="def wait"),
             _frame("PipelineEngine._exec_schedule", engine, "self._exec_instr(**cmd.kwargs)"),
             Frame("<module>", TRAIN, 30))
    w = patterns.collective_of(stack)
    assert w is not None and (w.op, w.p2p, w.direct, w.depth) == ("pipeline p2p", True, False, 0), w
    _without(monkeypatch, "deepspeed/runtime/pipe/")
    assert patterns.collective_of(stack) is None


def _titan_dist_sum_on_a_gpu() -> tuple[Frame, ...]:
    funcol = _source("torch", "distributed/_functional_collectives.py")
    utils = _source("torchtitan", "distributed/utils.py")
    return (
        _frame("AsyncCollectiveTensor.__torch_dispatch__", funcol, "out = func(*unwrapped_args, **unwrapped_kwargs)",
               after="def __torch_dispatch__"),
        _frame("_dist_reduce", utils, "return funcol.all_reduce(x, reduceOp=reduceOp, group=mesh).item()"),
        _frame("dist_sum", utils, "return _dist_reduce(", after="def dist_sum"),
        Frame("Trainer.train_step", "/x/site-packages/torchtitan/train.py", 500),
        Frame("<module>", TRAIN, 12),
    )


def _titan_set_pg_timeouts_on_a_gpu() -> tuple[Frame, ...]:
    utils = _source("torchtitan", "distributed/utils.py")
    return (
        _frame("set_pg_timeouts", utils, "device_module.synchronize()", after="def set_pg_timeouts"),
        Frame("Trainer.train", "/x/site-packages/torchtitan/train.py", 600),
        Frame("<module>", TRAIN, 12),
    )


@pytest.mark.torch  # reads the installed framework's source: the dev venv, never .venv-oldest
def test_torchtitans_own_reductions_on_a_gpu_are_collective_waits(monkeypatch):
    w = patterns.collective_of(_titan_dist_sum_on_a_gpu())
    # a wrapper row: the op is the TorchTitan function's; the site is the first frame outside the libraries
    assert w is not None and (w.op, w.direct, w.depth, w.p2p, w.site) == ("dist_reduce", False, 1, False,
                                                                            "/home/u/train.py:12"), w
    w = patterns.collective_of(_titan_set_pg_timeouts_on_a_gpu())
    assert w is not None and (w.op, w.direct, w.depth) == ("set_pg_timeouts", False, 0), w
    _without(monkeypatch, "torchtitan/")
    assert patterns.collective_of(_titan_dist_sum_on_a_gpu()) is None
    assert patterns.collective_of(_titan_set_pg_timeouts_on_a_gpu()) is None
