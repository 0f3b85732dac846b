"""The layering of the native code, checked from its #include lines: arrows point down only
(pyext -> shim -> backends -> ops), each backend keeps to its own folder, ops/ includes
nothing outside itself, and a folder's private header stays in it. docs/architecture.md has the
table this enforces."""

import re
import sys
from pathlib import Path

import pytest

# No native code of its own: it reads #include lines; the sanitized run (scripts/sanitize.sh)
# leaves it out.
pytestmark = pytest.mark.pure_python

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (".c", ".cc", ".cpp", ".cu", ".h")
# Folder -> the folders whose headers it may include (besides its own).
ALLOWED = {
    "ops": set(),
    "backends/common": {"ops"},
    "backends/cuda": {"ops", "backends/common"},
    "backends/xpu": {"ops", "backends/common"},
    "shim": {"ops", "backends/common", "backends/cuda", "backends/xpu"},
    "pyext": {"ops", "shim", "backends/common"},
    # The test plugin registers into the library's registry; nothing of the product includes it.
    "tests/plugin": {"ops"},
}
# Private header -> the one folder that may include it.
PRIVATE = {
    "gf_runner_internal.h": "ops",
    "gf_warm_up_answer.h": "ops",
    "gf_cuda_torch_internal.h": "backends/cuda",
    "gf_fastcall_torch.h": "pyext",
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def _headers_by_folder() -> dict[str, str]:
    """Header file name -> the folder of ours that holds it."""
    owners = {}
    for folder in ALLOWED:
        for header in (ROOT / folder).glob("*.h"):
            owners[header.name] = folder
    return owners


def _includes(folder: str) -> list[tuple[str, str]]:
    found = []
    for path in sorted((ROOT / folder).iterdir()):
        if path.suffix in SOURCES:
            found += [(path.name, name) for name in INCLUDE.findall(path.read_text())]
    return found


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_folder_includes_only_what_it_may(folder):
    owners = _headers_by_folder()
    wrong = []
    for source, header in _includes(folder):
        owner = owners.get(Path(header).name)
        if owner is None:
            continue  # a system or library header (torch, CUDA, Level Zero, CPython)
        if owner != folder and owner not in ALLOWED[folder]:
            wrong.append(f"{folder}/{source} includes {owner}/{header}")
    assert not wrong, "arrows must point down: " + "; ".join(wrong)


def test_private_headers_stay_in_their_folder():
    wrong = [
        f"{folder}/{source} includes {header}"
        for folder in ALLOWED
        for source, header in _includes(folder)
        if PRIVATE.get(Path(header).name, folder) != folder
    ]
    assert not wrong, "private headers are for their own folder: " + "; ".join(wrong)


def test_core_names_no_platform_library():
    platform_headers = re.compile(r"#\s*include\s+[<\"](ATen|c10|torch|cuda|level_zero|Python)")
    for path in (ROOT / "ops").iterdir():
        if path.suffix in SOURCES:
            assert not platform_headers.search(path.read_text()), path.name


def test_the_check_sees_a_wrong_arrow(tmp_path, monkeypatch):
    """The checker itself: a core file that includes a shim header is reported."""
    fake_root = tmp_path
    for folder in ALLOWED:
        (fake_root / folder).mkdir(parents=True)
    (fake_root / "shim" / "gf_shim_host.h").write_text("")
    (fake_root / "ops" / "gf_runner.c").write_text('#include "gf_shim_host.h"\n')
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake_root)
    with pytest.raises(AssertionError, match="ops/gf_runner.c includes shim/gf_shim_host.h"):
        test_folder_includes_only_what_it_may("ops")


def test_the_check_sees_a_private_header_leave_its_folder(tmp_path, monkeypatch):
    """The checker itself: a shim file that includes the runner's private header is reported."""
    for folder in ALLOWED:
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "shim" / "gf_shim_ops.cpp").write_text('#include "gf_runner_internal.h"\n')
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    with pytest.raises(AssertionError, match="shim/gf_shim_ops.cpp includes gf_runner_internal.h"):
        test_private_headers_stay_in_their_folder()
