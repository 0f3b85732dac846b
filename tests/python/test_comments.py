"""Comments and docs name only what exists. A comment that names a function which was renamed or
removed describes a design that is gone, and a newcomer trusts it; this test fails naming the
file, the line and the missing name. It reads every comment of the C, C++, CUDA and Python
sources and every page of docs/ and the top-level Markdown files, takes each backticked `gf_*`
name and each `_fastcall.NAME`, and checks that the name is still defined: a `gf_*` name must
appear in the code itself (outside comments and strings) or be a file's name, a
`_fastcall.NAME` must be in the CPython extension's method table or be one of its module
attributes. This file's own examples are not read.

The maps are checked the same way, by file: every product source file (ops/, backends/, shim/,
pyext/ and python/graphed/; C, C++, CUDA, OpenCL and Python, by the suffixes in MAP_SUFFIXES) is
named in docs/architecture.md, and every tests/python/test_*.py in tests/README.md. A file counts
as named when its file name appears there as a whole word (`gf_cache.c`, `_forward.py`,
`test_tree.py`), its path from the repository root included (`ops/gf_cache.c`); where two listed
files share a file name, only the path names either. The files are those git tracks plus those it
would add (`git ls-files --cached --others --exclude-standard`), so a new file fails the test
before it is committed; outside a git checkout, every file on disk under those folders."""

from __future__ import annotations

import io
import re
import subprocess
import tokenize
from collections import Counter
from pathlib import Path, PurePosixPath

import pytest

# No native code of its own: it reads source and doc files as text; the sanitized run
# (scripts/sanitize.sh) leaves it out.
pytestmark = pytest.mark.pure_python

ROOT = Path(__file__).resolve().parents[2]
SOURCE_FOLDERS = ("ops", "backends", "shim", "pyext", "python", "tests", "bench", "scripts")
C_SUFFIXES = {".c", ".h", ".cc", ".cpp", ".cu"}
DOCS = [*sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("*.md"))]
BACKTICKED = re.compile(r"`[^`\n]*`")
GF_NAME = re.compile(r"\bgf_[A-Za-z0-9_]+")
CALLED = re.compile(r"\b(?:gf_|_fastcall\.)[A-Za-z0-9_.]+\(")
FASTCALL_NAME = re.compile(r"\b_fastcall\.([A-Za-z_][A-Za-z0-9_]*)")
C_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
C_STRING = re.compile(r'"(?:\\.|[^"\\\n])*"')
# The maps: the product's source files in docs/architecture.md, the Python tests in
# tests/README.md.
ARCHITECTURE = ROOT / "docs" / "architecture.md"
TEST_MAP = ROOT / "tests" / "README.md"
MAP_FOLDERS = ("ops", "backends", "shim", "pyext", "python/graphed")
MAP_SUFFIXES = {".c", ".h", ".cc", ".cpp", ".hpp", ".cu", ".cuh", ".cl", ".py", ".pyi"}


def _sources() -> list[Path]:
    files = []
    for folder in SOURCE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in C_SUFFIXES or path.suffix == ".py":
                files.append(path)
    return files


def split_c(text: str) -> tuple[str, list[tuple[int, str]]]:
    """(the code without comments and strings, [(line, comment text)])."""
    comments = [
        (text.count("\n", 0, match.start()) + 1, match.group())
        for match in C_COMMENT.finditer(text)
    ]
    code = C_COMMENT.sub(" ", text)
    return C_STRING.sub('""', code), comments


def split_python(text: str) -> tuple[str, list[tuple[int, str]]]:
    """(the code without comments and strings, [(line, comment or string text)])."""
    code_parts, comments = [], []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type in (tokenize.COMMENT, tokenize.STRING):
                comments.append((token.start[0], token.string))
            else:
                code_parts.append(token.string)
    except (tokenize.TokenError, SyntaxError):
        return text, []
    return " ".join(code_parts), comments


def _split(path: Path) -> tuple[str, list[tuple[int, str]]]:
    text = path.read_text(errors="replace")
    return split_python(text) if path.suffix == ".py" else split_c(text)


def defined_names(codes: list[str]) -> set[str]:
    names: set[str] = set()
    for code in codes:
        names.update(GF_NAME.findall(code))
    return names


def fastcall_names() -> set[str]:
    """What graphed._native._graphed_fastcall exports: its method table and module attributes."""
    names: set[str] = set()
    for path in sorted((ROOT / "pyext").glob("*.c")):
        text = path.read_text()
        names.update(re.findall(r'\{\s*"([A-Za-z_][A-Za-z0-9_]*)"\s*,', text))
        names.update(re.findall(r'PyModule_Add\w*\([^,]+,\s*"([A-Za-z_][A-Za-z0-9_]*)"', text))
    return names


def stale_mentions(
    mentions: list[tuple[str, int, str]], gf_defined: set[str], fastcall_defined: set[str]
) -> list[str]:
    """Each mention (file, line, text) whose backticked names are undefined, as 'file:line: N'."""
    stale = []
    for where, line, text in mentions:
        # Backticked names, and names written as a call (`gf_x()` or gf_x(...)) anywhere.
        for quoted in [*BACKTICKED.findall(text), *CALLED.findall(text)]:
            for name in GF_NAME.findall(quoted):
                if name not in gf_defined and not name.endswith("_"):
                    stale.append(f"{where}:{line}: {name}")
            for name in FASTCALL_NAME.findall(quoted):
                if name not in fastcall_defined:
                    stale.append(f"{where}:{line}: _fastcall.{name}")
    return stale


