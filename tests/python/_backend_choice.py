"""Why this exists: the one way the Python tests reach the emulated CPU backend.

The emulated backend is no part of the product: it lives in the test plugin
(libgraphed_testing.so, tests/plugin), built with the GoogleTest suites and never installed. Loading
it after graphed registers "emulated" into graphed's backend registry; a runner gets it by naming it
(`GraphedForward(..., backend=EMULATED)`, `graphed.Runner(..., backend=EMULATED)`), and
`failing_captures()` makes its captures fail, as a synchronizing operator or a broken driver would,
and `handing_over_warm_ups()` lets it answer a key's first call from its last warm-up, as CUDA does;
`capturing_run()` and `fail_captures_of(module)` plant such a failure in one module's forward
(on any backend), as a `.item()` the sync probe finds does.
The `emulated_backend` fixture in conftest.py uses this, and so do the ranks the group tests start,
which are plain processes without pytest fixtures.

The plugin is found beside the graphed that was imported, in the build tree it was installed from
(`cmake --install BUILD --prefix BUILD/site`: BUILD/tests/plugin, or one folder deeper), else in
build/wheel, the build scripts/setup.sh packs the tested wheel from; GRAPHED_TESTING_PLUGIN, when
set, names the file itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from pathlib import Path

import graphed
import torch
from graphed import _library, _phases

EMULATED = "emulated"

_ROOT = Path(__file__).resolve().parents[2]
_PLUGIN = "libgraphed_testing.so"
_loaded: ctypes.CDLL | None = None


def _candidates() -> list[Path]:
    if os.environ.get("GRAPHED_TESTING_PLUGIN"):
        return [Path(os.environ["GRAPHED_TESTING_PLUGIN"])]
    build = Path(graphed.__file__).resolve().parents[2]  # BUILD/site/graphed/__init__.py
    near = [build / "tests" / "plugin" / _PLUGIN]
    near += sorted(build.glob(f"*/tests/plugin/{_PLUGIN}"))
    return [*near, _ROOT / "build" / "wheel" / "tests" / "plugin" / _PLUGIN]


def plugin_missing_reason() -> str | None:
    """None when the test plugin can be loaded, else a sentence saying where it was looked for."""
    try:
        load_emulated()
    except RuntimeError as error:
        return str(error)
    return None


def load_emulated() -> str:
    """Loads the test plugin once (after graphed's own library, whose registry it fills) and
    returns the emulated backend's name. RuntimeError, naming where it looked, when it is not
    built."""
    global _loaded
    if _loaded is None:
        _library.load_library()
        candidates = _candidates()
        found = next((path for path in candidates if path.is_file()), None)
        if found is None:
            looked = ", ".join(str(path) for path in candidates)
            raise RuntimeError(
                f"the test plugin {_PLUGIN} is not built (configure with "
                f"-DGRAPHED_BUILD_TESTS=ON); looked in: {looked}"
            )
        _loaded = ctypes.CDLL(str(found))
    return EMULATED


@contextlib.contextmanager
def handing_over_warm_ups() -> Iterator[None]:
    """Inside the block, the first call of a key on the emulated backend may be answered from its
    last warm-up, as on a CUDA device, instead of by a replay (off by default)."""
    load_emulated()
    assert _loaded is not None
    _loaded.gf_emulated_hand_over_warm_ups(1)
    try:
        yield
    finally:
        _loaded.gf_emulated_hand_over_warm_ups(0)


@contextlib.contextmanager
def failing_captures() -> Iterator[None]:
    """Every emulated capture inside the block fails ("emulated capture failure")."""
    load_emulated()
    assert _loaded is not None
    _loaded.gf_emulated_fail_captures(1)
    try:
        yield
    finally:
        _loaded.gf_emulated_fail_captures(0)


def capturing_run() -> bool:
    """Whether graphed runs the forward now to probe it or to capture it (the runs that a
    synchronizing operator fails)."""
    return int(torch.ops.graphed.forward_phase()) in (_phases.PHASE_PROBE, _phases.PHASE_CAPTURE)


def fail_captures_of(module: torch.nn.Module) -> None:
    """Makes `module` fail the probe and the capture, as a synchronizing operator does; its eager
    runs and warm-ups run as before."""

    def refuse(_module, _args):
        if capturing_run():
            raise RuntimeError("planted: this module cannot be captured")

    module.register_forward_pre_hook(refuse)
