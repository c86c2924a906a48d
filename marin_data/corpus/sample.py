"""``marin-data sample``: a real corpus built offline from text every Python installation carries.

The embedded default of ``make quickstart``: no network, no downloads, the same bytes on every
machine with the same Python and ``tokenizers``. Four subsets of very different sizes, so mixtures and
the loader have something to balance:

- ``code/python-stdlib``: every ``.py`` module of the standard library, one document per file. Test suites
  (``test/``, ``tests/``, ``idle_test/``) are left out: Debian, Ubuntu and the official Docker images ship
  Python without them, and the sample must be the same size everywhere.
- ``prose/docstrings``: module, class and function docstrings, extracted with `ast`, one per object.
- ``prose/pydoc-topics``: the language-reference topics ``help()`` shows (``pydoc_data.topics``).
- ``reference/unicode-names``: the character names of the Unicode database built into `unicodedata`, one
  document per block of 256 code points.

Together they make ~6M tokens with the default 8,192-token byte-level BPE, which is trained here on the
sample's own text (or pass a tokenizer). The trainer was checked to give the same ``tokenizer.json``
bytes in separate processes, with one Rayon thread or several (tests/test_sample.py trains it three
times; it also builds the whole sample twice, with 2 workers and with 1, and compares the bytes).

``sample.json``, beside the manifest and listed in it, fingerprints what the sample was made from: the
Python version, a digest of the standard-library files used, the Unicode and ``tokenizers`` versions,
and a digest of every document. Building again into the same directory with the same fingerprint
resumes or does nothing; a different fingerprint is refused.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import platform
import sysconfig
import tempfile
import tokenize as py_tokenize
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from marin_data.fileio.atomic import atomic_write_bytes
from marin_data.corpus.build import ShardReport, shard_subset
from marin_data.corpus.info import CorpusInfo, corpus_info
from marin_data.engines import make_engine
from marin_data.errors import CorpusConflictError
from marin_data.layout import MANIFEST, TOKENIZER
from marin_data.raw.bpe import train_tokenizer
from marin_data.raw.tokenizer import LoadedTokenizer, load_tokenizer

__all__ = ["SAMPLE_JSON", "SAMPLE_META", "DEFAULT_VOCAB_SIZE", "SUBSETS", "SampleReport", "sample_documents",
           "build_sample"]

SAMPLE_JSON = "sample.json"
SAMPLE_META = Path(__file__).with_name("sample-meta.yaml")  # the datasheet's answers for the sample (shipped)
DEFAULT_VOCAB_SIZE = 8192
_SHARDS_PER_SUBSET = 8  # about; small shards so the loader and verify have several per subset
_INPUT_FILE_CHARS = 1 << 21  # ~2 MB of text per input file: enough units to keep every worker busy
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}

Doc = tuple[str, str]  # (id, text)


def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_sources() -> list[tuple[str, str]]:
    """``(relative path, source text)`` of the standard library's modules, sorted by path."""
    root = _stdlib_root()
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        found += [Path(dirpath, f) for f in filenames if f.endswith(".py")]
    sources = []
    for path in sorted(found, key=lambda p: p.relative_to(root).as_posix()):
        data = path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:  # a module declaring another encoding (PEP 263)
            encoding, _ = py_tokenize.detect_encoding(iter(data.splitlines(keepends=True)).__next__)
            text = data.decode(encoding)
        sources.append((path.relative_to(root).as_posix(), text))
    return sources


def _docstrings(sources: list[tuple[str, str]]) -> list[Doc]:
    docs: list[Doc] = []
    seen: set[str] = set()
    for rel, text in sources:
        module = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        module_doc = ast.get_docstring(tree)
        for name, doc in [("", module_doc)] * bool(module_doc) + list(_walk_docstrings(tree, "")):
            doc_id = f"{module}:{name}" if name else module
            n = 2
            while doc_id in seen:  # the same name defined twice (if/else branches, property setters)
                doc_id = f"{module}:{name}#{n}"
                n += 1
            seen.add(doc_id)
            docs.append((doc_id, doc))
    return docs


def _walk_docstrings(node: ast.AST, prefix: str) -> Iterator[tuple[str, str]]:
    """``(qualified name, docstring)`` of the classes and functions under ``node``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}.{child.name}" if prefix else child.name
            if doc := ast.get_docstring(child):
                yield name, doc
            yield from _walk_docstrings(child, name)
        elif isinstance(child, ast.stmt):  # if/try/with blocks: their definitions belong to this scope
            yield from _walk_docstrings(child, prefix)


def _pydoc_topics() -> list[Doc]:
    from pydoc_data.topics import topics

    return sorted(topics.items())


def _unicode_names() -> list[Doc]:
    docs = []
    for block in range(0, 0x110000, 256):
        lines = [f"U+{cp:04X}\t{name}" for cp in range(block, block + 256) if (name := unicodedata.name(chr(cp), ""))]
        if lines:
            docs.append((f"U+{block:04X}..U+{block + 255:04X}", "\n".join(lines) + "\n"))
    return docs


def _unicode_license() -> str:
    # The Unicode License v3 covers Unicode 15.1 and later; earlier data is under Unicode-DFS-2016.
    return "Unicode-3.0" if tuple(map(int, unicodedata.unidata_version.split("."))) >= (15, 1) else "Unicode-DFS-2016"


@dataclass(frozen=True)
class _Subset:
    name: str
    license: str
    description: str
    build: Callable[[list[tuple[str, str]]], list[Doc]]  # from the stdlib sources


SUBSETS = (
    _Subset("code/python-stdlib", "PSF-2.0", "the standard library's .py modules, one per document (no tests)",
            lambda sources: list(sources)),
    _Subset("prose/docstrings", "PSF-2.0", "module, class and function docstrings of the standard library",
            _docstrings),
    _Subset("prose/pydoc-topics", "PSF-2.0", "the language-reference topics of help() (pydoc_data.topics)",
            lambda sources: _pydoc_topics()),
    _Subset("reference/unicode-names", _unicode_license(), "Unicode character names from unicodedata, one "
            "document per 256 code points", lambda sources: _unicode_names()),
)


def sample_documents() -> tuple[dict[str, list[Doc]], dict]:
    """Every subset's documents, and the fingerprint of what they were made from."""
    sources = _stdlib_sources()
    docs = {s.name: s.build(sources) for s in SUBSETS}
    stdlib = hashlib.sha256()
    for rel, text in sources:
        stdlib.update(f"{rel}\0{len(text)}\0".encode() + text.encode("utf-8", "surrogatepass"))
    everything = hashlib.sha256()
    for name, subset_docs in docs.items():
        for doc_id, text in subset_docs:
            everything.update(f"{name}\0{doc_id}\0{len(text)}\0".encode() + text.encode("utf-8", "surrogatepass"))
    fingerprint = {
        "python": {"implementation": platform.python_implementation(), "version": platform.python_version()},
        "stdlib": {"files": len(sources), "sha256": stdlib.hexdigest()},
        "unidata_version": unicodedata.unidata_version,
        "documents_sha256": everything.hexdigest(),
    }
    return docs, fingerprint


