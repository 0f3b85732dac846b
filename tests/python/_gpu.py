"""Why this exists: the one mark of a test of the device itself, for the files that have such tests
beside CPU ones (tests/README.md, "Marks"): selected by `-m gpu`, skipped without CUDA."""

from __future__ import annotations

import pytest
import torch


def on_gpu(test):
    """Marks `test` gpu and skips it where no CUDA device answers."""
    needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
    return pytest.mark.gpu(needs_cuda(test))
