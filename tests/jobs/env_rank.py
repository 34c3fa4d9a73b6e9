"""Run the demo trainer, with one rank's environment changed at exec, as a bad device's context
differs: ``env_rank.py RANK KEY=VALUE [KEY=VALUE...] -- TRAINER ARGS``.

The chosen rank re-executes itself with the extra variables, so /proc/PID/environ shows them (as it
would for a rank started that way); the others run unchanged.
"""

import os
import runpy
import sys

if __name__ == "__main__":
    sep = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)
    target, extra, rest = sys.argv[1], sys.argv[2:sep], sys.argv[sep + 1:]
    env = dict(kv.split("=", 1) for kv in extra)
    if os.environ.get("RANK") == target and any(os.environ.get(k) != v for k, v in env.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **env})
    sys.argv = ["scout_sys.demo.train", *rest]
    runpy.run_module("scout_sys.demo.train", run_name="__main__", alter_sys=True)
