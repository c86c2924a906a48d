"""``--engine ray``: the same bytes as the local engine, retries, resume, verify, and clear errors.

One local Ray instance (2 CPUs) serves the whole module; the CLI test starts (and must stop) its own.
Failures are injected by wrapping the real work functions (`_flaky`), never by a hook in the library:
the job runs the pipeline's own `tokenize_unit` / `pack_shard`, after the wrapper logs the attempt and,
the first time it sees that job, fails as the test asks.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from shard_env import ROOT, make_texts, run_cli, tiny_tokenizer, tree_bytes, write_jsonl  # noqa: F401 - fixture

from marin_data.corpus.build import shard_subset
from marin_data.corpus.commit import commit_corpus
from marin_data.corpus.manifest import load_corpus
from marin_data.corpus.sources import sources_path
from marin_data.corpus.units import UnitJob
from marin_data.corpus.verify import verify_corpus
from marin_data.engines.local import LocalEngine
from marin_data.errors import BadRecordError, EngineError
from marin_data.layout import STAGING

try:
    import ray
except ImportError:  # the dev extras install it; the error tests below still run without it
    ray = None

needs_ray = pytest.mark.skipif(ray is None, reason="Ray is not installed (pip install -e '.[ray]')")
pytestmark = pytest.mark.slow  # a Ray instance takes seconds to start

SUBSET = "web/ray"
SHARD_TOKENS = 40_000
N_INPUTS = 4


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("inputs")
    for f in range(N_INPUTS):
        write_jsonl(folder / f"f{f}.jsonl", [{"text": t, "id": f"d{f}-{i}"} for i, t in enumerate(make_texts(60, f))])
    return folder


def _shard(inputs: Path, tokenizer: Path, out: Path, engine, **kwargs):
    return shard_subset([inputs], subset=SUBSET, tokenizer=str(tokenizer), out=out, engine=engine,
                        shard_tokens=SHARD_TOKENS, license="CC0-1.0", **kwargs)


@pytest.fixture(scope="module")
def local_corpus(tmp_path_factory: pytest.TempPathFactory, inputs: Path, tiny_tokenizer: Path) -> Path:
    """The reference: the same subset written by the local process pool."""
    out = tmp_path_factory.mktemp("local") / "corpus"
    engine = LocalEngine(2)
    try:
        report = _shard(inputs, tiny_tokenizer, out, engine)
    finally:
        engine.close()
    assert report.shards >= 4  # the verify test corrupts four of them
    return out


def _ray_processes(session_pid: int) -> list[str]:
    """Command lines of live Ray processes of the session started by process ``session_pid``."""
    marker = f"_{session_pid}/"  # Ray's session folder: /tmp/ray/session_<date>_<pid of the starter>/
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if proc.name.isdigit() and "/tmp/ray/session_" in cmdline and marker in cmdline:
            found.append(cmdline[:200])
    return found


def _gone(session_pid: int, within: float = 30) -> list[str]:
    end = time.monotonic() + within
    while (left := _ray_processes(session_pid)) and time.monotonic() < end:
        time.sleep(0.2)  # a poll with a deadline: Ray's processes exit on their own time, and announce nothing
    return left


@pytest.fixture(scope="module")
def ray_engine():
    """One local Ray instance (2 CPUs) for the module, started by the engine itself; stopped at the end."""
    if ray is None:
        pytest.skip("Ray is not installed")
    from marin_data.engines.ray import RayEngine

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module
    engine = RayEngine(2)
    assert list(engine.map_unordered(abs, [-1])) == [(0, 1)]  # starts Ray: later engines in this process share it
    yield engine
    engine.close()
    assert not ray.is_initialized()
    assert not _gone(os.getpid()), "Ray processes outlived ray.shutdown()"


class _Injecting:
    """An engine that runs each job through `_flaky` on the module's Ray instance (``max_retries`` as given)."""

    def __init__(self, log: Path, mode: str, max_retries: int = 3) -> None:
        from marin_data.engines.ray import RayEngine

        self.log, self.mode = log, mode
        self.inner = RayEngine(2, max_retries=max_retries)
        self.workers = 2

    def map_unordered(self, fn, jobs):
        return self.inner.map_unordered(functools.partial(_flaky, fn, str(self.log), self.mode), jobs)

    def close(self) -> None:
        self.inner.close()

    def attempts(self) -> dict[str, int]:
        lines = (self.log / "attempts").read_text().split() if (self.log / "attempts").exists() else []
        return {k: lines.count(k) for k in set(lines)}


