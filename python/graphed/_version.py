"""The version of graphed: the one source of truth, read by pip (scikit-build-core's regex
provider, see pyproject.toml) and by CMake (project version, graphed/_build_info.py)."""

__version__ = "0.3.0"
