"""Why this exists: the torch.compile backend the tests of graphed over compiled code share, so that
none keeps its own copy: it records in which of graphed's runs each compile happened, and can
synchronize as inductor's passes do or refuse as a failing compiler does. (The fixture that resets
Dynamo after such a test, `fresh_dynamo`, is in conftest.py.)"""

from __future__ import annotations

import warnings

import torch
from graphed import _phases


class CompilingBackend:
    """A torch.compile backend that runs Dynamo's traced graph as traced (cheap on a 2-core
    machine) and records, per compile, the phase graphed ran the forward for (0: no runner was
    running one). With `syncs` it synchronizes while it compiles (torch's sync-debug warning,
    which graphed's probe counts), as inductor's constant folding does; with `refuse` it fails
    the compile, as a compiler that cannot handle the model does."""

    def __init__(self, *, syncs: bool = False, refuse: bool = False) -> None:
        self.syncs = syncs
        self.refuse = refuse
        self.phases: list[int] = []

    def __call__(self, graph_module, example_inputs):
        self.phases.append(int(torch.ops.graphed.forward_phase()))
        if self.syncs:
            warnings.warn(f"{_phases._SYNC_WARNING} (as inductor's folding does)", stacklevel=1)
        if self.refuse:
            raise NotImplementedError("planted: this backend compiles nothing")
        return graph_module.forward