def _flaky(fn, log: str, mode: str, job):
    """Log an attempt at ``job``, fail as ``mode`` says, else run ``fn(job)``.

    ``oserror``: a transient `OSError` on the first attempt at each job; ``crash``: the worker process
    dies on the first attempt; ``crash-always``: it dies on every attempt; ``stall-first-unit``: the unit of
    the first input waits until every other unit is done, then fails with a non-retryable `RuntimeError`.
    """
    name = hashlib.sha256(repr(job).encode()).hexdigest()[:16]
    with open(Path(log) / "attempts", "a") as f:
        f.write(name + "\n")
    try:
        os.close(os.open(Path(log) / name, os.O_CREAT | os.O_EXCL))
        first = True
    except FileExistsError:
        first = False
    if mode == "oserror" and first:
        raise OSError(errno.EIO, "injected transient I/O error")
    if (mode == "crash" and first) or mode == "crash-always":
        os._exit(1)
    if mode == "stall-first-unit" and isinstance(job, UnitJob) and job.input.name == "f0.jsonl":
        end = time.monotonic() + 60
        while len(list(Path(job.staging).glob("*.json"))) < N_INPUTS - 1 and time.monotonic() < end:
            time.sleep(0.05)  # a poll with a deadline: the other tasks run in other processes
        raise RuntimeError("injected failure after the other units finished")
    return fn(job)


# --- the same bytes -------------------------------------------------------------------------------------


@needs_ray
def test_shards_on_ray_are_byte_identical_to_the_local_engine(ray_engine, inputs, tiny_tokenizer, local_corpus,
                                                              tmp_path):
    report = _shard(inputs, tiny_tokenizer, tmp_path / "corpus", ray_engine)
    assert report.units == N_INPUTS and report.units_reused == 0
    assert tree_bytes(tmp_path / "corpus") == tree_bytes(local_corpus)


@needs_ray
def test_ray_runs_the_jobs_appended_while_its_results_are_read(ray_engine):
    jobs = [-1, -2]
    results = {}
    for k, result in ray_engine.map_unordered(abs, jobs):
        results[k] = result
        if result < 100:
            jobs.append(-100 * result)
    assert results == {k: abs(job) for k, job in enumerate(jobs)} and sorted(results.values()) == [1, 2, 100, 200]


