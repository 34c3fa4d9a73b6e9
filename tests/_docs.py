"""What the documentation tests share: the pages, the real tools they run (jq, visudo, promtool: `make
doctools`), the runbook's jq lines and the example hook (tests/test_docs_*.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import STRICT_SKIPS

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES = [ROOT / "examples" / "on-incident.sh", ROOT / "examples" / "prometheus-alerts.yml"]
REPORT = ROOT / "tests" / "data" / "megatron_lock_report.json"  # a real saved report (a Megatron-style hang)
HOOK = ROOT / "examples" / "on-incident.sh"
VERBS = ("diagnose", "watch", "demo", "doctor", "agent", "replay", "certify")

def _tool(name: str) -> str:
    """A tool `make` installs (scripts/setup-doc-tools.sh); missing under make test is a failure."""
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        msg = f"{name} not found: make doctools installs it (scripts/setup-doc-tools.sh)"
        if STRICT_SKIPS:
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def _text(p: Path) -> str:
    return p.read_text(encoding="utf-8")


def _blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, re.M | re.S)


def _jq(expr: str, doc: str, *, raw: bool) -> list[str]:
    out = subprocess.run([_tool("jq"), *(["-r"] if raw else ["-c"]), expr], input=doc, capture_output=True,
                         text=True, timeout=30, check=False)
    assert out.returncode == 0, (expr, out.stderr)
    return out.stdout.splitlines()


def _runbook_jq(needle: str) -> tuple[str, bool]:
    """The jq expression of the runbook's line that contains ``needle``, and whether it is -r."""
    for line in _text(ROOT / "docs" / "runbook.md").splitlines():
        m = re.search(r"\bjq (-r )?'([^']*)'", line)
        if m and needle in m.group(2):
            return m.group(2), bool(m.group(1))
    raise AssertionError(f"no jq line with {needle!r} in docs/runbook.md")


def _diagnosis_jq_checks(d: dict) -> None:
    """The runbook's jq lines over a diagnosis/v1 object print what they promise."""
    expr, raw = _runbook_jq(".incidents[]")
    want = [f"{i['kind']} ({i['status']}) ranks {','.join(map(str, i['ranks']))} on {','.join(i['hosts'])}"
            for i in d["incidents"]]
    assert _jq(expr, json.dumps(d), raw=raw) == want
    expr, raw = _runbook_jq(".job.ranks[]")
    assert _jq(expr, json.dumps(d), raw=raw) == [f"{r['rank']} {r['state']} {r.get('where') or 'null'}"
                                                 for r in d["job"]["ranks"]]




def hook(event: dict, *args: str) -> str:
    """examples/on-incident.sh --dry-run on ``event`` (no SCOUT_SYS_* from this environment): what it would run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCOUT_SYS_")}
    out = subprocess.run(["bash", str(HOOK), "--dry-run", *args], input=json.dumps(event), capture_output=True,
                         text=True, timeout=30, env=env, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()
