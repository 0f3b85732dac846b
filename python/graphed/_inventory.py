"""What a captured forward reads besides its kwargs and its module, and the host constants it copies
to the device: the capture's inventory (Note [A graph's externals], ops/gf_runner.c).

A graph replays the addresses its capture read. graphed watches what it knows a forward reads
(the kwargs, the module's parameters, buffers, attributes and the tensors its containers hold,
keep_alive tensors), but a forward may also read a tensor from a module global or from a plain
object it holds, and may copy a constant made on the host to the device. While the core probes,
warms up and captures a forward, an InventoryMode is active on that thread: a TorchFunctionMode,
which sees every tensor Python hands to torch and the calls where a host value becomes a device
tensor (`torch.tensor(..., device=)` and indexing by a Python list copy below any dispatch mode).

- Host constants are staged (said once per runner, at INFO). A copy to the device of a CPU
  tensor in pageable memory (`.to(dev)`, `.cuda()`, `copy_`, `torch.tensor` or `torch.as_tensor`
  with a device, indexing a device tensor by a Python list of ints or by a CPU tensor, assigning a
  CPU tensor into one) synchronizes, so a capture refuses it and the sync probe fails on it.
  Each is made from a pinned copy of the host tensor instead, asynchronously; the capture's
  pinned buffers live as long as its graph (the core releases them with it), and every replay
  copies their values again. Such a constant is then fixed per key, as a Python value is: the
  capture's values are compared with its last warm-up's, and one that differs (a host tensor made
  from random numbers or the clock) fails the capture, naming where it was copied. A capture
  without a warm-up before it (warmup_iters=0, not the runner's first) cannot be compared:
  verify mode catches such a value.
- One run records each device tensor passed to torch whose storage is neither an input's, a
  tensor the module's watch follows, a keep_alive tensor's nor one made during that run: an
  external. The core holds each weakly and, before a replay, drops the graph and captures again
  when one was freed (an INFO line names it); the runner warns once, at the first capture that
  found any, which ones and where they were read. The run that records is the first run before
  the capture (the sync probe, or a later key's warm-up), which the capture then follows without
  the mode, unless something that run made outlived it (a cache the forward keeps, which the
  capture would read from outside), it staged a host constant, or the forward runs compiled
  code: then the capture records its own reads, under the mode (Note [One recorded run per
  capture], graphed._phases).

What it cannot see: a tensor that only C++ code reaches (a C++ extension's own state), and an
external re-bound while the old tensor stays alive elsewhere, which the graph keeps reading
(docs/api.md, "What a forward may do"), and a cache kept by code no torch function shows (a
C++ extension's op) that each run replaces: the capture reads the warm-up's, which no run
recorded. Code inductor compiled runs no torch function either, but each compiled graph is handed
what it reads: the recording run notes its inputs where the graph is called
(graphed._compiled.see_compiled_graph_calls). The mode costs Python time per torch call in the
runs before a capture (never on a replay); docs/benchmarks.md gives the first call's figures.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
import warnings
import weakref
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode

from ._compiled import see_compiled_graph_calls
from ._native import _graphed_fastcall as _fastcall
from ._observe import first_few

_log = logging.getLogger("graphed")

# Calls that read a tensor's metadata, not its data: no read of an external.
_METADATA = frozenset(
    "__get__ size dim stride numel nelement ndimension is_contiguous data_ptr element_size "
    "storage_offset untyped_storage get_device is_floating_point is_complex is_pinned __len__ "
    "__repr__ __format__ __hash__ __bool__".split()
)
# Frames inside torch and graphed are not where a forward read or made a tensor, nor is code
# torch.fx generated (a compiled graph run by a backend that runs its torch functions).
_LIBRARY_DIRS = (os.path.dirname(torch.__file__), os.path.dirname(__file__), "<eval_with_key>")
# Nor are the warnings module's, where the sync probe's hook is called from.
_LIBRARY_FILES = (warnings.__file__,)
# Records of the latest captures a runner keeps for inventory().
_RECORDS_KEPT = 64


def user_frame(also: tuple[str, ...] = ()) -> tuple[Any, int]:
    """The innermost frame of this thread outside torch, graphed, the warnings module and the
    folders `also` names (None if there is none), and its stacklevel for a warnings.warn in the
    caller (1: the caller itself)."""
    frame, stacklevel = sys._getframe(1), 1
    folders = _LIBRARY_DIRS + also
    while frame is not None and (
        frame.f_code.co_filename.startswith(folders) or frame.f_code.co_filename in _LIBRARY_FILES
    ):
        frame, stacklevel = frame.f_back, stacklevel + 1
    return frame, stacklevel


def _where() -> tuple[str, Any]:
    """The "file:line" of the innermost frame outside torch and graphed, and that frame."""
    frame = user_frame()[0]
    if frame is None:
        return "an unknown place", None
    return f"{frame.f_code.co_filename}:{frame.f_lineno}", frame


def where_outside_libraries() -> str:
    """The "file:line" of the innermost frame of this thread outside torch and graphed."""
    return _where()[0]


# The torch function this thread's InventoryMode called last, and the names of those that read
# device values on the host or copy host values to the device, for the sync probe's message.
_calling = threading.local()
_HOST_READS = frozenset(
    "item tolist nonzero __bool__ __int__ __float__ __index__ cpu numpy any all equal unique "
    "masked_select repeat_interleave bincount argwhere".split()
)
_HOST_COPIES = frozenset("to cuda copy_ tensor as_tensor __getitem__ __setitem__".split())


def synchronizing_call() -> str:
    """What the torch function the mode called when a synchronization was met is: " (X: a read
    of device values on the host ...)", " (X: a copy from the host that graphed could not
    stage)" or " (X)"."""
    name = getattr(getattr(_calling, "func", None), "__name__", None)
    if name is None:
        return ""
    if name in _HOST_READS:
        return f" ({name}: a read of device values on the host, which no graph can hold)"
    if name in _HOST_COPIES:
        return f" ({name}: a copy from the host that graphed could not stage)"
    return f" ({name})"


