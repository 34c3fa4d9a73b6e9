"""Every example the docs show, run as written where this machine can run it (docs/runbook.md,
docs/metrics.md, README.md, examples/): the flags each `scout-sys VERB --flag` names exist in that
verb's --help; the jq expressions print what they say from real JSON (a saved real report, a real
certificate; the slow test: a real diagnose --output file and a real events file); the sudoers rule
passes `visudo -c` and lets sudo run exactly the command on-incident.sh runs; the alert rules pass
`promtool check rules`, use only metrics the exporter serves, and fire (or stay quiet) as their
comments say on a real scrape (`promtool test rules`); on-incident.sh drains only for causes in the
node; every shell block parses (`bash -n`). The slow test runs a real job: --pid-file, the logrotate
postrotate line, SIGHUP reopening --events (and never stopping a watch), the runbook's first command."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scout_sys.cli import build_parser
from scout_sys.model import (
    ATTRIBUTED,
    HANG,
    Diagnosis,
    Event,
    Evidence,
    Incident,
    Job,
    Rank,
    RankView,
    Snapshot,
)
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


# ------------------------------------------------------------------ jq on real JSON


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


# ------------------------------------------------------------------ the sudoers rule


def _sudoers_rule() -> str:
    m = re.search(r"^# /etc/sudoers\.d/scout-sys.*\n(.+)$", _text(ROOT / "docs" / "metrics.md"), re.M)
    assert m, "the sudoers rule in docs/metrics.md"
    return m.group(1).strip()


def _drain_argv(*extra: str) -> list[str]:
    """What on-incident.sh runs to drain node7 for a hardware incident (its --dry-run line)."""
    ev = {"event": "incident_opened", "time": 1.0, "incident": {
        "id": "inc-1", "kind": "hardware", "status": ATTRIBUTED, "ranks": [2], "hosts": ["node7.cluster"],
        "summary": "GPU 3 of rank 2 reports 4 uncorrected ECC errors", "evidence": []}}
    line = _hook(ev, "--drain", *extra)
    assert line.startswith("would run: "), line
    return [x for x in _shell_words(line.removeprefix("would run: "))]


def _shell_words(s: str) -> list[str]:
    import shlex

    return shlex.split(s)


def test_the_sudoers_rule_is_valid_and_allows_exactly_the_hooks_drain(tmp_path: Path) -> None:
    visudo = _tool("visudo")
    rule = _sudoers_rule()
    f = tmp_path / "scout-sys"
    f.write_text(rule + "\n")
    f.chmod(0o440)
    out = subprocess.run([visudo, "-c", "-f", str(f)], capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    argv = _drain_argv("--sudo-as", "slurm")
    assert argv[:5] == ["sudo", "-n", "-u", "slurm", "scontrol"], argv
    if os.geteuid() != 0:
        pytest.skip("asking sudo whether nobody may run it needs root")
    # Does sudo allow the hook's exact command under that rule? Ask sudo itself, with the rule installed
    # for a moment under a name of its own; the command path and runas user are this machine's stand-ins
    # (no Slurm here): a stub in a root-only folder under /run, and the user daemon.
    stub_dir = tempfile.mkdtemp(dir="/run", prefix="scout-sudoers-")
    drop = Path("/etc/sudoers.d") / f"zz-scout-sys-test-{os.getpid()}"
    try:
        stub = Path(stub_dir) / "scontrol"
        stub.write_text("#!/bin/sh\nexit 0\n")
        stub.chmod(0o755)
        os.chmod(stub_dir, 0o755)
        drop.write_text(rule.replace("/usr/bin/scontrol", str(stub)).replace("(slurm)", "(daemon)") + "\n")
        drop.chmod(0o440)

        def allowed(args: list[str]) -> bool:
            r = subprocess.run(["sudo", "-l", "-U", "nobody", "-u", "daemon", str(stub), *args],
                               capture_output=True, text=True, timeout=30, check=False)
            return r.returncode == 0

        assert allowed(argv[5:]), argv
        assert not allowed(["update", "nodename=node7", "state=down", "reason=x"])  # only drain
        assert not allowed(["delete", "nodename=node7"])
    finally:
        drop.unlink(missing_ok=True)
        shutil.rmtree(stub_dir, ignore_errors=True)


# ------------------------------------------------------------------ the alert rules


T = 1_764_000_000.0


def _real_scrape() -> str:
    """The exporter's real output for a watch on a host without GPUs (this one: the real nvml reason)
    with an open attributed hang, and eBPF collectives failed."""
    from scout_sys.exporters.prometheus import PrometheusExporter
    from scout_sys.probes.nvml import NvmlProbe

    ranks = tuple(Rank(rank=r, pid=100 + r, host="node7") for r in range(4))
    job = Job(ranks=ranks, world_size=4, launcher="torchrun", launcher_pid=99, host="node7")
    views = {r: RankView(rank=r, state="waiting", cpu_percent=1.0) for r in (0, 1, 3)}
    views[2] = RankView(rank=2, state="idle", cpu_percent=0.0)
    inc = Incident(kind=HANG, status=ATTRIBUTED, ranks=(2,), hosts=("node7",), since=T - 10, summary="s", id="inc-1",
                   evidence=(Evidence("stack", "rank 2 in load_next_batch", rank=2),))
    s = Snapshot(time=T, started=T - 60, job=job, views=views, incidents=(inc,),
                 probes={"procfs": None, "stack": None, "nvml": NvmlProbe().check(),
                         "ebpf-collectives": "failed to start: bpf_attach_uprobe failed", "ebpf-sched": None,
                         "ebpf-comms": "no NCCL library (libnccl.so*) mapped by or installed beside the job's Python"},
                 stall_after=5.0, pauses={0: 12.0, 1: 12.5, 2: 13.0, 3: 12.1}, lost_events=0)
    ex = PrometheusExporter("127.0.0.1:0", job_name="llama")
    try:
        ex.on_event(Event("incident_opened", T, inc))
        ex.on_snapshot(s, 0.004)
        return generate_latest(ex.registry).decode()
    finally:
        ex.close()


def _rules() -> dict:
    return yaml.safe_load(_text(ROOT / "examples" / "prometheus-alerts.yml"))


def test_alert_rules_pass_promtool() -> None:
    out = subprocess.run([_tool("promtool"), "check", "rules", str(ROOT / "examples" / "prometheus-alerts.yml")],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_alert_rules_use_only_metrics_the_exporter_serves() -> None:
    served = {s.name for fam in text_string_to_metric_families(_real_scrape()) for s in fam.samples}
    served.add("up")  # Prometheus's own, per target
    used = set()
    for g in _rules()["groups"]:
        for r in g["rules"]:
            names = set(re.findall(r"\b([a-z_][a-z0-9_]*)\s*(?:\{|\[|\)|\s|$|==|>|<)", r["expr"]))
            used |= {n for n in names if n.startswith("scout_sys_") or n == "up"}
    assert used and used <= served, used - served
    assert {"up", "scout_sys_probe_up", "scout_sys_snapshot_timestamp_seconds"} <= used


def _series(scrape: str, minutes: int) -> list[dict]:
    """The scrape as promtool input series: each sample's value held for ``minutes`` minutes."""
    out = []
    for fam in text_string_to_metric_families(scrape):
        for s in fam.samples:
            if s.name.endswith(("_created",)) or not s.labels.get("job"):
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in sorted({**s.labels, "instance": "node7:9464"}.items()))
            value = s.value
            if s.name == "scout_sys_snapshot_timestamp_seconds":
                value = 0  # the snapshot is from the epoch of the test: fresh at t=0
            out.append({"series": f"{s.name}{{{labels}}}", "values": f"{value:g}+0x{minutes}"})
    return out