@needs_ray
def test_cli_shard_on_a_private_ray_instance_matches_and_stops_it(inputs, tiny_tokenizer, local_corpus, tmp_path):
    out = tmp_path / "corpus"
    args = [str(inputs), "--subset", SUBSET, "--tokenizer", str(tiny_tokenizer), "--out", str(out),
            "--shard-tokens", str(SHARD_TOKENS), "--license", "CC0-1.0", "--engine", "ray", "--workers", "2"]
    proc = subprocess.Popen([sys.executable, "-m", "marin_data", "shard", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert f"sharded {N_INPUTS} input files" in stdout
    assert tree_bytes(out) == tree_bytes(local_corpus)
    assert not _gone(proc.pid), "the CLI left its Ray instance running"


# --- retries, typed errors, resume ----------------------------------------------------------------------


@needs_ray
@pytest.mark.parametrize("mode", ["oserror", "crash"])
def test_a_task_that_fails_once_is_retried_and_the_run_completes(ray_engine, inputs, tiny_tokenizer, local_corpus,
                                                                  tmp_path, mode):
    (tmp_path / "log").mkdir()
    engine = _Injecting(tmp_path / "log", mode)
    report = _shard(inputs, tiny_tokenizer, tmp_path / "corpus", engine)
    attempts = engine.attempts()
    assert len(attempts) == N_INPUTS + report.shards  # every unit and every shard ...
    assert set(attempts.values()) == {2}  # ... failed once and succeeded on its retry
    assert tree_bytes(tmp_path / "corpus") == tree_bytes(local_corpus)


@needs_ray
def test_a_worker_dying_on_every_retry_is_an_engine_error(ray_engine, inputs, tiny_tokenizer, tmp_path):
    (tmp_path / "log").mkdir()
    engine = _Injecting(tmp_path / "log", "crash-always", max_retries=1)
    with pytest.raises(EngineError, match="failed 2 times"):
        _shard(inputs, tiny_tokenizer, tmp_path / "corpus", engine)
    assert max(engine.attempts().values()) == 2


@needs_ray
def test_a_bad_record_is_not_retried_and_raises_the_local_engines_error(ray_engine, tiny_tokenizer, tmp_path):
    folder = tmp_path / "in"
    write_jsonl(folder / "good.jsonl", [{"text": t} for t in make_texts(20, 1)])
    (folder / "bad.jsonl").write_bytes(b'{"text": "fine"}\n{"text": "unterminated\n')
    errors = {}
    for name in ("local", "ray"):
        (tmp_path / name).mkdir()
        engine = LocalEngine(1) if name == "local" else _Injecting(tmp_path / name, "count")
        with pytest.raises(BadRecordError) as e:
            shard_subset([folder], subset="s", tokenizer=str(tiny_tokenizer), out=tmp_path / name / "c", engine=engine)
        engine.close()
        errors[name] = (type(e.value), str(e.value), e.value.path, e.value.line)
    assert errors["ray"] == errors["local"]
    assert str(folder / "bad.jsonl") in errors["ray"][1] and errors["ray"][3] == 2
    assert max(engine.attempts().values()) == 1  # a verdict on the input: never retried


@needs_ray
def test_a_rerun_after_a_failed_ray_run_redoes_only_the_unfinished_unit(ray_engine, inputs, tiny_tokenizer,
                                                                        local_corpus, tmp_path):
    (tmp_path / "log").mkdir()
    with pytest.raises(RuntimeError, match="injected failure"):
        _shard(inputs, tiny_tokenizer, tmp_path / "corpus", _Injecting(tmp_path / "log", "stall-first-unit"))
    units = list((tmp_path / "corpus" / STAGING).rglob("units/*.json"))
    assert len(units) == N_INPUTS - 1
    report = _shard(inputs, tiny_tokenizer, tmp_path / "corpus", ray_engine)
    assert report.units_reused == N_INPUTS - 1
    assert tree_bytes(tmp_path / "corpus") == tree_bytes(local_corpus)


# --- verify -----------------------------------------------------------------------------------------------


@needs_ray
def test_verify_on_ray_finds_the_same_problems_as_the_local_engine(ray_engine, local_corpus, tmp_path):
    root = tmp_path / "corpus"
    shutil.copytree(local_corpus, root)
    corpus = load_corpus(root)
    shards = corpus.shards
    rows = [s._replace(docs=s.docs + 1) if s.path == shards[3].path else s for s in shards]
    commit_corpus(root, corpus.manifest, rows, extra_files=[sources_path(SUBSET)])  # miscounts shard 3: deep
    (root / shards[0].path).unlink()
    os.truncate(root / shards[1].path, 100)
    data = bytearray((root / shards[2].path).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (root / shards[2].path).write_bytes(bytes(data))
    (root / shards[0].path).with_name("part-09999.parquet").write_bytes(b"stray")

    local = verify_corpus(root, deep=True, workers=2)
    on_ray = verify_corpus(root, deep=True, engine="ray")
    assert [p.to_json() for p in on_ray.problems] == [p.to_json() for p in local.problems]
    assert [(p.path, p.kind.value) for p in on_ray.problems] == [
        (shards[0].path, "missing"), (shards[1].path, "truncated"), (shards[2].path, "modified"),
        (shards[3].path, "count_mismatch"), (f"data/{SUBSET}/part-09999.parquet", "unlisted")]
    assert (on_ray.files_checked, on_ray.bytes_checked, on_ray.workers) == \
        (local.files_checked, local.bytes_checked, 2)


# --- errors without a cluster -----------------------------------------------------------------------------


_NO_RAY = "import sys; sys.modules['ray'] = None; from marin_data.cli import main; main(sys.argv[1:])"


@pytest.mark.parametrize("command", ["shard", "verify"])
def test_without_ray_the_engine_says_how_to_install_it(local_corpus, inputs, tiny_tokenizer, tmp_path, command):
    args = [str(local_corpus)] if command == "verify" else \
        [str(inputs), "--subset", "s", "--tokenizer", str(tiny_tokenizer), "--out", str(tmp_path / "c")]
    done = subprocess.run([sys.executable, "-c", _NO_RAY, command, *args, "--engine", "ray"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 13, done.stderr
    assert "pip install 'marin[ray]'" in done.stderr


def test_a_ray_address_needs_the_ray_engine(local_corpus):
    done = run_cli("verify", local_corpus, "--ray-address", "auto")
    assert done.returncode == 2 and "--ray-address needs --engine ray" in done.stderr


@needs_ray
def test_a_cluster_address_that_does_not_answer_is_an_engine_error(local_corpus):
    import socket

    with socket.socket() as s:  # a loopback port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = run_cli("verify", local_corpus, "--engine", "ray", "--ray-address", f"127.0.0.1:{port}")
    assert done.returncode == 14, done.stderr
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in done.stderr
