"""The operations examples, checked with the real tools: the sudoers rule of docs/metrics.md passes
`visudo -c` and lets sudo run exactly the command examples/on-incident.sh runs, and nothing else; the
alert rules of examples/prometheus-alerts.yml pass `promtool check rules`, use only metrics the exporter
serves, and fire (or stay quiet) as their comments say on a real scrape (`promtool test rules`: no
ScoutSysProbeDown for nvml on a host without GPUs, ScoutSysWatchGone when the target stops answering);
on-incident.sh drains only for causes that lie in the node (an sdc: on a GPU only)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scout_sys.model import (
    ATTRIBUTED,
    HANG,
    Event,
    Evidence,
    Incident,
    Job,
    Rank,
    RankView,
    Snapshot,
)
from tests._docs import (
    REPORT,
    ROOT,
    _text,
    _tool,
    hook,
)

T = 1_764_000_000.0


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
    line = hook(ev, "--drain", *extra)
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
    account = rule.split()[0]
    assert account not in ("nobody", "ALL", "root") and "*" not in rule, rule  # a dedicated account, no wildcards
    assert f"--on-incident-user {account}" in _text(ROOT / "docs" / "metrics.md")
    if os.geteuid() != 0:
        pytest.skip("asking sudo whether the hook's account may run it needs root")
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
        # the dedicated account stands in as nobody (no such account here: creating one changes the host)
        drop.write_text(rule.replace("/usr/bin/scontrol", str(stub)).replace("(slurm)", "(daemon)")
                        .replace(account, "nobody", 1) + "\n")
        drop.chmod(0o440)

        def allowed(args: list[str]) -> bool:
            r = subprocess.run(["sudo", "-l", "-U", "nobody", "-u", "daemon", str(stub), *args],
                               capture_output=True, text=True, timeout=30, check=False)
            return r.returncode == 0

        assert allowed(argv[5:]), argv
        assert not allowed(["update", "nodename=node7", "state=down", "reason=x"])  # only drain
        assert not allowed(["delete", "nodename=node7"])
        # nothing slipped in across words: another state, a second node, an option after the reason
        assert not allowed(["update", "nodename=node7", "state=down", "state=drain", "reason=scout-sys/x"])
        assert not allowed(["update", "nodename=node7", "nodename=node8", "state=drain", "reason=scout-sys/x"])
        assert not allowed(["update", "nodename=node7", "state=drain", "reason=scout-sys/x", "state=down"])
        assert not allowed(["update", "nodename=node7", "state=drain", "reason=scout-sys/x y"])
    finally:
        drop.unlink(missing_ok=True)
        shutil.rmtree(stub_dir, ignore_errors=True)


# ------------------------------------------------------------------ the alert rules




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


def test_the_hook_drains_only_for_causes_in_the_node() -> None:
    real = json.loads(_text(REPORT))["incidents"][0]  # a real hang, attributed to a rank

    def event(kind: str, evidence: list[dict] | None = None, name: str = "incident_opened") -> dict:
        return {"event": name, "time": 1.0, "incident": {**real, "id": "inc-1", "kind": kind,
                                                        "evidence": real["evidence"] if evidence is None else evidence}}

    drains = {}
    for kind in ("hang", "collective_desync", "process_stall", "process_exit", "hardware", "sdc", "straggler"):
        drains[kind] = "scontrol update" in hook(event(kind), "--drain")
    assert drains == {"hang": False, "collective_desync": False, "process_stall": False, "process_exit": False,
                      "hardware": True, "sdc": False, "straggler": False}, drains
    # sdc: on a GPU the node (drain); on a CPU device first the rank's environment (its context), no drain
    def sdc(device: str) -> list[dict]:
        return [{"source": "replay", "text": f"{device} differs from the majority of its peers on softmax",
                 "rank": 2, "device": device, "ranks": [2], "kernels": {"softmax": {"digest": "9f", "majority": "3a"}},
                 "context": {"capability": "AVX2", "threads": 4}}]
    assert "scontrol update" in hook(event("sdc", sdc("cuda:3")), "--drain")
    assert "scontrol update" not in hook(event("sdc", sdc("cpu/rank2")), "--drain")
    confirmed = [{"source": "replay", "text": "replay: its device cpu/rank2 ran the same kernels 3.0x slower than "
                                              "its peers' — a slow device", "device_slow": True, "peer_median": 1.0}]
    cleared = [{"source": "replay", "text": "replay: its device cpu/rank2 runs the same kernels as fast as its "
                                            "peers'", "device_slow": False, "median": 1.0}]
    from_replay = [{"source": "replay", "text": "cuda:3: 0.9 s per round", "peer_median": 0.3, "threshold": 0.4}]
    assert "scontrol update" in hook(event("straggler", confirmed, "incident_updated"), "--drain")
    assert "scontrol update" in hook(event("straggler", from_replay), "--drain")
    assert "scontrol update" not in hook(event("straggler", cleared, "incident_updated"), "--drain")
    # starved of CPU: its replay worker shares the quota, so replay's "slow device" is no node fault
    starved = [*confirmed, {"source": "procfs", "text": "cause: starved of CPU (throttled): ...", "cause": "throttled"}]
    assert "scontrol update" not in hook(event("straggler", starved, "incident_updated"), "--drain")
    assert "scontrol update" not in hook(event("hardware", name="incident_closed"), "--drain")
    inconclusive = event("hardware")
    inconclusive["incident"] = {**inconclusive["incident"], "status": "inconclusive", "ranks": [], "hosts": []}
    assert hook(inconclusive, "--drain") == ""
    # the webhook is posted for every event given, drain or not
    assert hook(event("hang"), "--webhook", "https://hooks.example/x").startswith("would run: curl ")




def test_every_documented_drain_hook_sees_the_updates_that_confirm_a_slow_device() -> None:
    """A watch's straggler is confirmed a slow device in an incident_updated event: a hook with --drain
    that sees only incident_opened would never drain for it, although the runbook says it does."""
    from tests._docs import EXAMPLES, PAGES

    found = 0
    for p in [*PAGES, *EXAMPLES]:
        text = re.sub(r"\\\n\s*", " ", _text(p))
        for line in text.splitlines():
            if re.search(r"scout-sys watch .*--on-incident '[^']*on-incident\.sh[^']*--drain", line):
                assert "--on-incident-all" in line, (p.name, line)
                found += 1
    assert found >= 2, found  # metrics.md and the hook's own header
