"""``watch --every-job``: one monitor for every job on its node, as node_exporter or dcgm-exporter is.

A node that runs two jobs at once (two torchruns on a shared GPU node, a Slurm node shared by two
steps) is one node to watch: the node-level deployments (the DaemonSet, the systemd unit, the Slurm
prolog) start one monitor per node, not per job. :class:`NodeWatch` looks every ``look_every``
seconds for the jobs an ``env:`` selector covers (``job.job_keys``: ranks grouped by their job's key,
the run id or the master's address), and follows each with a :class:`~scout_sys.watch.Watcher` of its
own, on its own thread — its own incidents, bundles and probes, exactly as ``watch --job`` would
follow it alone. Each job's events carry its name (``job``, the metrics' ``job`` label); the sinks are
shared (one metrics port for the node, one events file, one hook), each job's snapshot feeding its
own series. A job whose watch ended (the job ended) is not watched again unless new rank processes
appear with its key (a new incarnation).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scout_sys.errors import ScoutError
from scout_sys.model import Event, with_job

LOOK_EVERY = 2.0  # seconds between two looks for new jobs (each look reads every process's environ)


@dataclass
class _Followed:
    label: str
    thread: threading.Thread
    watcher: Any = None
    pids: frozenset[int] = field(default_factory=frozenset)
    opened: bool = False


def _rank_pids(selector: str, key: str) -> set[int]:
    from scout_sys.job import find_job

    try:
        return {r.pid for r in find_job(selector, key=key).ranks}
    except ScoutError:
        return set()


class NodeWatch:
    """Every job ``selector`` (an ``env:`` selector) covers on this host, each followed apart.

    ``watcher(key)``: a new Watcher for that job; ``sinks(label)``: the sinks one job's watch feeds
    (labelled for it; closed when its watch ends); ``emit(e)``: each event, its ``job`` set; ``say``:
    a line for people (a job that could not be watched)."""

    def __init__(self, selector: str, *, watcher: Callable[[str], Any], sinks: Callable[[str], Any],
                 emit: Callable[[Event], None], say: Callable[[str], None],
                 keys: Callable[[str], dict[str, str]] | None = None,
                 pids: Callable[[str, str], set[int]] | None = None, look_every: float = LOOK_EVERY) -> None:
        """``keys(selector)``: the jobs it covers now, key → label (job.job_keys); ``pids(selector, key)``:
        that job's rank pids now (empty when none)."""
        from scout_sys.job import job_keys

        self.selector = selector
        self.watcher, self.sinks, self.emit, self.say = watcher, sinks, emit, say
        self.keys = keys or job_keys
        self.pids = pids or _rank_pids
        self.look_every = look_every
        self.followed: dict[str, _Followed] = {}
        self.ended: dict[str, frozenset[int]] = {}  # key -> the rank pids its ended watch followed
        self._done: list[_Followed] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one job's event at a time through the printer and shared sinks

    @property
    def ever_opened(self) -> bool:
        return any(f.opened for f in [*self.followed.values(), *self._done])

    def run(self, stop: threading.Event) -> int:
        """Look for jobs and follow each until ``stop``; 1 if any job's watch opened an incident, else 0."""
        try:
            while not stop.is_set():
                self.look()
                stop.wait(self.look_every)
        finally:
            self.close()
        return 1 if self.ever_opened else 0

    def look(self) -> None:
        """Start a watch for each job seen for the first time (or seen again with new ranks)."""
        for key, f in list(self.followed.items()):
            if not f.thread.is_alive():  # its job ended (or could not be watched)
                self.ended[key] = f.pids
                self._done.append(self.followed.pop(key))
        keys = self.keys(self.selector)
        self.ended = {k: v for k, v in self.ended.items() if k in keys}  # gone for good: forgotten
        for key, label in keys.items():
            if key not in self.followed and not self._ended_and_unchanged(key):
                self._follow(key, label)

    def _ended_and_unchanged(self, key: str) -> bool:
        """The job's watch ended and no new rank process carries its key (its last ranks linger)."""
        return key in self.ended and self.pids(self.selector, key) <= self.ended[key]

    def _follow(self, key: str, label: str) -> None:
        t = threading.Thread(target=self._one, args=(key, label), name=f"job-{label}", daemon=True)
        self.followed[key] = f = _Followed(label, t)
        f.watcher = self.watcher(key)
        t.start()

    def _one(self, key: str, label: str) -> None:
        f = self.followed[key]
        w = f.watcher
        sinks = self.sinks(label)

        def on_event(e: Event) -> None:
            with self._lock:
                self.emit(with_job(e, label))

        try:
            w.start()
            sinks.attach(w)
            w.run(on_event, self._stop, on_job=lambda job: self.say(
                f"job {label}: watching {job.world_size} ranks ({len(job.ranks)} on {job.host}), launcher "
                f"{job.launcher} pid {job.launcher_pid}"))
        except ScoutError as e:
            self.say(f"job {label}: cannot watch it: {e}")
        except Exception as e:  # noqa: BLE001 - one job's failure never ends the node's watch
            self.say(f"job {label}: its watch failed: {type(e).__name__}: {e}")
        finally:
            f.opened = w.ever_opened
            f.pids = frozenset(r.pid for r in (w.job.ranks if w.job is not None else ()))
            # the node's watch exits (SIGTERM): its probes detach in a child, as a lone watch's do; a job
            # that ended while the node's watch goes on has them detached here, now
            stopping = self._stop.is_set()
            w.close(background=stopping, exiting=stopping)
            sinks.close()
            if not stopping:
                self.say(f"job {label}: {'ended' if w.ended else 'watch stopped'}")

    def close(self) -> None:
        """Stop every job's watch (each detaches its probes) and wait for them."""
        self._stop.set()
        for f in list(self.followed.values()):
            f.thread.join(30)
        self._done += self.followed.values()
        self.followed = {}


__all__ = ["LOOK_EVERY", "NodeWatch"]
