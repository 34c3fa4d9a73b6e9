"""Replay beside the live job, and checkpoint certification (docs/replay.md).

- ``worker.py``: the self-contained script each worker runs with its rank's interpreter (the only
  part that imports torch while the job runs); deterministic kernels, a digest and a time each.
- ``context.py``: the job's devices and each rank's execution context.
- ``runner.py``: starts the workers, runs rounds, decides with ``consensus/replay.py``;
  ``run_rounds(job, ...)`` / ``run_round(job, ...)`` are the library entry points.
- ``ledger.py``: every round, one JSON line in the state directory.
- ``live.py``: ``ReplayPart``, replay as a part of the live loop (on a confirmed straggler, periodic).
- ``checkpoint.py`` / ``certify.py``: ``scout-sys certify`` (imports torch; never runs pickle code).

Importing this package imports nothing of the above.
"""
