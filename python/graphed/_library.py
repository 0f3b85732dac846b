"""Loads the native graphed library once and registers the fake implementations of its operators,
so that `torch.ops.graphed.*` exists as soon as `graphed` is imported and FakeTensor tracing of
code that calls them does not fail. Before anything native is loaded, `check_build()` turns the
two usual install mistakes (a checkout that was never built, a build made for another torch) into
one readable ImportError each."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import torch

_LIBRARY_NAME = "libgraphed_ops.so"
_lock = threading.Lock()
_loaded_path: str | None = None
_checked = False


def _package_dirs() -> list[Path]:
    """The folders of the graphed package: its own, plus those an editable install adds."""
    import graphed

    dirs = [Path(__file__).resolve().parent]
    for entry in getattr(graphed, "__path__", []):
        path = Path(entry).resolve()
        if path not in dirs:
            dirs.append(path)
    return dirs


def native_dir() -> Path | None:
    """The graphed/_native folder that holds the built plugin, or None when there is none."""
    for folder in _package_dirs():
        if (folder / "_native" / _LIBRARY_NAME).exists():
            return folder / "_native"
    return None


def _reinstall_hint() -> str:
    """The command that builds graphed against the running torch, naming this checkout when the
    package is imported from one."""
    checkout = Path(__file__).resolve().parents[2]
    source = str(checkout) if (checkout / "pyproject.toml").is_file() else "<graphed checkout>"
    return f"pip install --no-build-isolation {source}"


def _release(version: str | None) -> str:
    """'2.14.1+cu130' -> '2.14.1': the part of a torch version that fixes its C++ ABI."""
    return str(version).split("+", 1)[0]


def torch_mismatch(build_torch: str, build_cuda: str | None) -> str | None:
    """Why a build made for torch `build_torch` (CUDA `build_cuda`) cannot load into the running
    torch, or None when it can."""
    running, running_cuda = str(torch.__version__), torch.version.cuda
    same_cuda = (build_cuda or None) == (running_cuda or None)
    if _release(build_torch) == _release(running) and same_cuda:
        return None
    return (
        f"graphed was built for torch {build_torch} (CUDA {build_cuda or 'none'}) but this Python "
        f"runs torch {running} (CUDA {running_cuda or 'none'}); its native library only loads "
        "into the torch it was built against. Rebuild it against the running torch: "
        f"{_reinstall_hint()} --force-reinstall --no-deps"
    )


def check_build() -> None:
    """Raises ImportError when the native library is missing or was built for another torch.
    GRAPHED_SKIP_TORCH_CHECK=1 skips the torch comparison (at your own risk)."""
    global _checked
    if _checked:
        return
    if not os.environ.get("GRAPHED_LIBRARY") and native_dir() is None:
        raise ImportError(
            f"graphed's native library is not built; {_reinstall_hint()} "
            "(or set GRAPHED_LIBRARY to a built libgraphed_ops.so)"
        )
    try:
        from . import _build_info
    except ImportError:
        _build_info = None
    if _build_info is not None and os.environ.get("GRAPHED_SKIP_TORCH_CHECK") != "1":
        why = torch_mismatch(_build_info.torch_version, _build_info.torch_cuda)
        if why:
            raise ImportError(why)
    _checked = True


def library_path() -> Path:
    """Where the plugin is: $GRAPHED_LIBRARY, else the build output inside this package."""
    override = os.environ.get("GRAPHED_LIBRARY")
    if override:
        return Path(override)
    folder = native_dir() or Path(__file__).resolve().parent / "_native"
    return folder / _LIBRARY_NAME


def load_library() -> str:
    """Loads the plugin (idempotent) and returns its path."""
    global _loaded_path
    with _lock:
        if _loaded_path is None:
            check_build()
            path = library_path()
            if not path.exists():
                raise ImportError(
                    f"graphed: the native library {path} is missing; {_reinstall_hint()} "
                    "(or set GRAPHED_LIBRARY)"
                )
            torch.ops.load_library(str(path))
            _loaded_path = str(path)
    return _loaded_path


def backend() -> tuple[str, str]:
    """The backend chosen when the library loaded, and why."""
    load_library()
    name, reason = torch.ops.graphed.backend()
    return name, reason
