"""A monitor stand-in for the detach test: attaches the collectives probe to PID, says so, sleeps."""

from __future__ import annotations

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
time.sleep(600)
