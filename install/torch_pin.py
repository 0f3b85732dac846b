"""Why this exists: graphed's native library only loads into the torch it was compiled against, so
the built package must name that torch, exactly, as its dependency: then pip, installing graphed
or anything beside it, finds the requirement already met and never swaps the user's torch for
another release (a range such as "torch>=2.11,<2.15" let pip replace a torch 2.15 that graphed had
just been built against with 2.14.1, and graphed then failed at import). This is a dynamic-metadata
provider of scikit-build-core (pyproject.toml: tool.scikit-build.metadata.dependencies): it runs
before anything is compiled, so a torch graphed does not support, or none at all (an isolated build,
which sees no torch), is refused there, with what to do, and not found at import.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from importlib import metadata
from typing import Any

# The torch releases graphed supports: 2.11 up to, not including, 2.16 (the README says the same).
OLDEST = (2, 11)
NEWEST = (2, 15)


def _release(version: str) -> tuple[int, int]:
    """(2, 15) of '2.15.0+cu132'; (0, 0) where the version is not numbered so."""
    parts = version.split("+", 1)[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def torch_requirement() -> str:
    """'torch==<the installed torch's version>', or a RuntimeError saying why graphed cannot be
    built against the torch this Python has."""
    if importlib.util.find_spec("torch") is None:
        raise RuntimeError(
            "graphed: this Python has no torch to build against. graphed compiles against the "
            "torch of the environment it is installed into: install torch there first (any "
            f"{OLDEST[0]}.{OLDEST[1]} to {NEWEST[0]}.{NEWEST[1]}), then build without isolation "
            "(an isolated build sees no torch): pip install --no-build-isolation ."
        )
    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError as error:
        raise RuntimeError(
            "graphed: torch imports here but pip has no record of it (no torch-*.dist-info), so "
            "the built package could not name the torch it was built for; install torch with pip"
        ) from error
    if not OLDEST <= _release(version) <= NEWEST:
        raise RuntimeError(
            f"graphed: this environment has torch {version}; graphed supports torch "
            f"{OLDEST[0]}.{OLDEST[1]} to {NEWEST[0]}.{NEWEST[1]}. Install one of those first "
            f"(pip install 'torch>={OLDEST[0]}.{OLDEST[1]},<{NEWEST[0]}.{NEWEST[1] + 1}'), then "
            "build graphed again; nothing was compiled"
        )
    return f"torch=={version}"


def dynamic_metadata(field: str, settings: Mapping[str, Any] | None = None) -> list[str]:
    if field != "dependencies":
        raise RuntimeError(f"torch_pin provides 'dependencies' only, not {field!r}")
    if settings:
        raise RuntimeError(f"torch_pin takes no settings (got {sorted(settings)})")
    return [torch_requirement()]