def _describe(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}"


def _pageable(value: Any) -> bool:
    """A CPU tensor whose copy to a device would synchronize (not pinned)."""
    return (
        isinstance(value, torch.Tensor)
        and value.device.type == "cpu"
        and value.numel() > 0
        and not value.is_pinned()
    )


def _same_bytes(before: torch.Tensor, now: torch.Tensor) -> bool:
    """Bitwise equality of two CPU tensors of one shape and dtype (NaN equal to itself)."""
    if before.shape != now.shape or before.dtype != now.dtype:
        return False
    return torch.equal(
        before.contiguous().reshape(-1).view(torch.uint8),
        now.contiguous().reshape(-1).view(torch.uint8),
    )


class Staging:
    """The host constants of the runs before one capture: those of the run now going (`current`)
    and of the run before it (`previous`), for the same call key; each a pinned host tensor with
    where it was copied. Buffers no run needs any more are `retired` and let go only when a run
    that is no capture begins: freeing a pinned block records an event on the streams that used
    it, which must not happen while a stream is being captured."""

    def __init__(self) -> None:
        self.key: Any = None
        self.previous: list[tuple[torch.Tensor, str]] = []
        self.current: list[tuple[torch.Tensor, str]] = []
        self.retired: list[list[tuple[torch.Tensor, str]]] = []

    def begin(self, key: Any, capturing: bool) -> None:
        if not capturing:
            self.retired = []
        if key != self.key:
            self.retired.append(self.previous)
            self.key, self.previous = key, []
        self.current = []

    def end(self) -> None:
        self.retired.append(self.previous)
        self.previous, self.current = self.current, []