def _tree_mentions() -> tuple[list[tuple[str, int, str]], set[str]]:
    codes, mentions = [], []
    sources = _sources()
    file_stems = {path.stem for path in sources}
    for folder in SOURCE_FOLDERS:
        file_stems |= {path.name.split(".")[0] for path in (ROOT / folder).rglob("gf_*")}
    for path in sources:
        if path == Path(__file__).resolve():
            continue
        code, comments = _split(path)
        codes.append(code)
        relative = str(path.relative_to(ROOT))
        mentions += [(relative, line, text) for line, text in comments]
    for page in DOCS:
        for number, text in enumerate(page.read_text().splitlines(), start=1):
            mentions.append((str(page.relative_to(ROOT)), number, text))
    return mentions, defined_names(codes) | file_stems


def test_comments_and_docs_name_only_functions_that_exist():
    mentions, gf_defined = _tree_mentions()
    stale = stale_mentions(mentions, gf_defined, fastcall_names())
    assert not stale, "comments or docs name what no longer exists:\n" + "\n".join(stale)


def test_the_check_catches_a_removed_function():
    code, comments = split_c(
        "// `gf_kept` and `gf_removed` do it; `_fastcall.gone` too.\nint gf_kept(void);\n"
    )
    mentions = [("x.c", line, text) for line, text in comments]
    stale = stale_mentions(mentions, defined_names([code]), {"call"})
    assert stale == ["x.c:1: gf_removed", "x.c:1: _fastcall.gone"]


@pytest.mark.parametrize(
    "source",
    ['x = "`gf_in_a_string`"\n', "# `gf_in_a_comment`\n"],
)
def test_python_strings_and_comments_are_not_definitions(source):
    code, comments = split_python(source)
    assert "gf_in_a" not in code
    assert comments


def listed_files(folders: tuple[str, ...]) -> list[str]:
    """The files under `folders` (paths from the root) that git tracks or would add, as the working
    tree has them now: a tracked file deleted there is not listed, an ignored one (a build output)
    never is. Outside a git checkout, every file on disk under them."""
    try:
        listing = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", *folders],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\0")
    except (OSError, subprocess.CalledProcessError):
        listing = [
            path.relative_to(ROOT).as_posix()
            for folder in folders
            for path in (ROOT / folder).rglob("*")
            if "__pycache__" not in path.parts
        ]
    return sorted({path for path in listing if path and (ROOT / path).is_file()})


def _names(page: str, word: str) -> bool:
    """Whether `page` has `word` as a whole file name or path: `gf_cache.c` is not named by
    `gf_cache.cpp`, `gf_cache.c.in`, `my_gf_cache.c` or `ops/gf_cache.*`."""
    return re.search(rf"(?<![\w.-]){re.escape(word)}(?![\w-]|\.\w)", page) is not None


def unnamed_files(paths: list[str], page: str) -> list[str]:
    """The paths that `page` names neither by path nor, where no other path has its file name, by
    file name."""
    counts = Counter(PurePosixPath(path).name for path in paths)
    missing = []
    for path in paths:
        name = PurePosixPath(path).name
        if not _names(page, name if counts[name] == 1 else path):
            missing.append(path)
    return missing


def _map_sources() -> list[str]:
    sources = [
        path for path in listed_files(MAP_FOLDERS) if PurePosixPath(path).suffix in MAP_SUFFIXES
    ]
    empty = [
        folder for folder in MAP_FOLDERS if not any(p.startswith(folder + "/") for p in sources)
    ]
    assert not empty, f"no source file found under {empty}: the listing itself is broken"
    return sources


def test_the_architecture_page_names_every_product_source_file():
    missing = unnamed_files(_map_sources(), ARCHITECTURE.read_text())
    assert not missing, (
        "docs/architecture.md does not name these source files:\n  "
        + "\n  ".join(missing)
        + "\nAdd each to its folder's table under '## Files, layer by layer' in"
        " docs/architecture.md: a python/graphed module as a row saying what it is for (from its"
        " docstring), a C, C++, CUDA or OpenCL file in the row of its header or source, or a row"
        " of its own. A file that moved: change its row there."
    )


def test_the_test_map_names_every_python_test_file():
    tests = [
        path
        for path in listed_files(("tests/python",))
        if re.fullmatch(r"tests/python/test_[^/]*\.py", path)
    ]
    assert tests, "no tests/python/test_*.py found: the listing itself is broken"
    missing = unnamed_files(tests, TEST_MAP.read_text())
    assert not missing, (
        "tests/README.md does not name these test files:\n  "
        + "\n  ".join(missing)
        + "\nAdd a row (subject | file) for each to the table of '## The Python suite' in"
        " tests/README.md; a file that runs children also belongs in 'Tests in child processes'."
    )


def test_a_file_is_named_by_its_path_or_by_a_file_name_no_other_file_has():
    paths = ["ops/gf_a.c", "ops/gf_a.h", "ops/gf_b.cpp", "ops/gf_c.h", "x/_m.py", "y/_m.py"]
    page = "`gf_a.c` and `x/_m.py`; not `_m.py`, gf_b.cpp.in, my_gf_c.h, gf_a.hpp or ops/gf_c.*"
    assert unnamed_files(paths, page) == ["ops/gf_a.h", "ops/gf_b.cpp", "ops/gf_c.h", "y/_m.py"]
