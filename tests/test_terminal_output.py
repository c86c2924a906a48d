"""Text from a store, a manifest or an index is printed with its terminal control characters escaped."""

from __future__ import annotations

import logging

import pytest

from marin_data.errors import RemoteError, RetryableRemoteError
from marin_data.retry import RetryPolicy, retry_call
from marin_data.ui import format_table, printable, terminal_safe

HOSTILE = ["\r", "\x1b]0;owned\x07", "\x1b[2K", "\x9b", "\x7f", "\u202e", "\u2066", "\u2028", "\x00", "\n", "\t"]


@pytest.mark.parametrize("control", HOSTILE)
def test_printable_escapes_every_control_character(control):
    out = printable(f"name{control}end")
    assert out.startswith("name") and out.endswith("end") and out.isprintable() and "\\" in out


def test_terminal_safe_keeps_lines_and_tabs_but_nothing_else():
    assert terminal_safe("a\tb\nc") == "a\tb\nc"
    assert terminal_safe("x\rDownloaded: 0 failed\x1b]0;t\x07") == "x\\x0dDownloaded: 0 failed\\x1b]0;t\\x07"


def test_tables_error_paths_and_retry_lines_escape_names(caplog):
    table = format_table(["subset", "shards"], [["a\r\x1b[2Kb", 3]])
    assert "\r" not in table and "\x1b" not in table and "a\\x0d\\x1b[2Kb" in table
    assert str(RemoteError("gone", path="data/x\n\rOK")) == "data/x\\x0a\\x0dOK: gone"
    attempts = iter([RetryableRemoteError("cut", path="data/\x1b]0;t\x07"), None])

    def flaky():
        if (e := next(attempts)) is not None:
            raise e

    with caplog.at_level(logging.WARNING):
        retry_call(flaky, policy=RetryPolicy(base_wait=0), what="data/\x1b]0;t\x07", sleep=lambda s: None)
    assert "Retrying" in caplog.text and "\x1b" not in caplog.text