class _Reads:
    """The device tensors read by the run that records a capture's reads, sorted by storage:
    `known` (inputs and what the module's watch follows), made during that run by a torch
    function, or a candidate external. A candidate is held weakly (its storage, and the tensor or
    the base of the view that was read): one made where no torch function shows it (the buffers
    of code torch.compile generated) is gone once the forward returns, and the forward's outputs
    are not external; what remains then is (externals)."""

    def __init__(self, device_type: str, known: set[int], before_capture: bool) -> None:
        self.device_code = _fastcall.device_type_code(device_type)
        self.known = known
        self.made: set[int] = set()
        self.candidates: dict[int, tuple[StorageWeakRef, weakref.ref, str]] = {}
        # A run before the capture also follows what it makes, weakly: survivors() counts what
        # outlived it.
        self.made_watch = _fastcall.made_watch() if before_capture else None

    def survivors(self, outputs: list[torch.Tensor]) -> int:
        """How many storages this run made are alive after it returned, its outputs left out
        (a run before the capture only)."""
        return _fastcall.survivors(self.made_watch, storages(outputs))

    def externals(self, outputs: list[torch.Tensor]) -> list[tuple[torch.Tensor, str]]:
        """The candidates still alive after the forward returned that are not its outputs'."""
        returned = storages(outputs)
        found = []
        for key, (storage, holder, name) in self.candidates.items():
            tensor = holder()
            if tensor is not None and key not in returned and not storage.expired():
                found.append((tensor, name))
        return found

    def note(self, args: tuple, kwargs: dict, result: Any) -> None:
        """One torch call of the capture: what it read, and what it made (the walk over its
        tensors is the extension's, pyext/gf_inventory_reads.c; a new candidate is named here)."""
        found = _fastcall.note_reads(
            self.device_code,
            self.known,
            self.made,
            self.candidates,
            args,
            kwargs,
            result,
            self.made_watch,
        )
        if found is not None:
            for key, value in found:
                self._candidate(key, value)

    def _candidate(self, key: int, value: torch.Tensor) -> None:
        where, frame = _where()
        name = next(
            (f"global {n}" for n, v in (frame.f_globals if frame else {}).items() if v is value),
            None,
        )
        what = f"{name} ({_describe(value)})" if name else f"a {_describe(value)} tensor"
        holder = value if value._base is None else value._base
        self.candidates[key] = (
            StorageWeakRef(value.untyped_storage()),
            weakref.ref(holder),
            f"{what} read at {where}",
        )


class InventoryMode(TorchFunctionMode):
    """Active while the core runs a forward before or for a capture (see the module docstring):
    stages host constants on the way to `device_type`, and, in the run that records them (`reads`),
    records its reads."""

    def __init__(
        self, device_type: str, staging: Staging, reads: _Reads | None, capturing: bool
    ) -> None:
        super().__init__()
        self.device_type = device_type
        self.staging = staging
        self.reads = reads
        self.capturing = capturing
        self.stages = device_type != "cpu"  # a copy to the CPU never synchronizes

    def __enter__(self) -> InventoryMode:
        # What a graph torch.compile's inductor compiled reads passes no torch function: the
        # recording run sees it where the graph is called (graphed._compiled).
        self._seen_before = see_compiled_graph_calls(
            self._see_graph if self.reads is not None else None
        )
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        see_compiled_graph_calls(self._seen_before)
        super().__exit__(*exc)

    def _see_graph(self, inputs: Any, outputs: Any) -> None:
        self.reads.note((inputs,), {}, outputs)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.compiler.is_compiling():  # traced by torch.compile: the mode compiles to nothing
            return _compiled_call(func, args, kwargs)
        _calling.func = func  # what a synchronization met inside this call is named by
        handler = _HANDLERS.get(func) if self.stages else None
        result = handler(self, func, args, kwargs) if handler is not None else None
        if result is None:
            result = func(*args, **kwargs)
        if self.reads is not None and getattr(func, "__name__", "") not in _METADATA:
            self.reads.note(args, kwargs, result)
        return result

    def stage(self, host: torch.Tensor) -> torch.Tensor:
        """A pinned tensor with host's values: the run before's buffer where it holds the same
        bytes (never written again: a copy from it may still be in flight), else a new one; in a
        capture, a value that differs from the run before's fails it."""
        staging = self.staging
        where = _where()[0]
        n = len(staging.current)
        before = staging.previous[n][0] if n < len(staging.previous) else None
        if before is not None and _same_bytes(before, host):
            pinned = before
        elif before is not None and self.capturing and before.shape == host.shape:
            raise RuntimeError(
                f"graphed: the host tensor ({_describe(host)}) the forward copies to the device "
                f"at {where} differs between runs of one key before its capture (made from "
                "random numbers, the clock or a counter?); a graph would copy the capture's "
                "values at every replay. Make it on the device, pass it as a tensor kwarg, or "
                "leave this module eager"
            )
        else:
            pinned = host.pin_memory()
        staging.current.append((pinned, where))
        return pinned

    def to_device(self, host: torch.Tensor, device: Any, dtype: Any = None) -> torch.Tensor:
        return self.stage(host).to(device=device, dtype=dtype, non_blocking=True)


