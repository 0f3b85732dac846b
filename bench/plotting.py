"""Why this exists: the benchmark's plots (report.py's host cost, audio_pipeline.py's requests,
memory_shapes.py's memory) load matplotlib and save a figure the same way; done here once, so that
a machine without matplotlib skips every plot with the same reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> tuple[Any, str]:
    """(matplotlib.pyplot on the file-only Agg backend, '') or (None, why it cannot be loaded)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        return None, f"matplotlib is not installed ({error})"
    return plt, ""


def save(plt: Any, figure: Any, path: Path) -> tuple[Path, str]:
    """Lays the figure out, writes it at 120 dpi and closes it; (path, '') as the plots return."""
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path, ""
