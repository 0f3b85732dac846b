"""Why this exists: no module of the tree may import itself back through others, so that any module
(a benchmark, a workload, a test helper) can be read, imported and changed without the rest.

The test reads every .py file of python/, bench/ and tests/python/ with `ast` (nothing is imported,
so it runs on any machine, fast), builds the graph of imports among the tree's own modules, and
fails naming the cycle when there is one. The modules are named as they are imported: python/'s
by their dotted path (`graphed._forward`), bench/'s and tests/python/'s by their file name, since
those folders are put on sys.path (`import timing`, `from dit_model import DiT`). Every import
counts, a function's deferred one too: deferring an import hides a cycle, it does not remove it.
Imports of anything outside the tree (torch, the extension) are no edges, and neither is a
submodule's import of the package it belongs to (Python initialises a package before its
submodules, so that import names the package being loaded, not a dependency).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

# No native code of its own: it reads source files with `ast`; the sanitized run
# (scripts/sanitize.sh) leaves it out.
pytestmark = pytest.mark.pure_python

ROOT = Path(__file__).resolve().parents[2]
# Each folder, and whether its modules are named by their dotted path below it (a package tree)
# or by their file name (a folder put on sys.path).
SOURCE_DIRS = {"python": True, "bench": False, "tests/python": False}


def module_files(root: Path, source_dirs: Mapping[str, bool]) -> dict[str, Path]:
    """Every module of the tree by the name it is imported as; two files of one name are an
    error, since only one of them can be the module that an import finds."""
    modules: dict[str, Path] = {}
    for folder, dotted in source_dirs.items():
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            if dotted:
                parts = list(path.relative_to(base).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                name = ".".join(parts)
            else:
                if path.parent != base:
                    continue
                name = path.stem
            if name in modules:
                raise ValueError(f"two modules named {name}: {modules[name]} and {path}")
            modules[name] = path
    return modules


def _package_of(name: str, path: Path) -> str:
    """The package a relative import in module `name` starts from."""
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _known(name: str, modules: Iterable[str]) -> str | None:
    """The longest prefix of the dotted `name` that is a module of the tree (importing
    `graphed._native` runs `graphed`), or None when none is."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def imports_of(name: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The tree's modules that module `name` (the file `path`) imports, anywhere in the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _package_of(name, path).split(".")
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            # `from package import submodule` imports the submodule; any other name, the module.
            targets = [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
            targets = [target if target in modules else base for target in targets]
        else:
            continue
        for target in targets:
            known = _known(target, modules)
            if known is not None and known != name and not name.startswith(known + "."):
                found.add(known)
    return found


def import_graph(root: Path, source_dirs: Mapping[str, bool] = SOURCE_DIRS) -> dict[str, set]:
    modules = module_files(root, source_dirs)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None when it has none (depth-first search, in
    sorted order, so the cycle reported is the same on every run)."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path = [start]
        pending = [iter(sorted(graph[start]))]
        while pending:
            following = next(pending[-1], None)
            if following is None:
                done.add(path.pop())
                pending.pop()
            elif following in path:
                return path[path.index(following) :] + [following]
            elif following not in done and following in graph:
                path.append(following)
                pending.append(iter(sorted(graph[following])))
    return None


# -- the tree ---------------------------------------------------------------------------------


def test_the_tree_has_no_import_cycle():
    graph = import_graph(ROOT)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_graph_sees_the_imports_the_tree_is_known_to_make():
    """The checker reads what it should: a bench module importing another by its file name, a
    test importing a bench module, and a relative import inside the package."""
    graph = import_graph(ROOT)
    assert "timing" in graph["host_cost"]
    assert "dit_model" in graph["test_graphed_gpu"]
    assert "graphed._forward" in graph["graphed"]


# -- the checker ------------------------------------------------------------------------------


def test_find_cycle_names_the_cycle_of_a_small_graph():
    graph = {"a": {"b"}, "b": {"c", "d"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c", "d"}, "c": {"d"}, "d": set()}) is None
    assert find_cycle({"a": set(), "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]


def test_a_deferred_import_between_two_files_is_a_cycle(tmp_path: Path):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "first.py").write_text("import second\n")
    (tmp_path / "bench" / "second.py").write_text("def late():\n    from first import x\n")
    graph = import_graph(tmp_path, {"bench": False})
    assert graph == {"first": {"second"}, "second": {"first"}}
    assert find_cycle(graph) == ["first", "second", "first"]


def test_a_package_may_import_its_submodules_and_they_the_package(tmp_path: Path):
    package = tmp_path / "python" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from . import _a\nfrom ._b import thing\n")
    (package / "_a.py").write_text("def f():\n    import pkg\n    from pkg import _b\n")
    (package / "_b.py").write_text("import torch\nthing = 1\n")
    graph = import_graph(tmp_path, {"python": True})
    assert graph == {"pkg": {"pkg._a", "pkg._b"}, "pkg._a": {"pkg._b"}, "pkg._b": set()}
    assert find_cycle(graph) is None
    (package / "_b.py").write_text("from pkg._a import f\n")
    (package / "_a.py").write_text("from ._b import f\n")
    assert find_cycle(import_graph(tmp_path, {"python": True})) == ["pkg._a", "pkg._b", "pkg._a"]


def test_two_modules_of_one_name_are_an_error(tmp_path: Path):
    for folder in ("bench", "tests"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "timing.py").write_text("")
    with pytest.raises(ValueError, match="two modules named timing"):
        import_graph(tmp_path, {"bench": False, "tests": False})


# -- C and C++ includes -----------------------------------------------------------------------

C_FOLDERS = (
    "ops",
    "backends",
    "shim",
    "pyext",
    "tests/core",
    "tests/op",
    "tests/plugin",
    "tests/xpu",
)
C_SUFFIXES = {".c", ".h", ".cc", ".cpp", ".cu"}


def include_graph(root: Path) -> dict[str, set[str]]:
    """The graph of the tree's own `#include "file"` edges among its C, C++ and CUDA files, each
    named by its path below `root`; an include resolves in the including file's folder first,
    then by file name anywhere in the tree (the build's include directories are those folders)."""
    files = [
        path
        for folder in C_FOLDERS
        for path in sorted((root / folder).rglob("*"))
        if path.suffix in C_SUFFIXES
    ]
    by_name: dict[str, list[Path]] = {}
    for path in files:
        by_name.setdefault(path.name, []).append(path)
    graph: dict[str, set[str]] = {}
    for path in files:
        edges = graph.setdefault(str(path.relative_to(root)), set())
        for line in path.read_text(errors="replace").splitlines():
            stripped = line.strip()
            if not stripped.startswith("#include") or '"' not in stripped:
                continue
            included = stripped.split('"')[1]
            beside = path.parent / included
            target = beside if beside.is_file() else None
            if target is None and len(by_name.get(Path(included).name, [])) == 1:
                target = by_name[Path(included).name][0]
            if target is not None:
                edges.add(str(target.resolve().relative_to(root.resolve())))
    return graph


def test_the_tree_has_no_include_cycle():
    cycle = find_cycle(include_graph(ROOT))
    assert cycle is None, "include cycle: " + " -> ".join(cycle)


def test_the_include_graph_sees_an_include_cycle(tmp_path: Path):
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "a.h").write_text('#pragma once\n#include "b.h"\n')
    (tmp_path / "ops" / "b.h").write_text('#pragma once\n#include "a.h"\n')
    (tmp_path / "ops" / "c.c").write_text('#include "a.h"\n')
    graph = include_graph(tmp_path)
    assert graph["ops/c.c"] == {"ops/a.h"}
    assert find_cycle(graph) == ["ops/a.h", "ops/b.h", "ops/a.h"]
