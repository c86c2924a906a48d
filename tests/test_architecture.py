"""The tree shows the architecture: no import cycles, the model never reaches the data side, and the data
path's stages import only from the stages before them.

Every import counts: module level, inside functions and under ``TYPE_CHECKING`` (each is a back-reference a
reader meets). The graph is read from the source with ``ast``; nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("marin_data", "marin_model", "marin_train")
# The data path, in order: a module may import from its own stage and the stages before it. `testing` and
# `cli` come last; nothing in the library imports them.
DATA_STAGES = ("marin_data.errors marin_data.retry marin_data.fileio marin_data.ui marin_data.layout",
               "marin_data.raw", "marin_data.engines", "marin_data.corpus", "marin_data.stores", "marin_data.transfer",
               "marin_data.docs", "marin_data.mirror", "marin_data.formats marin_data.levanter", "marin_data.loader", "marin_data.testing", "marin_data.cli")


def module_files() -> dict[str, Path]:
    mods = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path
    return mods


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (a name imported from a package resolves to its submodule)."""
    mods = module_files()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                targets.update(f"{base}.{a.name}" for a in node.names)
                targets.add(base)
        graph[mod] = {r for t in targets if (r := resolve(t)) and r != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def stage_of(module: str) -> int | None:
    for i, stage in enumerate(DATA_STAGES):
        if any(module == s or module.startswith(s + ".") for s in stage.split()):
            return i
    return None


def test_cycle_finder_finds_a_planted_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back_through_others():
    assert cycles(import_graph()) == []


def test_the_model_package_imports_nothing_of_the_data_or_training_side():
    reach = {m: sorted(t for t in targets if not t.startswith("marin_model"))
             for m, targets in import_graph().items() if m.startswith("marin_model")}
    assert {m: t for m, t in reach.items() if t} == {}


@pytest.mark.parametrize("package", ["marin_data", "marin_model"])
def test_the_library_never_imports_the_training_package(package):
    offenders = {m: t for m, t in import_graph().items() if m.startswith(package)
                 and any(x.startswith("marin_train") for x in t)}
    assert offenders == {}


def test_every_data_module_belongs_to_a_stage():
    unplaced = [m for m in import_graph() if m.startswith("marin_data.") and stage_of(m) is None
                and m != "marin_data.__main__"]
    assert unplaced == []


def test_data_stages_import_only_from_stages_before_them():
    backward = []
    for module, targets in import_graph().items():
        here = stage_of(module)
        if here is None:
            continue
        backward += [f"{module} -> {t}" for t in sorted(targets)
                     if (there := stage_of(t)) is not None and there > here]
    assert backward == []


def reaching(package: str, graph: dict[str, set[str]], allowed: tuple[str, ...]) -> list[str]:
    """``module -> target`` for every import of ``package`` from outside ``package`` and ``allowed``."""
    def inside(m: str, p: str) -> bool:
        return m == p or m.startswith(p + ".")

    return [f"{m} -> {t}" for m, targets in sorted(graph.items()) for t in sorted(targets)
            if inside(t, package) and not any(inside(m, a) for a in (package, *allowed))]


def test_plugin_check_finds_a_planted_import():
    graph = {"marin_data.cli.x": {"marin_data.levanter.cache"}, "marin_data.formats.registry": {"marin_data.levanter"}}
    assert reaching("marin_data.levanter", graph, ("marin_data.formats",)) == \
        ["marin_data.cli.x -> marin_data.levanter.cache"]


def test_only_the_format_registry_reaches_the_levanter_plugin():
    """A format is reached through `marin_data.formats` alone: commands, docs, the mirror, the loader and
    training speak to the `Source` it opens, so a new format costs one folder and one registry line."""
    assert reaching("marin_data.levanter", import_graph(), ("marin_data.formats",)) == []


# pyarrow's Parquet readers and the wrappers that make Python-owned memory readable by them.
_PARQUET_READERS = {"ParquetFile", "read_table", "ParquetDataset", "BufferReader", "PythonFile"}
# The standard library's JSON parsers, which recurse once per nesting level.
_JSON_PARSERS = {"json.loads", "json.load", "json.JSONDecoder"}


def references_outside(names: set[str], allowed: str, files: dict[str, Path]) -> list[str]:
    """``module:line name`` of every reference to one of ``names`` (``attr`` or ``module.attr``) outside the
    module ``allowed``."""
    found = []
    for mod, path in files.items():
        if mod == allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                name = name if name in names else f"{node.value.id}.{name}"
            if name in names:
                found.append(f"{mod}:{node.lineno} {name}")
    return found


def parquet_reads_outside(allowed: str, files: dict[str, Path]) -> list[str]:
    return references_outside(_PARQUET_READERS, allowed, files)


def test_parquet_reader_check_finds_a_planted_read(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import pyarrow as pa, pyarrow.parquet as pq\nt = pq.ParquetFile(pa.BufferReader(b''))\n")
    assert parquet_reads_outside("marin_data.fileio.parquet_io", {"planted": planted}) == \
        ["planted:2 ParquetFile", "planted:2 BufferReader"]


def test_every_parquet_read_goes_through_open_parquet():
    """A Python-owned source decoded on pyarrow's thread pool can abort the process at exit
    (`marin_data.fileio.parquet_io` says how); `open_parquet` decodes such sources on the calling thread."""
    assert parquet_reads_outside("marin_data.fileio.parquet_io", module_files()) == []


def test_json_parser_check_finds_a_planted_parse(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import json\ndoc = json.loads(b'[]')\n")
    assert references_outside(_JSON_PARSERS, "marin_data.fileio.untrusted_json", {"planted": planted}) == \
        ["planted:2 json.loads"]


def test_every_json_the_data_side_parses_goes_through_the_bounded_loader():
    """Python's parser recurses per nesting level: 100,000 levels raise RecursionError, not a ValueError
    (`marin_data.fileio.untrusted_json`); `loads` refuses such nesting first."""
    files = {m: p for m, p in module_files().items() if m.startswith("marin_data")}
    assert references_outside(_JSON_PARSERS, "marin_data.fileio.untrusted_json", files) == []


# Loading a pickle runs whatever functions it names. One module reads DCP's metadata, with an unpickler that
# builds only DCP's types; every other pickle is read with torch.load(weights_only=True).
_UNPICKLERS = {"pickle.load", "pickle.loads", "pickle.Unpickler", "_pickle.load", "_pickle.loads"}


def source_files() -> dict[str, Path]:
    """The library's modules and the scripts and benchmarks beside it: every Python file but the tests."""
    scripts = {f"{p.parent.name}/{p.name}": p for folder in ("scripts", "benchmarks", "examples")
               for p in sorted((ROOT / folder).rglob("*.py"))}
    return module_files() | scripts


def unsafe_unpickling(files: dict[str, Path]) -> list[str]:
    """``module:line what`` of each unpickler outside `marin_train.safe_load`, each ``from pickle import``
    of one, each ``torch.load`` without ``weights_only=True`` and each ``allow_pickle=True``."""
    found = references_outside(_UNPICKLERS, "marin_train.safe_load", files)
    for mod, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module in ("pickle", "_pickle"):
                found += [f"{mod}:{node.lineno} from {node.module} import {a.name}" for a in node.names
                          if a.name in ("load", "loads", "Unpickler")]
            if not isinstance(node, ast.Call):
                continue
            flags = {k.arg: k.value.value for k in node.keywords if isinstance(k.value, ast.Constant)}
            func = node.func
            if (isinstance(func, ast.Attribute) and func.attr == "load" and isinstance(func.value, ast.Name)
                    and func.value.id == "torch" and flags.get("weights_only") is not True):
                found.append(f"{mod}:{node.lineno} torch.load without weights_only=True")
            if flags.get("allow_pickle") is True:
                found.append(f"{mod}:{node.lineno} allow_pickle=True")
    return found


def test_unpickling_check_finds_planted_loads(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import pickle, torch, numpy as np\nfrom pickle import loads\nx = pickle.load(f)\n"
                       "y = torch.load(f, weights_only=False)\nz = torch.load(f)\nw = np.load(f, allow_pickle=True)\n"
                       "ok = torch.load(f, map_location='cpu', weights_only=True)\n")
    assert sorted(unsafe_unpickling({"planted": planted})) == [
        "planted:2 from pickle import loads", "planted:3 pickle.load", "planted:4 torch.load without weights_only=True",
        "planted:5 torch.load without weights_only=True", "planted:6 allow_pickle=True"]


def test_nothing_unpickles_more_than_tensors_and_plain_values():
    """A checkpoint is input: whoever can write it can seal it anew (docs/security.md, "Training
    checkpoints"), so none of its pickles may name a function that runs."""
    assert unsafe_unpickling(source_files()) == []


# House size limits: a package shows its parts on its first listing, a module holds one concept a reader can
# keep in mind, a function fits on a screen.
MAX_TOP_LEVEL_MODULES = 8  # .py files directly in marin_data/, __init__ and __main__ included
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80  # from the ``def`` line to the body's last, decorators not counted


def crowded_folder(folder: Path, files: dict[str, Path], limit: int = MAX_TOP_LEVEL_MODULES) -> list[str]:
    """The modules directly in ``folder`` when they are more than ``limit``; [] otherwise."""
    here = sorted(mod for mod, path in files.items() if path.parent == folder)
    return here if len(here) > limit else []


def long_modules(files: dict[str, Path], limit: int = MAX_MODULE_LINES) -> list[str]:
    """``module (N lines)`` of every module over ``limit`` lines."""
    counts = {mod: len(path.read_text().splitlines()) for mod, path in files.items()}
    return [f"{mod} ({n} lines)" for mod, n in counts.items() if n > limit]


def long_functions(files: dict[str, Path], limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``module:line name (N lines)`` of every function over ``limit`` lines: methods and nested functions
    too, each counted from its ``def`` to its last line (a nested function counts in its parent as well)."""
    found = []
    for mod, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    found.append(f"{mod}:{node.lineno} {node.name} ({n} lines)")
    return found


def test_size_checks_find_a_planted_crowd_module_and_function(tmp_path):
    folder = tmp_path / "pkg"
    folder.mkdir()
    planted = {}
    for name in ("__init__", "__main__", *(f"m{i}" for i in range(7))):
        planted[f"pkg.{name}"] = folder / f"{name}.py"
        planted[f"pkg.{name}"].write_text("")
    assert crowded_folder(folder, planted) == sorted(planted)  # nine modules
    del planted["pkg.m6"]
    assert crowded_folder(folder, planted) == []  # eight

    def body(indent: str) -> str:
        return "".join(f"{indent}x{i} = {i}\n" for i in range(79))

    (folder / "m0.py").write_text(f"import functools\n@functools.cache\n@functools.wraps(print)\ndef fits():\n"
                                  f"{body('    ')}class C:\n    async def over(self):\n{body('        ')}"
                                  "        def inner():\n            pass\n" + "\n" * 285)
    assert long_functions(planted) == ["pkg.m0:85 over (82 lines)"]  # fits: 80 lines, its decorators not counted
    assert long_modules(planted) == ["pkg.m0 (451 lines)"]


def test_marin_data_shows_at_most_eight_top_level_modules():
    assert crowded_folder(ROOT / "marin_data", module_files()) == []


def test_no_module_is_over_450_lines():
    assert long_modules(module_files()) == []


def test_no_function_is_over_80_lines():
    assert long_functions(module_files()) == []
