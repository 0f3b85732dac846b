"""Why this exists: the one way the Python tests give new runners another backend and go back.

Tests that need a capturing runner on a machine without a GPU borrow the emulated CPU backend
(or "emulated_fail_capture", whose captures fail) for the runners they create, then return to
the load-time default. The `emulated_backend` fixture in conftest.py uses this, and so do the
ranks test_agreement.py starts, which are plain processes without pytest fixtures.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import graphed  # noqa: F401 - loads the library that defines torch.ops.graphed
import torch

MISSING = "torch.ops.graphed.use_backend is missing: the library predates it"


def backend_choice_available() -> bool:
    return hasattr(torch.ops.graphed, "use_backend")


@contextlib.contextmanager
def using_backend(name: str) -> Iterator[str]:
    """Runners created inside the block get the backend `name`; after it, the load-time one."""
    if not backend_choice_available():
        raise RuntimeError(MISSING)
    torch.ops.graphed.use_backend(name)
    try:
        yield name
    finally:
        torch.ops.graphed.use_backend("default")
