"""What the commands say when they are pointed at the wrong thing, and what they keep out of a log."""

from __future__ import annotations

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
