"""The incident kinds: one row per kind, read by every part that lists kinds.

The kind names themselves are model's vocabulary (scout_sys/model.py); which of them stop the job,
which blame a rank stuck outside every collective, and how each is described are consensus's, so
they live here once. ``HANG_KINDS`` (the watch's stack windows and bundles), ``STUCK_KINDS`` (the
verdict across peer groups, merging findings), the exporters' kinds and the JSON docs' list
(docs/json.md, checked by tests/test_kinds.py) are all derived from :data:`TABLE`.

Adding a kind: its constant in model.py, its row here, and the rule that finds it
(scout_sys/consensus/rules.py); see docs/architecture.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from scout_sys.model import DESYNC, HANG, HARDWARE, PROCESS_EXIT, PROCESS_STALL, SDC, STRAGGLER


@dataclass(frozen=True)
class Kind:
    name: str
    # The job stops making progress: the watch confirms it with a stack window, keeps it open between
    # windows and saves an evidence bundle when it opens.
    hang_like: bool
    # Its origin is stuck outside every collective (hung, stopped, gone): the ranks that wait for it
    # in collectives are its witnesses, and an eBPF "behind" desync about it corroborates it.
    stuck: bool
    description: str


TABLE: tuple[Kind, ...] = (
    Kind(HANG, True, True, "a rank elsewhere while the others wait"),
    Kind(PROCESS_STALL, True, True, "a rank stopped or in uninterruptible sleep"),
    Kind(PROCESS_EXIT, True, True, "a rank gone while the others wait, with its exit code when still readable"),
    Kind(DESYNC, True, False, "a rank waiting in a different collective, or at another position of the "
                              "collective sequence"),
    Kind(STRAGGLER, False, False, "the rank every step waits for (watch), or a device that runs the same "
                                  "kernels slower (replay)"),
    Kind(SDC, False, False, "a device that computes other bits than the strict majority of its peers (replay)"),
    Kind(HARDWARE, False, False, "a GPU that reports uncorrected ECC errors, or slows itself down while its "
                                 "peers' GPUs do not (NVML)"),
)

KINDS: tuple[str, ...] = tuple(k.name for k in TABLE)
HANG_KINDS = frozenset(k.name for k in TABLE if k.hang_like)
STUCK_KINDS = frozenset(k.name for k in TABLE if k.stuck)