def _compiled_call(func, args: tuple, kwargs: dict) -> Any:
    """func called as torch.compile traces it inside the mode: a Tensor method written in Python
    (Tensor.unflatten, which calls super()) as the method, since torch 2.11's Dynamo cannot inline
    the function itself ("Attempted to call a super() attribute that is not a function or
    method"); everything else as it is."""
    name = getattr(func, "__name__", None)
    if (
        args
        and isinstance(args[0], torch.Tensor)
        and name
        and getattr(torch.Tensor, name, None) is func
    ):
        return getattr(args[0], name)(*args[1:], **kwargs)
    return func(*args, **kwargs)


def _to(mode: InventoryMode, func, args: tuple, kwargs: dict) -> Any:
    source = args[0]
    if not _pageable(source):
        return None
    device, dtype, _, memory_format = torch._C._nn._parse_to(*args[1:], **kwargs)
    if device is None or device.type != mode.device_type:
        return None
    staged = mode.stage(source)
    if memory_format is None:
        return staged.to(device=device, dtype=dtype, non_blocking=True)
    return staged.to(device=device, dtype=dtype, non_blocking=True, memory_format=memory_format)


def _cuda(mode: InventoryMode, func, args: tuple, kwargs: dict) -> Any:
    if mode.device_type != "cuda" or not _pageable(args[0]):
        return None
    device = args[1] if len(args) > 1 else kwargs.get("device")
    return mode.stage(args[0]).cuda(device, non_blocking=True)


def _copy(mode: InventoryMode, func, args: tuple, kwargs: dict) -> Any:
    target, source = args[0], args[1] if len(args) > 1 else kwargs.get("src")
    if target.device.type != mode.device_type or not _pageable(source):
        return None
    return target.copy_(mode.stage(source), non_blocking=True)


def _factory(mode: InventoryMode, func, args: tuple, kwargs: dict) -> Any:
    device = kwargs.get("device")
    device = torch.get_default_device() if device is None else torch.device(device)
    if device.type != mode.device_type or not args:
        return None
    data = args[0]
    if isinstance(data, torch.Tensor):
        return mode.to_device(data, device, kwargs.get("dtype")) if _pageable(data) else None
    host = func(data, **{**kwargs, "device": "cpu"})
    if host.numel() == 0:
        return None
    result = mode.to_device(host, device)
    return result.requires_grad_() if kwargs.get("requires_grad") else result


def _device_index(mode: InventoryMode, index: Any, device: torch.device) -> Any:
    """The index with each flat Python list of ints (or bools) and each CPU tensor of one
    dimension or more made a device tensor through staging; the same object when none is."""
    if isinstance(index, tuple):
        parts = tuple(_device_index(mode, part, device) for part in index)
        return parts if any(a is not b for a, b in zip(parts, index, strict=True)) else index
    if isinstance(index, list) and index and all(type(item) in (int, bool) for item in index):
        return mode.to_device(torch.tensor(index), device)
    if _pageable(index) and index.dim() > 0:
        return mode.to_device(index, device)
    return index


def _getitem(mode: InventoryMode, func, args: tuple, kwargs: dict) -> Any:
    tensor, index = args[0], args[1]
    if tensor.device.type != mode.device_type:
        return None
    on_device = _device_index(mode, index, tensor.device)
    return None if on_device is index else func(tensor, on_device)


def _setitem(mode: InventoryMode, func, args: tuple, kwargs: dict) -> Any:
    tensor, index, value = args
    if tensor.device.type != mode.device_type:
        return None
    on_device = _device_index(mode, index, tensor.device)
    if type(value) in (int, float, bool) and on_device is not index:
        value = torch.tensor(value, dtype=tensor.dtype)  # torch would copy it from the host
    staged = mode.to_device(value, tensor.device) if _pageable(value) else value
    if on_device is index and staged is value:
        return None
    func(tensor, on_device, staged)
    return tensor  # not None: the assignment is done (Tensor.__setitem__ returns None)


