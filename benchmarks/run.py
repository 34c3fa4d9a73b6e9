"""Run every benchmark in this folder (``make bench``); each prints its own ratios."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    rc = 0
    for path in sorted(glob.glob(os.path.join(HERE, "*.py"))):
        if os.path.basename(path) in ("run.py", "__init__.py") or os.path.basename(path).startswith("_"):
            continue
        print(f"== {os.path.basename(path)}", flush=True)
        rc |= subprocess.run([sys.executable, path], cwd=os.path.dirname(HERE), check=False).returncode
    return rc


if __name__ == "__main__":
    sys.exit(main())
