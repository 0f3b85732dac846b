"""Why this exists: what the Python test files share, so that none of them keeps its own copy.

- `backend_choice` and `emulated_backend`: fixtures that load the test plugin's emulated CPU
  backend (_backend_choice.py) and yield its name for the `backend=` of the runners a test
  creates; parametrised indirectly with "failing", its captures fail during the test.
- `fresh_dynamo`: resets Dynamo after a test that compiles (`pytestmark =
  pytest.mark.usefixtures("fresh_dynamo")`): its caches live on the code objects, so a forward an
  earlier test compiled with another backend would count against the recompile limit.
- The repository's bench/ directory on sys.path, so that the GPU tests import the DiT model the
  demo and benchmarks run (bench/dit_model.py) instead of carrying a copy of it; the ranks that
  _ranks.py starts get it on their PYTHONPATH.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import pytest
import torch
from _backend_choice import failing_captures, load_emulated, plugin_missing_reason
from _ranks import BENCH_DIR

if str(BENCH_DIR) not in sys.path:
    sys.path.append(str(BENCH_DIR))


@pytest.fixture
def backend_choice() -> str:
    """Fails the test, instead of erroring obscurely, when the test plugin is not built; yields
    the emulated backend's name (for tests whose ranks load the plugin themselves)."""
    reason = plugin_missing_reason()
    if reason is not None:
        pytest.fail(reason)
    return load_emulated()


@pytest.fixture
def emulated_backend(request: pytest.FixtureRequest, backend_choice: str) -> Iterator[str]:
    """The emulated CPU backend's name, which captures on the CPU, for the `backend=` of the
    runners the test creates; `@pytest.mark.parametrize("emulated_backend", ["failing"],
    indirect=True)` makes its captures fail during the test."""
    mode = getattr(request, "param", "capturing")
    if mode not in ("capturing", "failing"):
        raise ValueError(f"emulated_backend takes 'capturing' or 'failing', got {mode!r}")
    with failing_captures() if mode == "failing" else contextlib.nullcontext():
        yield backend_choice


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """Resets Dynamo after the test (see the module docstring)."""
    yield
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()
