"""scout_sys/cli/common.py on its own: the exit statuses, the parser that errs in one line and exit 2,
the job options every verb shares, and --output's file (opened early, private, on disk before the
verdict)."""

from __future__ import annotations

import os
import stat

import pytest

from scout_sys.cli.common import (
    EXIT_ERROR,
    EXIT_INCIDENT,
    EXIT_OK,
    _job_options,
    _open_output,
    _Parser,
    _save,
)
from scout_sys.errors import ScoutError


def test_exit_statuses_are_those_every_epilog_documents():
    # "exit status: 0 healthy, 1 incident reported, 2 could not diagnose" (and replay's, certify's)
    assert (EXIT_OK, EXIT_INCIDENT, EXIT_ERROR) == (0, 1, 2)


def test_a_usage_error_is_the_usage_then_one_error_line_and_exit_2(capsys):
    p = _Parser(prog="scout-sys x")
    p.add_argument("--n", type=int, required=True)
    with pytest.raises(SystemExit) as e:
        p.parse_args(["--n", "two"])
    assert e.value.code == EXIT_ERROR
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == "usage: scout-sys x [-h] --n N\nscout-sys x: error: argument --n: invalid int value: 'two'\n"
    with pytest.raises(SystemExit) as e:
        p.parse_args([])
    assert e.value.code == EXIT_ERROR
    assert capsys.readouterr().err.splitlines() == [
        "usage: scout-sys x [-h] --n N", "scout-sys x: error: the following arguments are required: --n"]


def test_job_options_required_or_not_with_or_without_topology(capsys):
    p = _Parser(prog="v")
    _job_options(p)
    assert vars(p.parse_args(["--job", "pgid:12"])) == {"job": "pgid:12", "topology": None}
    assert vars(p.parse_args(["--job", "1,2", "--topology", "dp=2,pp=2"])) == {"job": "1,2", "topology": "dp=2,pp=2"}
    with pytest.raises(SystemExit) as e:
        p.parse_args(["--topology", "dp=2"])  # required by default
    assert e.value.code == EXIT_ERROR
    assert capsys.readouterr().err.splitlines()[-1] == "v: error: the following arguments are required: --job"

    optional = _Parser(prog="v")
    _job_options(optional, required=False)
    assert vars(optional.parse_args([])) == {"job": None, "topology": None}

    bare = _Parser(prog="v")
    _job_options(bare, topology=False)  # replay: peers are devices of one kind, whatever the layout
    assert vars(bare.parse_args(["--job", "env:SLURM_JOB_ID=7"])) == {"job": "env:SLURM_JOB_ID=7"}
    with pytest.raises(SystemExit):
        bare.parse_args(["--job", "1", "--topology", "dp=2"])
    assert capsys.readouterr().err.splitlines()[-1] == "v: error: unrecognized arguments: --topology dp=2"


def test_job_options_help_names_every_selector_and_layout_order():
    p = _Parser(prog="v")
    _job_options(p)
    helps = {a.dest: (a.metavar, a.help) for a in p._actions if a.dest in ("job", "topology")}
    assert helps["job"][0] == "SEL" and helps["topology"][0] == "LAYOUT"
    for selector in ("pgid:N", "env:NAME=VALUE", "env:NAME ", "PID,PID,..."):
        assert selector in helps["job"][1], selector
    for order in ("mesh", "megatron", "deepspeed", "torchtitan", "docs/layouts.md"):
        assert order in helps["topology"][1], order


def test_no_output_is_none_and_saving_to_none_writes_nothing(capsys):
    assert _open_output(None) is None
    assert _save(None, '{"schema": "x"}') is None
    assert capsys.readouterr() == ("", "")


def test_output_makes_its_missing_folders_private_and_the_file_0600(tmp_path):
    os.chmod(tmp_path, 0o755)
    path = tmp_path / "a" / "b" / "verdict.json"
    out = _open_output(str(path))
    try:
        assert out is not None and out.name == str(path)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert [stat.S_IMODE(os.stat(d).st_mode) for d in (tmp_path / "a", tmp_path / "a" / "b")] == [0o700, 0o700]
        assert stat.S_IMODE(os.stat(tmp_path).st_mode) == 0o755  # a folder that existed is left as it was
    finally:
        out.close()


def test_an_existing_output_file_is_truncated_and_made_private(tmp_path):
    path = tmp_path / "old.json"
    path.write_text("an older, longer report\n")
    os.chmod(path, 0o644)
    out = _open_output(str(path))
    assert out is not None
    out.close()
    assert path.read_text() == ""
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_a_bad_output_path_is_one_scout_error_naming_it(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("")
    under_a_file = str(a_file / "verdict.json")
    with pytest.raises(ScoutError) as e:
        _open_output(under_a_file)
    assert str(e.value) == f"--output {under_a_file}: Not a directory"
    with pytest.raises(ScoutError) as e:
        _open_output(str(tmp_path))
    assert str(e.value) == f"--output {tmp_path}: Is a directory"


def test_save_puts_the_text_on_disk_before_it_returns_and_says_how_to_reopen_it(tmp_path, capsys):
    path = tmp_path / "r.json"
    out = _open_output(str(path))
    assert out is not None
    try:
        _save(out, '{"schema": "scout-sys/diagnosis/v1"}')
        assert path.read_text() == '{"schema": "scout-sys/diagnosis/v1"}\n'  # still open: flushed, fsynced
        assert capsys.readouterr() == ("", f"scout-sys: saved to {path} (reopen: scout-sys watch --report {path})\n")
        _save(out, "second")
        assert path.read_text() == '{"schema": "scout-sys/diagnosis/v1"}\nsecond\n'
    finally:
        out.close()
