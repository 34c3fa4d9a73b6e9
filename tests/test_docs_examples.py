"""The documentation's examples, run as written where this machine can run them (README.md, docs/,
examples/, --help): every `scout-sys VERB --flag` the docs name exists in that verb's --help; the
runbook's jq lines print what they say from real JSON (a saved real report, a real certificate); every
shell block parses (`bash -n`); each glossary link lands on a term; the records and options the docs
describe (cpu_percent, --pid-file, --output) behave so. The sudoers rule, the alert rules and the hook:
tests/test_docs_ops.py; on a real job: tests/test_docs_examples_e2e.py."""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from scout_sys.cli import build_parser
from scout_sys.model import (
    Diagnosis,
    Job,
    Rank,
    RankView,
    Snapshot,
)
from tests._docs import (
    EXAMPLES,
    HOOK,
    PAGES,
    REPORT,
    ROOT,
    VERBS,
    _blocks,
    _diagnosis_jq_checks,
    _jq,
    _text,
)

T = 1_764_000_000.0


# ------------------------------------------------------------------ flags named in the docs exist


def _verb_help() -> dict[str, str]:
    p = build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return {v: sub.choices[v].format_help() for v in VERBS}


def _documented_flags() -> list[tuple[str, str, str]]:
    """(page, verb, flag) for each `scout-sys VERB ... --flag` of a command line in the docs, the
    examples and the --help epilogs; quoted arguments (a hook's own command line) left out."""
    sources = [(p.name, _text(p)) for p in [*PAGES, *EXAMPLES]]
    sources += [(f"{v} --help", h) for v, h in _verb_help().items()]
    out = []
    for name, text in sources:
        text = re.sub(r"\\\n\s*", " ", text)  # continuation lines
        for m in re.finditer(r"scout-sys (" + "|".join(VERBS) + r")\b([^|#;`\n)&>]*)", text):
            args = re.sub(r"'[^']*'|\"[^\"]*\"", "", m.group(2))
            out += [(name, m.group(1), f) for f in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", args)]
    return out


def test_every_flag_the_docs_name_is_in_that_verbs_help() -> None:
    helps = _verb_help()
    found = _documented_flags()
    assert len(found) > 60, found  # the extraction works: the docs name many flags
    missing = sorted({(page, verb, flag) for page, verb, flag in found
                      if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", helps[verb])})
    assert missing == [], missing
    # the flags this change documents are among them
    assert ("runbook.md", "diagnose", "--output") in found and ("metrics.md", "watch", "--pid-file") in found


def test_the_hook_takes_the_flags_the_docs_give_it() -> None:
    usage = re.search(r'usage\(\) \{ echo "usage: \$0 ([^"]*)"', _text(HOOK)).group(1)
    given = set()
    for p in [*PAGES, *EXAMPLES]:
        # the hook's own command line: quoted as --on-incident's value, or fed an event on stdin
        for m in re.finditer(r"'[^'\n]*on-incident\.sh([^'\n]*)'|\| *\S*on-incident\.sh([^|\n]*)", _text(p)):
            given |= set(re.findall(r"--[a-z][\w-]*", m.group(1) or m.group(2) or ""))
    assert {"--drain", "--sudo-as", "--webhook", "--dry-run"} <= given, given
    assert all(f in usage for f in given), (given, usage)


def test_runbook_jq_on_a_saved_real_report() -> None:
    d = json.loads(_text(REPORT))
    assert d["incidents"]
    _diagnosis_jq_checks(d)
    # diagnose --help's example
    assert json.loads("\n".join(_jq(".incidents", json.dumps(d), raw=False))) == d["incidents"]


def test_runbook_certify_jq_prints_each_checkpoint_then_recommended_and_next(tmp_path: Path) -> None:
    """A real certificate of a real torch.save checkpoint (unverified: no replay round covers it). The
    runbook's expression once printed `.recommended` of each checkpoint (null) and never `.next`."""
    ck = tmp_path / "run42" / "step_1000.pt"
    ck.parent.mkdir()
    subprocess.run([sys.executable, "-c", f"import torch; torch.save({{'w': torch.ones(4, 4)}}, {str(ck)!r})"],
                   check=True, timeout=120)
    out = subprocess.run([sys.executable, "-m", "scout_sys", "certify", str(ck), "--state-dir", str(tmp_path / "s"),
                          "--json"], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 1, out.stderr  # unverified
    cert = json.loads(out.stdout)
    m = re.search(r"--json \| jq '([^']*)'", _text(ROOT / "docs" / "runbook.md"))
    assert m, "the runbook's certify | jq line"
    got = [json.loads(x) for x in _jq(m.group(1), out.stdout, raw=False)]
    assert got == [*({"path": c["path"], "status": c["status"], "reasons": c["reasons"]}
                     for c in cert["checkpoints"]), cert["recommended"], cert["next"]]
    assert got[0]["status"] == "unverified" and got[-1].startswith(("run a round now", "while the job runs"))
    # the runbook's table of `next:` answers has a row for this one
    assert got[-1].split(":")[0] in _text(ROOT / "docs" / "runbook.md")


# ------------------------------------------------------------------ shell blocks parse

_SHELL = re.compile(r"^(sudo |scout-sys |torchrun|jq|pgrep|make|\.venv/bin|py-spy|kubectl|srun|python|cat|export|"
                    r"SCOUT_SYS_|PY=|for |if |\[ |kill|dmesg|nvidia-smi|ls )")


def test_every_shell_block_of_the_docs_parses() -> None:
    checked = 0
    for p in PAGES:
        for block in _blocks(_text(p)):
            lines = [x for x in block.splitlines() if x.strip() and not x.lstrip().startswith("#")]
            if not lines or not _SHELL.match(lines[0]) or not all(_SHELL.match(x) or x.startswith((" ", "\t"))
                                                                  for x in lines):
                continue
            code = re.sub(r"<([A-Za-z][\w .-]*)>", r"X", block)  # <pid>, <store-host> placeholders
            out = subprocess.run(["bash", "-n"], input=code, capture_output=True, text=True, timeout=30, check=False)
            assert out.returncode == 0, (p.name, block, out.stderr)
            checked += 1
    # the logrotate stanza's postrotate script
    stanza = re.search(r"postrotate\n(.*?)\n\s*endscript", _text(ROOT / "docs" / "metrics.md"), re.S).group(1)
    assert subprocess.run(["sh", "-n"], input=stanza, text=True, timeout=30, check=False).returncode == 0
    assert "pkill" not in stanza and "$(cat /run/scout-sys/llama-70b.pid)" in stanza
    assert subprocess.run(["bash", "-n", str(HOOK)], timeout=30, check=False).returncode == 0
    assert checked >= 10, checked


# ------------------------------------------------------------------ the glossary


def test_each_glossary_link_lands_on_a_term() -> None:
    hw = _text(ROOT / "docs" / "how-it-works.md")
    anchors = set(re.findall(r'<a id="([\w-]+)"></a>', hw)) | {"glossary"}
    for term in ("c3", "gpu-shape", "gloo-shape", "witness", "common-mode", "pause", "window", "signature",
                 "sealed", "origin", "equivalent-peers", "strict-majority"):
        assert term in anchors, term
    links = []
    for p in PAGES:
        links += [(p.name, a) for a in re.findall(r"how-it-works\.md#([\w-]+)\)", _text(p))]
    links += [("how-it-works.md", a) for a in re.findall(r"\]\(#([\w-]+)\)", hw)]
    assert len(links) > 50
    headings = {re.sub(r"[^\w -]", "", h).strip().lower().replace(" ", "-") for h in re.findall(r"^#+ (.*)$", hw, re.M)}
    assert [x for x in links if x[1] not in anchors | headings] == []


# ------------------------------------------------------------------ the records the docs describe


def test_cpu_percent_is_in_the_json_as_in_the_text() -> None:
    """The CPU% column of diagnose's text is `cpu_percent` of each rank in the JSON (docs/json.md), and
    a saved report reopens with it."""
    from scout_sys.report import render

    ranks = tuple(Rank(rank=r, pid=100 + r, host="node7") for r in range(2))
    job = Job(ranks=ranks, world_size=2, launcher="torchrun", launcher_pid=99, host="node7")
    d = Diagnosis(time=T, job=job, views={0: RankView(0, "busy", cpu_percent=97.26), 1: RankView(1, "idle")},
                  incidents=(), probes={}, window=3.0)
    rows = d.to_json()["job"]["ranks"]
    assert rows[0]["cpu_percent"] == 97.3 and "cpu_percent" not in rows[1]
    assert re.search(r"^\s+0\s+100\s+busy\s+97\s", render(d), re.M)
    assert Snapshot.from_report(d.to_json()).views[0].cpu_percent == 97.3
    assert '"cpu_percent"' in _text(ROOT / "docs" / "json.md")


def test_pid_file_is_written_and_removed_only_if_still_ours(tmp_path: Path) -> None:
    from scout_sys.cli.watch import PidFile
    from scout_sys.errors import ScoutError

    p = tmp_path / "run" / "scout-sys" / "w.pid"  # its folder is created
    f = PidFile(str(p))
    assert p.read_text() == f"{os.getpid()}\n" and stat.S_IMODE(p.stat().st_mode) == 0o644
    f.close()
    assert not p.exists()
    f = PidFile(str(p))
    p.write_text("1\n")  # another watch took the name since
    f.close()
    assert p.read_text() == "1\n"
    with pytest.raises(ScoutError, match="--pid-file"):
        PidFile(str(tmp_path / "run" / "scout-sys" / "w.pid" / "x"))  # a file where a folder must be


def test_diagnose_output_bad_path_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    out = subprocess.run([sys.executable, "-m", "scout_sys", "diagnose", "--job", str(os.getpid()), "--output",
                          str(tmp_path / "f" / "x.json")], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


