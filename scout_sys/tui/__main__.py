"""``python -m scout_sys.tui REPORT.json``: reopen a saved report in the dashboard."""

from __future__ import annotations

import sys

from scout_sys.errors import ScoutError


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: python -m scout_sys.tui REPORT.json   (a scout-sys/diagnosis/v1 report)", file=sys.stderr)
        return 2
    from scout_sys.tui.app import run_dashboard
    from scout_sys.tui.source import ReportSource

    try:
        src = ReportSource(argv[0])
    except ScoutError as e:
        print(f"scout-sys: error: {e}", file=sys.stderr)
        return 2
    return run_dashboard(src)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
