"""scout_sys/cli/replay.py's command line on its own: `replay`'s and `certify`'s parsing, their help
(defaults and exit statuses as they behave), and every bad input as one line on stderr and exit 2,
checked before any job is looked up. No replay round runs here (tests/test_replay_e2e.py runs them)."""

from __future__ import annotations

import json
import os
import struct
import subprocess

import pytest

from scout_sys.cli import build_parser
from tests._cli_errors import one_error_line, usage_error_line
from tests.conftest import scout

_error, _usage_error = one_error_line, usage_error_line


def _options(verb: str) -> dict:
    sub = next(a for a in build_parser()._actions if a.dest == "cmd")
    return {a.dest: a for a in sub.choices[verb]._actions}


def test_replay_parses_its_options_with_the_defaults_its_help_states():
    args = build_parser().parse_args(["replay", "--job", "pgid:7"])
    assert (args.job, args.checkpoint, args.rounds, args.size, args.reps, args.state_dir, args.json, args.quiet) == (
        "pgid:7", None, 2, "default", 3, None, False, False)
    opts = _options("replay")
    assert opts["rounds"].help == "rounds (default: 2; a slow device needs 2 in a row)"
    assert opts["reps"].help == "repetitions of each kernel per round (default: 3)"
    assert opts["size"].choices == ["default", "small"]
    assert "topology" not in opts  # peers are devices of one kind, whatever the parallel layout
    args = build_parser().parse_args(["replay", "--job", "1", "--checkpoint", "m.pt", "--rounds", "3", "--size",
                                      "small", "--reps", "1", "--state-dir", "s", "--json", "-q"])
    assert (args.checkpoint, args.rounds, args.size, args.reps, args.state_dir, args.json, args.quiet) == (
        "m.pt", 3, "small", 1, "s", True, True)


def test_certify_parses_paths_and_its_options():
    args = build_parser().parse_args(["certify", "ckpt/step_900", "ckpt/step_1000", "--json"])
    assert (args.paths, args.state_dir, args.job, args.json) == (["ckpt/step_900", "ckpt/step_1000"], None, None, True)
    args = build_parser().parse_args(["certify", "--job", "12345", "--state-dir", "s", "m.safetensors"])
    assert (args.paths, args.state_dir, args.job, args.json) == (["m.safetensors"], "s", "12345", False)


def test_replay_help_has_its_examples_incidents_and_exit_statuses():
    out = scout("replay", "--help")
    assert (out.returncode, out.stderr) == (0, "")
    assert out.stdout.startswith("usage: scout-sys replay [-h] --job SEL [--checkpoint PATH]")
    lines = out.stdout.splitlines()
    assert "  sudo scout-sys replay --job 12345 --rounds 3 --json   # one JSON object (scout-sys/diagnosis/v1)" in lines
    said = " ".join(out.stdout.split())  # the epilog is wrapped to the terminal's width
    assert ("exit status: 0 every device agrees, 1 incident reported, 2 could not replay (no device gave a "
            "result). The job keeps running;") in said
    assert "Each round is appended to <state dir>/replay/ledger.jsonl, which certify reads." in lines


def test_certify_help_has_its_verdicts_and_exit_statuses():
    out = scout("certify", "--help")
    assert (out.returncode, out.stderr) == (0, "")
    assert out.stdout.startswith("usage: scout-sys certify [-h] [--state-dir DIR] [--job SEL] [--json]")
    lines = out.stdout.splitlines()
    assert "unverified: clean content, no covering round of its job, or no known job wrote it." in lines
    assert "exit status: 0 every checkpoint certified, 1 any unverified or rejected, 2 could not run." in lines


