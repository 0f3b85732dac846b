"""Comments and docs name only what exists. A comment that names a function which was renamed or
removed describes a design that is gone, and a newcomer trusts it; this test fails naming the
file, the line and the missing name. It reads every comment of the C, C++, CUDA and Python
sources and every page of docs/ and the top-level Markdown files, takes each backticked `gf_*`
name and each `_fastcall.NAME`, and checks that the name is still defined: a `gf_*` name must
appear in the code itself (outside comments and strings) or be a file's name, a
`_fastcall.NAME` must be in the CPython extension's method table or be one of its module
attributes. This file's own examples are not read."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

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
