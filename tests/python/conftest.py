"""Why this exists: what the Python test files share, so that none of them keeps its own copy.

- `backend_choice` and `emulated_backend`: fixtures that give the runners a test creates the
  emulated CPU backend (or, parametrised indirectly, another one such as "emulated_fail_capture")
  and restore the load-time backend afterwards, whatever the test did.
- The repository's bench/ directory on sys.path, so that the GPU tests import the DiT model the
  demo and benchmarks run (bench/dit_model.py) instead of carrying a copy of it; the ranks that
  _ranks.py starts get it on their PYTHONPATH.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from _backend_choice import MISSING, backend_choice_available, using_backend
from _ranks import BENCH_DIR

if str(BENCH_DIR) not in sys.path:
    sys.path.append(str(BENCH_DIR))


@pytest.fixture
def backend_choice() -> None:
    """Fails the test, instead of erroring obscurely, when the library cannot switch backends."""
    if not backend_choice_available():
        pytest.fail(MISSING)


@pytest.fixture
def emulated_backend(request: pytest.FixtureRequest, backend_choice: None) -> Iterator[str]:
    """Runners created during the test use the emulated CPU backend, which captures on the CPU;
    `@pytest.mark.parametrize("emulated_backend", [...], indirect=True)` picks another one.
    Yields the backend's name."""
    with using_backend(getattr(request, "param", "emulated")) as name:
        yield name
