"""--help for every verb, usage errors, and the JSON form of a diagnosis."""

from __future__ import annotations

import pytest

from scout_sys.cli import build_parser
from tests.conftest import scout


def _verbs():
    p = build_parser()
    sub = next(a for a in p._actions if a.dest == "cmd")
    return sorted(sub.choices)


def test_verbs_exist():
    assert {"diagnose", "demo", "doctor"} <= set(_verbs())


@pytest.mark.parametrize("verb", _verbs())
def test_help_of_every_verb(verb):
    out = scout(verb, "--help")
    assert out.returncode == 0 and "usage: scout-sys " + verb in out.stdout


def test_diagnose_help_has_examples_and_exit_codes():
    out = scout("diagnose", "--help").stdout
    assert "examples:" in out and "pgid:" in out and "exit status" in out


def test_missing_job_is_a_usage_error():
    out = scout("diagnose")
    assert out.returncode == 2 and "--job" in out.stderr and "Traceback" not in out.stderr


def test_no_verb_prints_help_and_exits_2():
    out = scout()
    assert out.returncode == 2 and "COMMAND" in out.stdout


def test_bad_window():
    import os

    out = scout("diagnose", "--job", str(os.getpid()), "--window", "-1")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1


def test_watch_needs_a_job_or_a_report():
    out = scout("watch")
    assert out.returncode == 2 and "--job" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_watch_report_that_does_not_exist():
    out = scout("watch", "--report", "/nonexistent/report.json")
    assert out.returncode == 2 and "cannot read report" in out.stderr and "Traceback" not in out.stderr