_HANDLERS = {
    torch.Tensor.to: _to,
    torch.Tensor.cuda: _cuda,
    torch.Tensor.copy_: _copy,
    torch.tensor: _factory,
    torch.as_tensor: _factory,
    torch.Tensor.__getitem__: _getitem,
    torch.Tensor.__setitem__: _setitem,
}


class Inventory:
    """One runner's inventories: the staging of its runs before a capture, the records of its
    latest captures (inventory()) and whether its warning was given."""

    def __init__(self, name: str, device_type: str) -> None:
        self.name = name
        self.device_type = device_type
        self.staging = Staging()
        self.records: collections.OrderedDict[Any, dict] = collections.OrderedDict()
        self.warned = False
        self.staging_said = False
        # Whether a run of this runner staged a host constant: only then do its warm-ups run
        # under the mode too (the probe and every capture always do), so that a forward with no
        # host constant pays for the mode in two runs of its first capture and one of a later.
        self.stages_constants = False

    def mode(self, key: Any, known: set[int] | None, capturing: bool) -> InventoryMode:
        """The mode for one run before a capture or for the capture, which records its reads
        when `known` (the storages of its inputs and of what the watch follows) is given."""
        self.staging.begin(key, capturing)
        reads = _Reads(self.device_type, known, not capturing) if known is not None else None
        return InventoryMode(self.device_type, self.staging, reads, capturing)

    def end_run(self) -> list[tuple[torch.Tensor, str]]:
        """After a run under the mode that returned: its staged buffers become the next run's
        `previous`; returns them."""
        staged = self.staging.current
        self.staging.end()
        self.stages_constants = self.stages_constants or bool(staged)
        return staged

    def finish_capture(
        self,
        reads: _Reads,
        call_state: Any,
        inputs: list[torch.Tensor],
        outputs: list[torch.Tensor],
    ) -> None:
        """After the capture's forward returned (given the reads recorded for it, its inputs and
        outputs): its record goes to the core (CallState.record_inventory) and to records, and
        is said once."""
        key = self.staging.key
        staged = self.end_run()
        externals = reads.externals(outputs)
        shapes = ", ".join(_describe(tensor) for tensor in inputs)
        record = {
            "shapes": shapes,
            "externals": [name for _, name in externals],
            "staged": [f"{_describe(t)} copied at {where}" for t, where in staged],
        }
        self.records[(key, shapes)] = record
        self.records.move_to_end((key, shapes))
        while len(self.records) > _RECORDS_KEPT:
            self.records.popitem(last=False)
        call_state.record_inventory(
            [tensor for tensor, _ in externals],
            [name for _, name in externals],
            [tensor for tensor, _ in staged],
        )
        if staged and not self.staging_said:
            self.staging_said = True
            _log.info(
                "runner '%s': the capture staged %d host constant(s) through pinned memory (%s)",
                self.name,
                len(staged),
                first_few(record["staged"], "; "),
            )
        if externals and not self.warned:
            self.warned = True
            _log.warning(
                "runner '%s': its forward reads %d tensor(s) that are neither kwargs nor "
                "module state: %s. graphed checks before each replay that they were not freed "
                "(and captures again if one was), but a tensor re-bound while the old one stays "
                "alive elsewhere keeps being read by the graph: pass such tensors as kwargs or "
                "register them as buffers (docs/api.md, 'What a forward may do')",
                self.name,
                len(externals),
                first_few(record["externals"], "; "),
            )


def storages(tensors: Any) -> set[int]:
    """The storages of the tensors of an iterable, as _Reads keys them."""
    return _fastcall.storage_keys(tensors)


def inventory(graphed_forward: Any) -> list[dict]:
    """What the latest captures of a GraphedForward read besides its kwargs and module state,
    oldest first: for each, the inputs' `shapes`, its `externals` (each tensor described, with
    where the forward first read it; the graph is dropped and captured again when one is freed)
    and the host constants it `staged` (each with where it was copied to the device)."""
    runs = getattr(graphed_forward, "_runs", None)
    if runs is None:
        raise TypeError(
            f"graphed.inventory() takes a GraphedForward, got {type(graphed_forward).__name__}"
        )
    return [dict(record) for record in runs.inventory.records.values()]