@dataclass(frozen=True)
class SampleReport:
    info: CorpusInfo
    subsets: list[ShardReport]
    trained_tokenizer: bool  # False: given with --tokenizer, or reused from an earlier build


def build_sample(out: str | os.PathLike, *, tokenizer: str | None = None, vocab_size: int = DEFAULT_VOCAB_SIZE,
                 workers: int | None = None) -> SampleReport:
    """Build the sample corpus into ``out``.

    Args:
        out: the corpus directory (new, or an earlier build of the same sample to finish).
        tokenizer: a tokenizer.json path or Hugging Face repo id to use instead of training one.
        vocab_size: the vocabulary of the trained tokenizer.
        workers: worker processes for sharding (None: one per usable CPU).

    Raises:
        CorpusConflictError: ``out`` holds a corpus that is not this sample (another Python, tokenizer or
            vocabulary size).
    """
    out = Path(out)
    docs, fingerprint = sample_documents()
    given = load_tokenizer(tokenizer) if tokenizer else None
    fingerprint["tokenizer"] = ({"given": given.info.name, "sha256": given.info.sha256} if given else
                                {"trained": "byte-level BPE", "vocab_size": vocab_size,
                                 "tokenizers_version": _tokenizers_version()})
    fingerprint["subsets"] = {s.name: {"license": s.license, "description": s.description} for s in SUBSETS}
    fingerprint_bytes = (json.dumps({"format": 1, **fingerprint}, indent=2, sort_keys=True) + "\n").encode()
    previous = out / SAMPLE_JSON
    if (out / MANIFEST).exists() or previous.exists():
        if not previous.exists() or previous.read_bytes() != fingerprint_bytes:
            raise CorpusConflictError(f"holds another corpus or another sample build (its {SAMPLE_JSON} differs); "
                                      f"build into a new directory", path=str(out))
    with tempfile.TemporaryDirectory(prefix="marin-sample-") as tmp:
        loaded, trained = (given, False) if given else _trained_tokenizer(out, vocab_size, docs, Path(tmp))
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(previous, fingerprint_bytes)
        reports = []
        with contextlib.closing(make_engine("local", workers)) as engine:  # one pool for all the subsets
            for subset in SUBSETS:
                inputs = _write_inputs(Path(tmp) / subset.name, docs[subset.name])
                chars = sum(len(text) for _, text in docs[subset.name])
                shard_tokens = max(1024, chars // (4 * _SHARDS_PER_SUBSET) // 1024 * 1024)  # ~4 chars per token
                reports.append(shard_subset(inputs, subset=subset.name, tokenizer=loaded, out=out, engine=engine,
                                            license=subset.license, shard_tokens=shard_tokens, name="marin-sample",
                                            version=f"py{platform.python_version()}", extra_files=[SAMPLE_JSON]))
    return SampleReport(info=corpus_info(out), subsets=reports, trained_tokenizer=trained)


def _tokenizers_version() -> str:
    import tokenizers

    return tokenizers.__version__


def _trained_tokenizer(out: Path, vocab_size: int, docs: dict[str, list[Doc]],
                       tmp: Path) -> tuple[LoadedTokenizer, bool]:
    """The tokenizer of an earlier build with the same fingerprint, or a newly trained one."""
    name = f"marin-sample-bpe-{vocab_size}"
    if (out / TOKENIZER).exists():  # same fingerprint (checked by the caller): same training, same bytes
        return load_tokenizer(str(out / TOKENIZER), name=name), False
    path = tmp / TOKENIZER
    path.write_bytes(train_tokenizer([text for subset in docs.values() for _, text in subset], vocab_size))
    return load_tokenizer(str(path), name=name), True


def _write_inputs(folder: Path, docs: list[Doc]) -> list[str]:
    """Write documents as JSON Lines files of ~2 MB of text each; return their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths: list[str] = []
    lines: list[str] = []
    chars = 0
    for i, (doc_id, text) in enumerate(docs):
        lines.append(json.dumps({"id": doc_id, "text": text}) + "\n")
        chars += len(text)
        if chars >= _INPUT_FILE_CHARS or i == len(docs) - 1:
            path = folder / f"part-{len(paths):03d}.jsonl"
            path.write_text("".join(lines), encoding="utf-8")
            paths.append(str(path))
            lines, chars = [], 0
    return paths
