"""Loads the native graphed library once and registers the fake implementations of its operators,
so that `torch.ops.graphed.*` exists as soon as `graphed` is imported and FakeTensor tracing of
code that calls them does not fail. Before anything native is loaded, `check_build()` turns the
two usual install mistakes (a checkout that was never built, a build made for another torch) into
one readable ImportError each."""

from __future__ import annotations

import importlib
import os
import shlex
import sys
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
    """The command that builds graphed against the running torch, through this Python's pip,
    naming this checkout when the package is imported from one. It installs the build backend
    first: a --no-build-isolation build (the only kind that sees the running torch) does not fetch
    its backend, and the environment may never have had scikit-build-core (a wheel built elsewhere,
    a fresh venv with a newer torch)."""
    checkout = Path(__file__).resolve().parents[2]
    source = (
        shlex.quote(str(checkout))
        if (checkout / "pyproject.toml").is_file()
        else "<graphed checkout>"
    )
    pip = f"{shlex.quote(sys.executable or 'python')} -m pip"
    # With the build backend, the nvcc wheels of the running torch's exact CUDA release: a build
    # for a torch of another CUDA release needs its own nvcc, or it leaves the CUDA backend out.
    wheels = " ".join(nvcc_pins(torch.version.cuda))
    backend = f"scikit-build-core {wheels}".rstrip()
    return f"{pip} install {backend} && {pip} install --no-build-isolation {source}"


# The nvcc wheels from PyPI that make a CUDA toolkit beside torch (site-packages/nvidia/cu<major>),
# pinned to torch's exact CUDA "major.minor": the same as install/nvcc_wheels.py, which the build
# and the README's install block use before graphed exists (tests/python/test_torch_pin.py checks
# that the two agree). The doctor's rebuild command takes them from here too.
NVCC_WHEELS = (
    "nvidia-cuda-nvcc",
    "nvidia-nvvm",
    "nvidia-cuda-crt",
    "nvidia-cuda-cccl",
    "nvidia-cuda-runtime",
)


def cuda_release(cuda: str) -> str:
    """'13.2' of a CUDA version ('13.2', '13.2.51'): the part an nvcc must match."""
    return ".".join(cuda.split(".")[:2])


def nvcc_pins(cuda: str | None) -> list[str]:
    """The nvcc wheels' requirements, quoted for a shell, for torch's CUDA `cuda`; none for a
    torch without CUDA or of CUDA 12 and older, whose wheels have another layout."""
    if not cuda or int(cuda.split(".")[0]) < 13:
        return []
    release = cuda_release(cuda)
    return [shlex.quote(f"{wheel}=={release}.*") for wheel in NVCC_WHEELS]


def nvcc_wheels_command(cuda: str, python: str) -> str | None:
    """The pip command, through `python`'s pip, that installs the nvcc wheels of torch's CUDA
    `cuda` beside torch; None where there are none (nvcc_pins)."""
    pins = nvcc_pins(cuda)
    return f"{shlex.quote(python)} -m pip install {' '.join(pins)}" if pins else None


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
        _build_info = importlib.import_module("graphed._build_info")  # generated by the build
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