def test_replay_usage_errors_are_argparse_one_liners():
    assert _usage_error(scout("replay")) == "scout-sys replay: error: the following arguments are required: --job"
    assert _usage_error(scout("replay", "--job", "1", "--rounds", "x")) == (
        "scout-sys replay: error: argument --rounds: invalid int value: 'x'")
    assert _usage_error(scout("replay", "--job", "1", "--size", "huge")) == (
        "scout-sys replay: error: argument --size: invalid choice: 'huge' (choose from 'default', 'small')")
    assert _usage_error(scout("replay", "--job", "1", "--topology", "dp=2")) == (
        "scout-sys: error: unrecognized arguments: --topology dp=2")
    assert _usage_error(scout("certify")) == "scout-sys certify: error: the following arguments are required: PATH"


def test_replay_checks_its_numbers_and_checkpoint_before_looking_for_the_job():
    # pid 999999999 cannot exist: each error below is the option's, so it came before the lookup
    for flags in (["--rounds", "0"], ["--reps", "0"], ["--rounds", "-3", "--reps", "2"]):
        assert _error(scout("replay", "--job", "999999999", *flags)) == (
            "scout-sys: error: --rounds and --reps must be at least 1"), flags
    assert _error(scout("replay", "--job", "999999999", "--checkpoint", "/nonexistent/ckpt.pt")) == (
        "scout-sys: error: no such checkpoint: /nonexistent/ckpt.pt")
    assert _error(scout("replay", "--job", "999999999")) == "scout-sys: error: no process with pid 999999999"
    assert _error(scout("replay", "--job", "pgid:abc")) == (
        "scout-sys: error: bad selector 'pgid:abc': pgid:N needs a positive number")


def test_replay_of_a_process_that_is_no_rank_is_one_line():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    plain = subprocess.Popen(["sleep", "600"], env=env)
    try:
        assert _error(scout("replay", "--job", str(plain.pid))) == (
            f"scout-sys: error: no rank processes found for --job {plain.pid} (looked for RANK/WORLD_SIZE in the "
            "environment of the process and its descendants; the ranks may not have started yet: `watch` waits "
            "for them)")
    finally:
        plain.kill()
        plain.wait()


@pytest.mark.torch  # certify needs the replay extra before it reads a path
def test_certify_bad_paths_and_jobs_are_one_line(tmp_path):
    assert _error(scout("certify", "--state-dir", str(tmp_path), "/nonexistent/ckpt")) == (
        "scout-sys: error: no such path: /nonexistent/ckpt")
    assert _error(scout("certify", "--state-dir", str(tmp_path), "--job", "999999999", str(tmp_path))) == (
        "scout-sys: error: no process with pid 999999999")
    assert _error(scout("certify", "--job", "pgid:0", str(tmp_path))) == (
        "scout-sys: error: bad selector 'pgid:0': pgid:N needs a positive number")


def _safetensors(path, values: list[float]) -> None:
    """A real .safetensors file, written by hand (its format: header length, JSON header, raw data)."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [len(values)], "data_offsets": [0, 4 * len(values)]}})
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + struct.pack(f"<{len(values)}f", *values))


@pytest.mark.torch
def test_certify_exits_1_for_an_unverified_or_a_rejected_checkpoint_with_one_json_object(tmp_path):
    clean, junk = tmp_path / "model.safetensors", tmp_path / "junk.safetensors"
    _safetensors(clean, [1.0, 2.0])
    junk.write_bytes(b"not a checkpoint")
    state = str(tmp_path / "state")
    for path, status in ((clean, "unverified"), (junk, "rejected")):
        out = scout("certify", "--state-dir", state, str(path), "--json")
        assert (out.returncode, out.stderr) == (1, ""), (path, out.stderr)
        assert len(out.stdout.strip().splitlines()) == 1
        cert = json.loads(out.stdout)
        assert cert["schema"] == "scout-sys/certificate/v1"
        assert [(c["path"], c["status"]) for c in cert["checkpoints"]] == [(str(path), status)]
        assert cert["recommended"] is None
    out = scout("certify", "--state-dir", state, str(clean))
    assert out.returncode == 1
    assert out.stdout.splitlines()[0] == f"UNVERIFIED {clean}"
