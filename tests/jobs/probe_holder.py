"""A monitor stand-in for the detach tests: attaches the collectives probe to PID, says so, sleeps.

``probe_holder.py PID exit``: instead, once attached, the probe's perf-event fds are closed behind
bcc's back (as a probe thread still closing them does when the watch exits under load) and the
process exits normally, so that whatever runs at exit meets fds already closed."""

from __future__ import annotations

import os
import socket
import sys
import time

from scout_sys.model import Job, Rank
from scout_sys.probes.ebpf.collectives import CollectiveProbe

pid = int(sys.argv[1])
job = Job(ranks=(Rank(rank=0, pid=pid, host=socket.gethostname()),), world_size=1, launcher="explicit",
          launcher_pid=None, host=socket.gethostname())
probe = CollectiveProbe()
probe.start(job)
print("attached", len(probe.attached), flush=True)
if sys.argv[2:] == ["exit"]:
    for fd in list(probe._bpf.uprobe_fds.values()):
        os.close(fd)
    sys.exit(0)
time.sleep(600)
