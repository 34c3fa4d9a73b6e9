"""The cluster verbs' usage errors: one line on stderr, exit 2, never a traceback, never the token."""

from __future__ import annotations

import os

from scout_sys.demo.launch import free_port
from tests.conftest import scout


def _one_line(out) -> str:
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
    return out.stderr


def test_no_store_there(tmp_path):
    token = tmp_path / "t"
    token.write_text(os.urandom(32).hex())
    err = _one_line(scout("diagnose", "--cluster", f"127.0.0.1:{free_port()}", "--token-file", str(token),
                          "--window", "1"))
    assert "cannot reach the scout-sys store" in err and token.read_text() not in err


def test_token_file_problems_and_bad_addresses(tmp_path):
    assert "cannot read --token-file" in _one_line(scout("diagnose", "--cluster", "h:1", "--token-file",
                                                         str(tmp_path / "none")))
    (tmp_path / "short").write_text("secret\n")
    err = _one_line(scout("watch", "--cluster", "h:1", "--token-file", str(tmp_path / "short")))
    assert "too short" in err and "secret" not in err
    assert "HOST:PORT" in _one_line(scout("diagnose", "--cluster", "nohostport", "--token-file", "x"))
    assert "--token-file" in _one_line(scout("diagnose", "--cluster", "h:1"))
    (tmp_path / "good").write_text(os.urandom(32).hex())
    assert "not within --nnodes" in _one_line(scout("agent", "--job", "1", "--store", "127.0.0.1:1", "--nnodes", "2",
                                                    "--node-rank", "2", "--token-file", str(tmp_path / "good")))
