"""Loads the native graphed library once and registers the fake implementations of its operators,
so that `torch.ops.graphed.*` exists as soon as `graphed` is imported and FakeTensor tracing of
code that calls them does not fail."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import torch

_LIBRARY_NAME = "libgraphed_ops.so"
_lock = threading.Lock()
_loaded_path: str | None = None


def library_path() -> Path:
    """Where the plugin is: $GRAPHED_LIBRARY, else the build output inside this package."""
    override = os.environ.get("GRAPHED_LIBRARY")
    if override:
        return Path(override)
    return Path(__file__).resolve().parent / "_native" / _LIBRARY_NAME


def load_library() -> str:
    """Loads the plugin (idempotent) and returns its path."""
    global _loaded_path
    with _lock:
        if _loaded_path is None:
            path = library_path()
            if not path.exists():
                raise ImportError(
                    f"graphed: the native library {path} is missing; build it with "
                    "`cmake -S . -B build && cmake --build build` (or set GRAPHED_LIBRARY)"
                )
            torch.ops.load_library(str(path))
            _loaded_path = str(path)
    return _loaded_path


def backend() -> tuple[str, str]:
    """The backend chosen when the library loaded, and why."""
    load_library()
    name, reason = torch.ops.graphed.backend()
    return name, reason
