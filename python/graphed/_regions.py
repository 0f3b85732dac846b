"""Regions: a forward that cannot be captured whole, graphed in parts.

One synchronizing operation (a `.item()` guard, a `.tolist()` feeding a branch), or anything else
that fails a capture, used to turn a whole runner eager. A module tree says where the capturable
parts are: when a GraphedForward's capture fails (its disabled_reason starts "capture failed"),
its forward runs eagerly from then on, in Python, and each submodule it calls runs through a
GraphedForward of its own (a region), made with the parent's options and one memory pool for the
tree. A region whose own capture fails splits the same way into its children, so the search goes
as deep as it pays; leaf modules (a single Linear or norm: a kernel or two) are never regions,
but under step caches a leaf of the model's own code is (a rotary embedding: tens of kernels).

The candidates are the module's children, descending through containers that are not callable
(nn.ModuleList, nn.ModuleDict). Each gets a `Region`, installed as the child's instance `forward`
(a child compiled in place: its `_compiled_call_impl`, so that the region graphs the compiled
call) once, when the regions are made: nn.Module.__call__ runs the child's hooks eagerly and
calls the Region, which sends the call to the region's GraphedForward while the parent's
regional call is in flight on this thread, and to the original forward otherwise. The region's
GraphedForward calls that original forward (its `_forward_call`), never the child itself, and
watches the child.
The override is installed once, not around each call of the parent: a region's watch checks the
child's `__dict__`, and writing it at every call would make every region compare its whole module
at every call. A child carrying a diffusers step cache's hooks (graphed._step_caches) gets its
Region beneath them instead: in the hook chain's reference to the child's own forward, which the
hooks call when they decide the module computes; the hooks' decisions run in Python at every call,
and a module with such a child below it is looked through, never a region itself. A runner whose
forward carries step caches runs in regions from its first call (disabled_cause "step_cache").

A region's first call runs eagerly and vets the call: its arguments must be keyable and its
output rebuildable (graphed._tree raises TypeError otherwise). One that fails stays eager, with the
reason, and its non-leaf children become regions. From the second call on, calls go through the
region's GraphedForward; a call graphed refuses before the forward was entered (a TypeError or
ValueError for its arguments) makes the region eager and runs the forward eagerly; any error of
the forward itself propagates. With a process group each vetting outcome is agreed (the minimum
over the ranks) so that every rank makes the same choice; the regions' capture outcomes are agreed
by their own runners. The regions come in the same order on every rank, as they follow the same
model code.

Not goals: vetting from several threads at once (a region's first calls should come from one
thread, as a warm-up does); a refusal after vetting is not agreed across a group (it comes from
arguments every rank passes alike).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from . import _arguments
from . import _step_caches as step_caches
from ._memory import MemoryPool
from ._reentry import ReentryDepth
from ._tree import flatten_kwargs, flatten_output

__all__ = [
    "Region",
    "Regions",
    "candidates",
    "say_split",
    "split_into_regions",
    "splits_into_regions",
]

_log = logging.getLogger("graphed")

# What a region is, as regions() says it.
PENDING, GRAPHED, EAGER, SPLIT = "pending", "graphed", "eager", "split"
# The disabled_causes of a runner whose forward cannot be captured whole (ops/gf_disable_cause.h):
# its capture failed, or it carries step caches' hooks (graphed._step_caches).
_CANNOT_BE_CAPTURED = ("capture_failed", "step_cache")


def _is_container(module: torch.nn.Module) -> bool:
    """A module that holds others and is not called itself (nn.ModuleList, nn.ModuleDict)."""
    return getattr(type(module), "forward", None) is torch.nn.Module.forward


def _model_code(module: torch.nn.Module) -> bool:
    """A module whose class is not torch's own (torch.nn's Linear, LayerNorm, Conv...)."""
    return not type(module).__module__.startswith("torch.")


def _has_children(module: torch.nn.Module) -> bool:
    return next(iter(module.children()), None) is not None


def candidates(module: torch.nn.Module, prefix: str = "") -> list[tuple[str, torch.nn.Module]]:
    """The submodules worth a region, by dotted path, in tree order: the children, descending
    through containers, without leaf modules; each module once. A module whose forward calls a
    child other than through the child's `forward` attribute (graph_generation's decode step
    calls the model's forward as bound before it was replaced) names that child in
    REGIONS_LOOK_THROUGH: its children are the candidates, as a container's are. A module carrying
    a step cache's hooks is a candidate, graphed beneath them (graphed._step_caches); one with such
    a module below it is looked through, as its forward holds a hook's decision; a module compiled
    in place that is either is left out, and what it holds with it (`compiled_around`)."""
    found: list[tuple[str, torch.nn.Module]] = []
    seen: set[int] = set()
    above_cached = step_caches.above_cached(module)
    # A compiled module that holds a step cache runs compiled, with no region inside it.
    compiled = step_caches.compiled_around(module)
    if id(module) in compiled:
        return []  # compiled around its caches: it runs as compiled
    # Under step caches the forward's own Python runs eagerly at every call, so a leaf module of
    # the model's own code (a rotary embedding: tens of kernels) is worth a region too.
    own_leaves = bool(above_cached) or step_caches.is_cached(module)

    def visit(parent: torch.nn.Module, path_prefix: str) -> None:
        look_through = getattr(parent, "REGIONS_LOOK_THROUGH", ())
        for name, child in parent.named_children():
            if id(child) in seen or id(child) in compiled:
                continue
            seen.add(id(child))
            path = f"{path_prefix}{name}"
            cached = step_caches.is_cached(child)
            if (
                _is_container(child)
                or name in look_through
                or (id(child) in above_cached and not cached)
            ):
                visit(child, f"{path}.")
            elif _has_children(child) or cached or (own_leaves and _model_code(child)):
                found.append((path, child))

    visit(module, prefix)
    return found


class Region:
    """One submodule graphed on its own (see the module docstring); installed as the submodule's
    instance `forward`. `original` is what `forward` was (an instance override already there, as
    accelerate's hook, or the bound method); `__wrapped__` names it, so that the signature read
    through `module.forward` is the original's."""

    def __init__(self, tree: Regions, path: str, module: torch.nn.Module) -> None:
        self.tree = tree
        self.path = path
        self.module = module
        self.state = PENDING
        self.reason: str | None = None
        self.runner: Any = None
        # Regions of this module's children, when it is refused and stays eager.
        self.inner: Regions | None = None
        # How many times a runner's forward entered the original forward: a call whose runner
        # raised with this unchanged was refused by graphed, before the forward ran.
        self.entered = 0
        self._had_override = "forward" in vars(module)
        # Beneath a step cache's hooks: where their chain holds the module's own forward, which
        # the region replaces there (the hooks keep deciding, in Python); else the module's
        # `forward` attribute, hooks and all.
        self._reference = step_caches.own_forward_reference(module)
        self.beneath_hooks = self._reference is not None
        # Compiled in place (`module.compile()`, diffusers' compile_repeated_blocks): the region
        # takes the slot nn.Module.__call__ consults first and graphs the compiled call, hooks
        # included as compiled; installed as `forward`, it would be traced by the compiler
        # instead, and graph the plain forward.
        self._compiled_slot = self._reference is None and callable(
            vars(module).get("_compiled_call_impl")
        )
        if self._reference is not None:
            self.original = getattr(*self._reference)
        elif self._compiled_slot:
            self.original = vars(module)["_compiled_call_impl"]
        else:
            self.original = module.forward
        self.__wrapped__ = self.original
        # The kwargs a positional call binds to, as the region's GraphedForward binds them.
        names, limit = _arguments.positional_names(module)
        self._bind = functools.partial(_arguments.bind_positional, tree.name, names, limit)

    def install(self) -> None:
        if self._reference is not None:
            setattr(*self._reference, self)
        elif self._compiled_slot:
            self.module._compiled_call_impl = self
        else:
            vars(self.module)["forward"] = self

    def remove(self) -> None:
        """Puts the original forward back (if this Region is still the one installed)."""
        attributes = vars(self.module)
        if self._compiled_slot:
            if attributes.get("_compiled_call_impl") is self:
                self.module._compiled_call_impl = self.original
        elif self._reference is not None:
            if getattr(*self._reference) is self:
                setattr(*self._reference, self.original)
            if attributes.get("forward") is self:  # diffusers removed its hook: the chain's end
                del attributes["forward"]
        elif attributes.get("forward") is self:
            if self._had_override:
                attributes["forward"] = self.original
            else:
                del attributes["forward"]
        for inner in self._inner_regions():
            inner.remove()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tree = self.tree
        if not (tree.permanent or tree.here.level):
            return self.original(*args, **kwargs)  # called from outside the parent's call
        state = self.state
        if state is GRAPHED:
            return self._through_runner(args, kwargs)
        if state is PENDING:
            return self._vet(args, kwargs)
        return self._eagerly(args, kwargs)

    def _entered_forward(self, *args: Any, **kwargs: Any) -> Any:
        """What the region's GraphedForward calls: the original forward, counted."""
        self.entered += 1
        return self.original(*args, **kwargs)

    def _eagerly(self, args: tuple, kwargs: dict) -> Any:
        inner = self.inner
        if inner is None:
            return self.original(*args, **kwargs)
        return inner.run(self.original, args, kwargs)

    def _through_runner(self, args: tuple, kwargs: dict) -> Any:
        entered = self.entered
        try:
            return self.runner(*args, **kwargs)
        except Exception as error:
            if self.entered != entered:
                raise  # the forward's own error
            self._refuse(f"graphed refused its arguments: {error}")
            return self._eagerly(args, kwargs)

    def _vet(self, args: tuple, kwargs: dict) -> Any:
        """The first call: eager, and whether calls like it can be graphed (see the module
        docstring); the outcome is agreed across the group."""
        reason = self._make_runner()
        if reason is None:
            try:
                flatten_kwargs(self._bind(args, kwargs) if args else kwargs)
            except TypeError as error:
                reason = f"its arguments cannot be keyed: {error}"
        result = self.original(*args, **kwargs)
        if reason is None:
            try:
                flatten_output(result)
            except TypeError as error:
                reason = f"its output cannot be rebuilt from a graph: {error}"
        reason = self.tree.agree(reason)
        if reason is None:
            self.state = GRAPHED
        else:
            self._refuse(reason)
        return result

    def _make_runner(self) -> str | None:
        """The region's GraphedForward, made with the tree's options; the refusal otherwise."""
        try:
            self.runner = self.tree.make_runner(self.module, self.path, self._entered_forward)
        except (TypeError, ValueError) as error:
            return f"graphed cannot wrap it: {error}"
        return None

    def _refuse(self, reason: str) -> None:
        """The region stays eager for good; its children become regions of their own."""
        self.state, self.reason = EAGER, reason
        self.runner = None  # its graphs, if any, go with it
        self.inner = self.tree.inner(self.module, self.path)
        _log.info("region '%s' of runner '%s' runs eagerly: %s", self.path, self.tree.name, reason)

    def _inner_regions(self) -> list[Regions]:
        split = self.runner.region_tree if self.runner is not None else None
        return [regions for regions in (self.inner, split) if regions is not None]

    def describe(self) -> dict[str, Any]:
        """This region as regions() lists it."""
        state, reason = self.state, self.reason
        stats = self.runner.stats() if self.runner is not None else None
        if state is GRAPHED and not stats["enabled"]:
            split = self.runner.region_tree is not None
            state, reason = (SPLIT if split else EAGER), stats["disabled_reason"]
        elif state is EAGER and self.inner is not None and self.inner.regions:
            state = SPLIT
        return {"path": self.path, "state": state, "reason": reason, "stats": stats}


class Regions:
    """The regions of one module (see the module docstring). `make_runner(module, path, forward)`
    makes a region's GraphedForward of `module` that runs `forward` (the one the region
    replaced); `permanent` (the explicit form, graphed.graph_regions) routes every
    call of a region through it, else only those made while `run` is in flight on the thread;
    `says` logs one INFO line with the counts once the regions are known."""

    def __init__(
        self,
        module: torch.nn.Module,
        make_runner: Callable[[torch.nn.Module, str, Callable[..., Any]], Any],
        *,
        name: str,
        group: Any = None,
        device: torch.device | None = None,
        found: Iterable[tuple[str, torch.nn.Module]] | None = None,
        permanent: bool = False,
        says: bool = True,
    ) -> None:
        self.make_runner = make_runner
        self.name = name
        self.group = group
        self.device = device
        self.permanent = permanent
        self.here = ReentryDepth()  # open runs of this tree on the thread
        # The states after the latest top-level run, until the regions are known (said once).
        self._last_states: list[str] | None = None
        self._known = says is False
        chosen = candidates(module) if found is None else found
        self.regions = [Region(self, path, child) for path, child in chosen]
        for region in self.regions:
            region.install()

    def run(self, forward: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """forward(*args, **kwargs) with this tree's regions serving the calls it makes."""
        here = self.here
        outermost = here.level == 0
        try:
            with here:
                return forward(*args, **kwargs)
        finally:
            if outermost and not self._known:
                self._say_when_known()

    def inner(self, module: torch.nn.Module, path: str) -> Regions | None:
        """The regions of a refused region's children (None when it has none worth one)."""
        found = candidates(module)
        if not found:
            return None

        def make_runner(child: torch.nn.Module, child_path: str, forward: Callable) -> Any:
            return self.make_runner(child, f"{path}.{child_path}", forward)

        return Regions(
            module,
            make_runner,
            name=self.name,
            group=self.group,
            device=self.device,
            found=found,
            permanent=self.permanent,
            says=False,
        )

    def agree(self, reason: str | None) -> str | None:
        """A vetting outcome every rank of the group shares: refused when any rank refused."""
        if self.group is None:
            return reason
        flag = torch.ones(1, dtype=torch.int32, device=self.device)
        if reason is not None:
            flag.zero_()
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN, group=self.group)
        if reason is None and int(flag.item()) == 0:
            return "another rank of the process group could not graph it"
        return reason

    def describe(self, prefix: str = "") -> list[dict[str, Any]]:
        """Every region of the tree, in tree order, paths from the top module."""
        described: list[dict[str, Any]] = []
        for region in self.regions:
            entry = region.describe()
            entry["path"] = prefix + entry["path"]
            described.append(entry)
            for inner in region._inner_regions():
                described += inner.describe(entry["path"] + ".")
        return described

    def runners(self) -> list[Any]:
        """Every region GraphedForward made so far, nested ones included."""
        made: list[Any] = []
        for region in self.regions:
            if region.runner is not None:
                made.append(region.runner)
            for inner in region._inner_regions():
                made += inner.runners()
        return made

    def remove(self) -> None:
        """Puts every original forward back, nested regions' too. Idempotent."""
        for region in self.regions:
            region.remove()

    def _say_when_known(self) -> None:
        """One INFO line once a run changed no region's state (each reached region vetted and,
        where it could, captured)."""
        states = [entry["state"] for entry in self.describe()]
        if states != self._last_states:
            self._last_states = states
            return
        self._known = True
        counts = {state: states.count(state) for state in (GRAPHED, EAGER, SPLIT, PENDING)}
        _log.info(
            "runner '%s' runs in regions: %d graphed, %d eager, %d split, %d not called",
            self.name,
            counts.get(GRAPHED, 0),
            counts.get(EAGER, 0),
            counts.get(SPLIT, 0),
            counts.get(PENDING, 0),
        )


def splits_into_regions(runner: Any) -> bool:
    """Whether a disabled GraphedForward runs its forward in regions: its capture failed
    (stats()["disabled_cause"]), and its module has a submodule worth a region."""
    module = runner.module
    return (
        runner.stats()["disabled_cause"] in _CANNOT_BE_CAPTURED
        and isinstance(module, torch.nn.Module)
        and bool(candidates(module))
    )


def split_into_regions(runner: Any) -> Regions | None:
    """The regions of a GraphedForward whose forward cannot be captured whole
    (splits_into_regions), made with copies of its options (`runner.options`), or None when it
    does not split (say_split says so). Region runners are of the runner's own class,
    share its memory pool (or one made for the tree), and split the same way."""
    if not splits_into_regions(runner):
        return None
    module = runner.module
    found = candidates(module)
    pool = runner.memory_pool if runner.memory_pool is not None else MemoryPool(runner.device)
    options, runner_class = runner.options, type(runner)

    def make_runner(child: torch.nn.Module, path: str, forward: Callable) -> Any:
        copied = dataclasses.replace(options, name=f"{options.name}/{path}", memory_pool=pool)
        return runner_class.from_options(child, copied, forward)

    regions = Regions(
        module, make_runner, name=runner.name, group=runner.group, device=runner.device, found=found
    )
    weakref.finalize(runner, regions.remove)
    return regions


def say_split(runner: Any) -> None:
    """The one warning of a GraphedForward whose forward now runs in regions
    (splits_into_regions): why, from its disabled_reason."""
    _log.warning(
        "runner '%s': the forward cannot be captured whole (%s); it now runs in regions: its "
        "submodules are graphed one by one and the rest runs eagerly; see .regions()",
        runner.name,
        runner.stats()["disabled_reason"],
    )
