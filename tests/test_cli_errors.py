"""The one table from error type to message and exit code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from marin_data import errors as E
from marin_data.cli._errors import ERROR_TABLE, EXIT_USAGE, describe


def test_subclasses_are_listed_before_their_parents():
    types = [t for t, _, _ in ERROR_TABLE]
    for i, t in enumerate(types):
        for later in types[i + 1 :]:
            assert not issubclass(later, t), f"{later.__name__} is shadowed by {t.__name__}"


def test_every_error_type_is_mapped_to_a_message_naming_the_file():
    for name in E.__all__:
        etype = getattr(E, name)
        kwargs = {"line": 7, "reason": "json"} if etype is E.BadRecordError else {}
        if etype is E.VerificationFailedError:
            exc = etype("2 problems", problems=[])
        else:
            exc = etype("something is wrong", path="data/x/part-00000.parquet", **kwargs)
        message, code = describe(exc)
        assert code != 0
        if etype is not E.VerificationFailedError:
            assert "data/x/part-00000.parquet" in message


def test_invalid_manifest_family_exits_with_usage_code_and_others_are_distinct():
    assert describe(E.UnsafePathError("x"))[1] == EXIT_USAGE
    assert describe(E.ManifestHashMismatchError("x"))[1] == EXIT_USAGE
    codes = {describe(E.CorpusLockedError("x"))[1], describe(E.TokenizerMismatchError("x"))[1],
             describe(E.ShardChecksumError("x"))[1], describe(E.RetryableRemoteError("x"))[1],
             describe(E.RemoteError("x"))[1], EXIT_USAGE}
    assert len(codes) == 6


def _documented_codes() -> dict[int, str]:
    """The README's exit-code paragraph, as code -> what it says."""
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    paragraph = " ".join(text[text.index("Exit codes:"):].split("\n\n")[0].split())
    return {int(code): what for code, what in re.findall(r"(?:^|[:;] )(\d+) ([^;]+)", paragraph)}


def test_every_error_type_maps_to_a_documented_exit_code_and_none_to_the_internal_error_code():
    documented = _documented_codes()
    assert "internal error" in documented[70]
    subclasses = [getattr(E, name) for name in E.__all__]
    assert set(subclasses) == {t for t in vars(E).values() if isinstance(t, type) and issubclass(t, E.MarinDataError)}
    for etype in subclasses:
        exc = etype.__new__(etype)  # every type, whatever its own keyword arguments
        exc.__dict__.update(message="x", path=None, expected=None, actual=None, line=1, reason="x", problems=[],
                            missing=[], failures=[], status=None, retry_after=None)
        code = describe(exc)[1]
        assert code in documented and code != 70, f"{etype.__name__} exits {code}, which the README does not list"
    assert set(code for _, _, code in ERROR_TABLE) <= set(documented)


def test_the_systems_refusals_name_the_path_and_exit_with_their_documented_code():
    import errno

    documented = _documented_codes()
    for exc in (PermissionError(errno.EACCES, "Permission denied", "/data/x"),
                PermissionError(errno.EPERM, "Operation not permitted", "/data/x"),
                OSError(errno.EROFS, "Read-only file system", "/data/x")):
        message, code = describe(exc)
        assert message.startswith(f"/data/x: {exc.strerror}") and "permissions" in documented[code]
    assert describe(OSError(errno.EIO, "Input/output error", "/data/x")) is None  # not a refusal: a bug or a disk


def test_a_full_disk_from_any_writer_exits_with_the_free_space_code():
    """Not only marin's own writes: a folder made, a lock taken, pyarrow's writes (an OSError with no path)."""
    import errno

    documented = _documented_codes()
    for exc in (OSError(errno.ENOSPC, "No space left on device", "/data/x"),
                OSError(errno.EDQUOT, "Disk quota exceeded", "/data/x"), OSError(errno.EFBIG, "File too large")):
        message, code = describe(exc)
        assert message.startswith(f"{exc.filename or 'cannot write'}: {exc.strerror}") and code == 17
        assert "free space" in documented[code] and "run the same command again" in message


def test_errors_are_also_stdlib_errors_and_keep_their_fields():
    e = E.ShardChecksumError("sha256 differs", path="p", expected="aa", actual="bb")
    assert isinstance(e, ValueError) and isinstance(e, E.MarinDataError)
    assert (e.path, e.expected, e.actual) == ("p", "aa", "bb")
    assert isinstance(E.RetryableRemoteError("x"), OSError)


@pytest.mark.parametrize("debug", ["0", "1"])
def test_cli_prints_one_line_and_traceback_only_under_marin_debug(tmp_path, debug):
    out = subprocess.run(
        [sys.executable, "-c", "from marin_data.cli import main, cli\n"
         "from marin_data.errors import CorpusLockedError\n"
         "@cli.command('boom')\n"
         "def boom():\n    raise CorpusLockedError('locked by pid 1', path='c/.marin.lock')\n"
         "main(['boom'])"],
        capture_output=True, text=True, env={"MARIN_DEBUG": debug, "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == describe(E.CorpusLockedError("x"))[1]
    assert "error: c/.marin.lock: locked by pid 1" in out.stderr
    assert ("Traceback" in out.stderr) == (debug == "1")


@pytest.mark.parametrize("command, threads", [("download", "1"), ("verify", "1"), ("train", None)])
def test_commands_but_train_keep_openblas_to_one_thread_unless_the_user_says(command, threads):
    probe = ("import os, sys; from marin_data.cli import main\n"
             f"try:\n    main([{command!r}, '--help'])\nexcept SystemExit:\n    pass\n"
             "import numpy; print(os.environ.get('OPENBLAS_NUM_THREADS'), file=sys.stderr)")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert out.stderr.strip().splitlines()[-1] == str(threads)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         env={**env, "OPENBLAS_NUM_THREADS": "3"})
    assert out.stderr.strip().splitlines()[-1] == "3"
