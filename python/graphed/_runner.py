"""graphed.Runner: the operator path as a Python object, for code that has its own forward
operator (a `(Tensor[] inputs) -> Tensor[]` registered with torch.library or TORCH_LIBRARY) and
flattens its inputs itself. It owns one runner of the native core: keys are the caller's
strings, inputs a list of tensors, outputs a list of tensors."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import _arguments, _library, _ops
from ._device_hooks import resolve_device
from ._memory import MemoryPool, pool_id_of


class Runner(_ops.RunnerReports):
    """One runner of `forward_op` ("namespace::name") on `device` (without an index: the current
    device of its kind, as for GraphedForward).

    `forward(key, inputs)` captures a graph the first time a key (with these input dtypes and
    shapes) is seen and replays it afterwards; with no graph-capable device, or after any
    failure, it runs the operator eagerly. Use it as a context manager, or call `close()`, to
    free its graphs and buffers; a closed runner raises ValueError."""

    def __init__(
        self,
        forward_op: str,
        *,
        device: torch.device | str | int,
        max_entries: int = 16,
        warmup_iters: int = 2,
        enabled: bool = True,
        group_agree_op: str | None = None,
        name: str = "runner",
        backend: str | None = None,
        memory_pool: MemoryPool | None = None,
    ) -> None:
        """`memory_pool` (a graphed.MemoryPool of this device) makes the runner's graphs share
        memory with the other runners of that pool; None, the default, gives it a pool of its own.
        Advanced: `backend` names a registered backend for this runner alone (a test plugin's
        "emulated"); None, the default, is the one chosen at load (graphed.backend())."""
        _library.load_library()
        self.forward_op = forward_op
        _arguments.check_device(device, "graphed.Runner")
        self.device = resolve_device(torch.device(device))
        self.name = name
        self._id: int | None = _ops.create(
            name=name,
            forward_op=forward_op,
            device=self.device,
            max_entries=max_entries,
            warmup_iters=warmup_iters,
            enabled=enabled,
            agree_op=group_agree_op,
            backend=backend,
            memory_pool=pool_id_of(memory_pool),
        )
        # A traced call runs the forward operator itself, whose fake implementation gives shapes.
        _ops.register(self._id, self, _ops.operator(forward_op))
        # No graph will run on a device the backend cannot serve, so the core's device check (made
        # on the way to a graph) never would: forward() makes it, as GraphedForward's eager run.
        stats = self.stats()
        self._checks_devices = (
            stats["disabled_cause"] == "unavailable" and self.device.type != "cpu"
        )

    @property
    def runner_id(self) -> int:
        """The id torch.ops.graphed.* take for this runner."""
        if self._id is None:
            raise ValueError(f"graphed: runner '{self.name}' is closed")
        return self._id

    def forward(
        self,
        key: str,
        inputs: list[torch.Tensor],
        *,
        keep_alive: Sequence[torch.Tensor] = (),
        pin: bool = False,
        static_outputs: bool = False,
    ) -> list[torch.Tensor]:
        """Runs the forward operator on `inputs` through a graph keyed by `key` and the inputs'
        dtypes, devices and shapes; returns its outputs (fresh tensors unless static_outputs)."""
        if self._checks_devices:
            for number, tensor in enumerate(inputs):
                why = _arguments.off_device_reason(tensor, self.device, takes_cpu=False)
                if why is not None:
                    raise ValueError(f"graphed: input tensor {number} {why}")
        return torch.ops.graphed.forward(
            self.runner_id, key, list(inputs), list(keep_alive), pin, static_outputs
        )

    def disable(self, reason: str) -> None:
        """Disables graph replay for good; calls run the operator eagerly."""
        torch.ops.graphed.disable(self.runner_id, str(reason))

    def reset(self) -> None:
        """Drops every graph and buffer; the next call of each key captures again."""
        torch.ops.graphed.reset(self.runner_id)

    def close(self) -> None:
        """Frees the runner's graphs and buffers; later calls raise ValueError. Idempotent."""
        if self._id is not None:
            runner_id, self._id = self._id, None
            _ops.destroy(runner_id)

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001  (interpreter shutdown: torch may be gone)
            pass

    def __repr__(self) -> str:
        if self._id is None:
            return f"Runner({self.forward_op!r}, name={self.name!r}, closed)"
        stats = self.stats()
        return (
            f"Runner({self.forward_op!r}, name={self.name!r}, device={self.device}, "
            f"graphs={stats['graphs']}, captures={stats['captures']}, "
            f"replays={stats['replays']}, enabled={stats['enabled']})"
        )
