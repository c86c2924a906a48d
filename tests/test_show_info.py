"""`marin-data info` and `show` on local and published corpora, and store flags that would do nothing."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys

import pytest
from s3_env import bucket_url, moto, s3_client  # noqa: F401
from shard_env import ROOT, run_cli, tiny_tokenizer, write_jsonl  # noqa: F401

from marin_data.cli import main
from marin_data.corpus.build import shard_subset
from marin_data.corpus.manifest import load_corpus
from marin_data.testing.mirror import running_mirror
from marin_data.transfer.publish_s3 import publish

TEXTS = {"prose": [f"document {i}: the quick brown fox jumps over the lazy dog {i} times" for i in range(30)]
         + [" ".join(f"word{i}" for i in range(1000))],  # prose-30: 7,890 characters, longer than a screen
         "code": [f"def f{i}(x):\n    return x + {i}\n" for i in range(12)]}
LONG = TEXTS["prose"][30]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, tiny_tokenizer):  # noqa: F811
    root = tmp_path_factory.mktemp("show")
    for subset, texts in TEXTS.items():
        inputs = write_jsonl(root / f"{subset}.jsonl", [{"id": f"{subset}-{i}", "text": t} for i, t in enumerate(texts)])
        shard_subset([inputs], subset=subset, tokenizer=str(tiny_tokenizer), out=root / "c", workers=1,
                     shard_tokens=200)
    return load_corpus(root / "c")


def _shown(out) -> list[dict]:
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_show_decodes_a_local_subset_and_finds_a_document_by_id(corpus):
    docs = _shown(run_cli("show", corpus.root, "--subset", "prose", "-n", "2", "--json"))
    assert [d["text"] for d in docs] == TEXTS["prose"][:2] and docs[0]["id"] == "prose-0"
    last = _shown(run_cli("show", corpus.root, "--subset", "prose", "--id", "prose-29", "--json"))
    assert [d["text"] for d in last] == [TEXTS["prose"][29]] and last[0]["shard"] != docs[0]["shard"]


def show_cli(capsys, *args) -> tuple[int, str, str]:
    """``marin-data show ARGS`` in this process (stdout is not a terminal): (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exit_:
        main(["show", *map(str, args)])
    return exit_.value.code, *capsys.readouterr()


def on_a_terminal(*args) -> str:
    """What ``marin-data ARGS`` prints with a pseudo-terminal as stdin, stdout and stderr."""
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "marin_data", *map(str, args)], stdin=follower, stdout=follower,
                            stderr=follower, cwd=ROOT)
    os.close(follower)
    out = b""
    try:
        while select.select([leader], [], [], 60)[0]:  # bounded: a silent minute ends it
            try:
                chunk = os.read(leader, 1 << 16)
            except OSError:  # EIO: the command exited and closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(leader)
        proc.wait(timeout=60)
    return out.decode().replace("\r\n", "\n")


def test_show_cuts_long_documents_on_a_terminal_and_shows_them_whole_when_piped(corpus, capsys):
    shown = on_a_terminal("show", corpus.root, "--subset", "prose", "--id", "prose-30")
    assert LONG[:2000] + f"… ({len(LONG) - 2000:,} more characters; --max-chars 0 shows them)" in shown
    assert LONG[:2001] not in shown
    code, out, _ = show_cli(capsys, corpus.root, "--subset", "prose", "--id", "prose-30")
    assert code == 0 and LONG in out and "more characters" not in out  # piped: whole
    code, out, _ = show_cli(capsys, corpus.root, "--subset", "prose", "--id", "prose-30", "--max-chars", "10")
    assert f"\n{LONG[:10]}… ({len(LONG) - 10:,} more characters;" in out
    code, out, _ = show_cli(capsys, corpus.root, "--subset", "prose", "-n", "1", "--json", "--max-chars", "10")
    doc = json.loads(out)
    assert doc["text"] == TEXTS["prose"][0][:10] and doc["more_chars"] == len(TEXTS["prose"][0]) - 10
    code, out, _ = show_cli(capsys, corpus.root, "--subset", "prose", "-n", "1", "--json")
    assert "more_chars" not in json.loads(out)


def test_show_hints_name_what_is_wrong(corpus, capsys, tmp_path):
    code, _, err = show_cli(capsys, corpus.root, "--subset", "prose", "--id", "no-such-id")
    assert code == 2 and "no document with id 'no-such-id'" in err and "--json` prints documents with their ids" in err
    assert "root of a marin corpus" not in err
    damaged = shutil.copytree(corpus.root, tmp_path / "c")
    with open(damaged / "tokenizer.json", "a") as f:
        f.write(" ")
    code, _, err = show_cli(capsys, damaged, "--subset", "prose")
    assert code == 2 and f"{damaged / 'tokenizer.json'}: tokenizer sha256" in err and "damaged or was replaced" in err
    assert "--eos-token" not in err  # show takes no such flag


def test_info_and_show_read_a_published_corpus_without_downloading_it(corpus, moto, bucket_url, tmp_path):  # noqa: F811
    publish(corpus.root, to=bucket_url, endpoint_url=moto)
    info = run_cli("info", bucket_url, "--endpoint-url", moto, "--json")
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["manifest_sha256"] == corpus.manifest_sha256
    docs = _shown(run_cli("show", bucket_url, "--endpoint-url", moto, "--subset", "code", "-n", "3", "--json"))
    assert [d["text"] for d in docs] == TEXTS["code"][:3]

    shutil.copytree(corpus.root, tmp_path / "hub/team/c")
    with running_mirror(tmp_path / "hub") as mirror:
        url = "hf://datasets/team/c"
        info = run_cli("info", url, "--endpoint", mirror.url, "--manifest-sha256", corpus.manifest_sha256)
        assert info.returncode == 0 and corpus.manifest_sha256 in info.stdout, info.stderr
        docs = _shown(run_cli("show", url, "--endpoint", mirror.url, "--subset", "prose", "--id", "prose-7",
                              "--json"))
        assert [d["text"] for d in docs] == [TEXTS["prose"][7]]


def test_s3_flags_with_an_hf_source_are_usage_errors(tmp_path):
    for args, says in ((["download", "hf://datasets/team/c", "--to", tmp_path / "d", "--endpoint-url", "http://x"],
                        "--endpoint-url applies to s3:// URLs only"),
                       (["info", "hf://datasets/team/c", "--endpoint-url", "http://x"],
                        "--endpoint-url does not apply to hf:// URLs")):
        out = run_cli(*args, timeout=60)
        assert out.returncode == 2 and says in out.stderr, out.stderr
    out = run_cli("download", "hf://datasets/team/c", "--to", tmp_path / "d", "--profile", "p", "--anonymous",
                  timeout=60)
    assert out.returncode == 2 and "--profile, --anonymous apply to s3:// URLs only" in out.stderr, out.stderr
