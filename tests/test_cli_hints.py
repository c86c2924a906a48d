"""What the commands say when they are pointed at the wrong thing, and what they keep out of a log."""

from __future__ import annotations

import pytest
from conftest import build_corpus
from shard_env import run_cli

from marin_data.mirror.repo import RepoStore


def test_serve_refuses_a_corpus_as_root_and_says_why_a_folder_is_skipped(tmp_path):
    corpus = build_corpus(tmp_path / "c", {"a": [3]})
    out = run_cli("serve", corpus.root, "--port", "0", timeout=60)
    assert out.returncode == 2 and "ROOT must hold org/name folders" in out.stderr
    (tmp_path / "root/team").mkdir(parents=True)
    (tmp_path / "root/team/linked").symlink_to(corpus.root, target_is_directory=True)
    (tmp_path / "root/team/notes.txt").write_text("x")
    skipped = dict(RepoStore(tmp_path / "root").skipped())
    assert "outside ROOT" in skipped["team/linked"] and "file" in skipped["team/notes.txt"]


def test_the_shipped_sample_answers_pass_strict_wherever_it_is_run():
    from marin_data.corpus.sample import SAMPLE_META, SUBSETS
    from marin_data.docs.questions import load_metadata, require_complete

    names = [s.name for s in SUBSETS]
    require_complete(load_metadata(SAMPLE_META, subsets=names), names)  # packaged: no path relative to a checkout
    assert SAMPLE_META.is_absolute()


def test_counts_agree_with_their_nouns(tmp_path, capsys):
    from marin_data.cli import main
    from marin_data.ui import plural

    assert [plural(n, "file") for n in (0, 1, 2, 1024)] == ["0 files", "1 file", "2 files", "1,024 files"]
    assert (plural(1, "entry", "entries"), plural(3, "entry", "entries")) == ("1 entry", "3 entries")
    corpus = build_corpus(tmp_path / "c", {"a": [5], "b": [4]})
    for subset in ("a", "b"):  # the second run fetches b's one shard: everything else is there
        with pytest.raises(SystemExit) as exit_:
            main(["download", str(corpus.root), "--subset", subset, "--to", str(tmp_path / "copy")])
        assert exit_.value.code == 0
    assert "Downloaded: 1 file fetched" in capsys.readouterr().out


def _examples(command) -> list[str]:
    """The lines of a command's EXAMPLES block, as its help prints them."""
    text = command.help or ""
    block = text.split("EXAMPLES", 1)[1] if "EXAMPLES" in text else ""
    return [line for line in block.splitlines() if line.strip()]


def test_every_example_in_every_help_is_one_command_per_line():
    """A continuation written with one backslash in a docstring joins two lines into one (Python reads ``\\``
    before a newline as a line continuation): its second half then follows a run of spaces mid-line."""
    import re

    import click

    from marin_data.cli import cli
    from marin_train.cli import group

    ctx = click.Context(cli)
    commands = [cli, group, *group.commands.values(), *(cli.get_command(ctx, n) for n in cli.list_commands(ctx))]
    joined = [(c.name, line) for c in commands for line in _examples(c) if re.search(r"\S {6,}-", line)]
    assert not joined
    assert sum(len(_examples(c)) for c in commands) > 40  # the blocks are there to check
