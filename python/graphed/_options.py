"""The options a GraphedForward is made with, as one frozen record: checked and resolved once, in
the constructor, and kept whole, so that whatever makes a GraphedForward like another (a region of
it, graphed._regions) copies the record with `dataclasses.replace` instead of re-listing the
constructor's options by hand."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from . import _arguments, _verification
from ._device_hooks import resolve_device
from ._memory import MemoryPool, pool_id_of

__all__ = ["RunnerOptions"]


@dataclasses.dataclass(frozen=True)
class RunnerOptions:
    """Every option of GraphedForward's constructor (docs/api.md gives each in full), checked and
    resolved: `device` with its index, `verification` from verify, verify_tolerance and
    verify_every (None: nothing is compared)."""

    device: torch.device
    max_entries: int = 16
    warmup_iters: int = 2
    group: Any = None
    name: str = "graphed"
    enabled: bool = True
    capture_context: Callable[[], contextlib.AbstractContextManager] | None = None
    backend: str | None = None
    cpu_inputs: str = "refuse"
    verification: _verification.Verification | None = None
    memory_pool: MemoryPool | None = None
    churn_limit: int = 0
    regions: bool = True

    @classmethod
    def of(
        cls,
        *,
        device: torch.device | str | int,
        verify: int | None,
        verify_tolerance: tuple[float, float] | None,
        verify_every: int | None,
        **options: Any,
    ) -> RunnerOptions:
        """The record of a constructor's options, or the ValueError or TypeError that names the
        option that is wrong."""
        _arguments.check_device(device, "GraphedForward")
        _arguments.check_options(
            options["cpu_inputs"],
            options["max_entries"],
            options["warmup_iters"],
            options["capture_context"],
            options["churn_limit"],
        )
        verification = _verification.Verification.of(verify, verify_tolerance, verify_every)
        return cls(
            device=resolve_device(torch.device(device)), verification=verification, **options
        )

    def create_keywords(self) -> dict[str, Any]:
        """The keywords of torch.ops.graphed.create (graphed._ops.create) these options give; the
        group's name aside (graphed._groups)."""
        return {
            "name": self.name,
            "device": self.device,
            "max_entries": self.max_entries,
            "warmup_iters": self.warmup_iters,
            "enabled": self.enabled,
            "backend": self.backend,
            "memory_pool": pool_id_of(self.memory_pool),
            # Staged on the device by the runner's torch-side call itself (shim/gf_shim_call.cpp).
            "cpu_inputs": "to_device" if self.inputs_to_device else "refuse",
            "churn_limit": self.churn_limit,
        }

    @property
    def inputs_to_device(self) -> bool:
        """cpu_inputs="to_device" on a device runner: CPU tensor inputs are copied to the device."""
        return self.cpu_inputs == "to_device" and self.device.type != "cpu"