def test_alert_rules_fire_as_documented_on_a_real_scrape(tmp_path: Path) -> None:
    """ScoutSysProbeDown fires for the probe that failed and never for nvml on this GPU-less host;
    ScoutSysWatchGone fires when the target stops answering; TrainingJobHung for the open hang."""
    series = _series(_real_scrape(), 20)
    series += [{"series": 'up{job="scout-sys",instance="node7:9464"}', "values": "1x5 0x15"}]
    tests = {"rule_files": [str(ROOT / "examples" / "prometheus-alerts.yml")], "evaluation_interval": "1m",
             "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": [
                 {"eval_time": "15m", "alertname": "ScoutSysProbeDown", "exp_alerts": [
                     {"exp_labels": {"severity": "ticket", "job": "llama", "instance": "node7:9464",
                                     "probe": "ebpf-collectives"},
                      "exp_annotations": {"summary": "scout-sys on node7:9464: probe ebpf-collectives is off "
                                                     "(scout-sys doctor says why)"}}]},
                 {"eval_time": "4m", "alertname": "ScoutSysWatchGone", "exp_alerts": []},
                 {"eval_time": "12m", "alertname": "ScoutSysWatchGone", "exp_alerts": [
                     {"exp_labels": {"severity": "ticket", "job": "scout-sys", "instance": "node7:9464"},
                      "exp_annotations": {"summary": "scout-sys watch at node7:9464 has not answered a scrape for "
                                                     "5 minutes: the job runs unwatched"}}]},
                 {"eval_time": "12m", "alertname": "ScoutSysNotScraped", "exp_alerts": []},
             ]}]}
    f = tmp_path / "alerts_test.yml"
    f.write_text(yaml.safe_dump(tests))
    out = subprocess.run([_tool("promtool"), "test", "rules", str(f)], capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stdout + out.stderr


# ------------------------------------------------------------------ on-incident.sh


def _hook(event: dict, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCOUT_SYS_")}
    out = subprocess.run(["bash", str(HOOK), "--dry-run", *args], input=json.dumps(event), capture_output=True,
                         text=True, timeout=30, env=env, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_hook_drains_only_for_causes_in_the_node() -> None:
    real = json.loads(_text(REPORT))["incidents"][0]  # a real hang, attributed to a rank

    def event(kind: str, evidence: list[dict] | None = None, name: str = "incident_opened") -> dict:
        return {"event": name, "time": 1.0, "incident": {**real, "id": "inc-1", "kind": kind,
                                                        "evidence": real["evidence"] if evidence is None else evidence}}

    drains = {}
    for kind in ("hang", "collective_desync", "process_stall", "process_exit", "hardware", "sdc", "straggler"):
        drains[kind] = "scontrol update" in _hook(event(kind), "--drain")
    assert drains == {"hang": False, "collective_desync": False, "process_stall": False, "process_exit": False,
                      "hardware": True, "sdc": True, "straggler": False}, drains
    confirmed = [{"source": "replay", "text": "replay confirms a slow device: the same kernels run slower on it "
                                              "than on its peers"}]
    cleared = [{"source": "replay", "text": "replay: its device runs the same kernels as fast as its peers'"}]
    from_replay = [{"source": "replay", "text": "cuda:3: 0.9 s per round", "peer_median": 0.3, "threshold": 0.4}]
    assert "scontrol update" in _hook(event("straggler", confirmed, "incident_updated"), "--drain")
    assert "scontrol update" in _hook(event("straggler", from_replay), "--drain")
    assert "scontrol update" not in _hook(event("straggler", cleared, "incident_updated"), "--drain")
    assert "scontrol update" not in _hook(event("hardware", name="incident_closed"), "--drain")
    inconclusive = event("hardware")
    inconclusive["incident"] = {**inconclusive["incident"], "status": "inconclusive", "ranks": [], "hosts": []}
    assert _hook(inconclusive, "--drain") == ""
    # the webhook is posted for every event given, drain or not
    assert _hook(event("hang"), "--webhook", "https://hooks.example/x").startswith("would run: curl ")


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


# ------------------------------------------------------------------ a real job (slow)


def _wait(pred, timeout: float, what: str):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout} s")


@pytest.mark.slow
def test_pid_file_logrotate_sighup_and_the_runbooks_first_command(start_job, tmp_path: Path) -> None:
    """A real watch started with a real job: --pid-file holds its pid; the logrotate stanza's postrotate
    line (run as written) reopens --events without stopping it, the next event lands in the fresh file
    and the runbook's jq finds its bundle; a watch without --events survives SIGHUP too; the runbook's
    first command saves the verdict (0600) that its jq lines read; the pid file goes at exit."""
    from tests.test_watch import WatchCli

    events = tmp_path / "log" / "llama-70b.jsonl"
    pidfile = tmp_path / "run" / "llama-70b.pid"
    job = start_job(4, fault="hang", fault_rank=2, fault_step=40)
    w = WatchCli(job.pid, "--no-ebpf", "--no-replay", "--state-dir", str(tmp_path / "state"), "--events", str(events),
                 "--pid-file", str(pidfile))
    bare = WatchCli(job.pid, "--no-ebpf", "--no-replay", "--state-dir", str(tmp_path / "state2"))
    try:
        _wait(lambda: pidfile.exists() and events.exists(), 60, "pid file and events file")
        assert pidfile.read_text().strip() == str(w.proc.pid)
        # logrotate: move the file away, then the documented postrotate line, as written but for the path
        os.rename(events, str(events) + ".1")
        stanza = re.search(r"postrotate\n(.*?)\n\s*endscript", _text(ROOT / "docs" / "metrics.md"), re.S).group(1)
        post = stanza.replace("/run/scout-sys/llama-70b.pid", str(pidfile))
        assert subprocess.run(["sh", "-c", post], timeout=30, check=False).returncode == 0
        _wait(events.exists, 5, "a fresh events file after SIGHUP")
        bare.proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert w.proc.poll() is None and bare.proc.poll() is None, (w.stderr(), bare.stderr())
        job.wait_fault(timeout=120)
        e = w.wait_event(lambda e: e.get("event") == "incident_opened", timeout=90)
        assert e["bundle"], e
        lines = _wait(lambda: [json.loads(x) for x in events.read_text().splitlines()], 10, "the event in the file")
        assert lines[0] == e
        expr, raw = _runbook_jq("select(.bundle)")
        assert _jq(expr, events.read_text(), raw=raw)[-1:] == [e["bundle"]]
        # the runbook's first command, run by bash as written but for the pid and the file's folder (and a
        # shorter window); `sudo` and `scout-sys` stand for this process's user and interpreter
        cmd = re.search(r"^(sudo scout-sys diagnose --job PID --output /var/tmp/.*)$", _text(ROOT / "docs" / "runbook.md"),
                        re.M).group(1)
        folder = tmp_path / "tmp"
        line = cmd.replace("--job PID", f"--job {job.pid} --window 2").replace("/var/tmp/", f"{folder}/")
        r = subprocess.run(["bash", "-c", f'sudo() {{ "$@"; }}; scout-sys() {{ {sys.executable} -m scout_sys "$@"; }}; {line}'],
                           capture_output=True, text=True, timeout=120, check=False)
        assert r.returncode == 1, r.stdout + r.stderr
        saved = list(folder.glob("scout-*.json"))
        assert len(saved) == 1, (saved, r.stderr)
        out_file = saved[0]
        assert "INCIDENT hang (attributed): rank 2" in r.stdout and str(out_file) in r.stderr, r.stdout + r.stderr
        assert stat.S_IMODE(out_file.stat().st_mode) == 0o600
        d = json.loads(out_file.read_text())
        assert [(i["kind"], i["ranks"]) for i in d["incidents"]] == [(HANG, [2])]
        assert all("cpu_percent" in x for x in d["job"]["ranks"]), d["job"]["ranks"]
        _diagnosis_jq_checks(d)
    finally:
        bare.stop()
        assert w.stop() == 1  # an incident was opened
    assert not pidfile.exists()
    assert w.opened() == [(HANG, ATTRIBUTED, [2])]
