"""graph_regions: the explicit form of regions, for users who know their model's repeated blocks.

GraphedForward finds regions itself when a forward cannot be captured whole (graphed._regions).
Someone who knows the model can name its blocks instead: module classes, or class names, matched
against every submodule (the outermost match wins), or what the model itself declares: diffusers'
`_repeated_blocks` (what `compile_repeated_blocks` compiles) or transformers' `_no_split_modules`
(its decoder-layer classes). Each matched block gets a region GraphedForward, installed as its
instance `forward` until remove(), so calling the model (or a pipeline holding it) graphs the
blocks and runs the rest eagerly; the first call of each block vets it, the second captures.

It lives apart from graphed._regions because it makes GraphedForwards itself, and
graphed._forward imports graphed._regions.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ._forward import GraphedForward
from ._memory import MemoryPool
from ._options import RunnerOptions
from ._regions import Regions

__all__ = ["GraphedRegions", "graph_regions"]


def _block_names(model: torch.nn.Module, blocks: Any) -> tuple[tuple[type, ...], set[str]]:
    """The classes and class names `blocks` names, or the model's own declaration of them."""
    if blocks is None:
        for attribute in ("_repeated_blocks", "_no_split_modules"):
            declared = getattr(model, attribute, None)
            if declared:
                blocks = declared
                break
        else:
            raise ValueError(
                f"graphed: graph_regions found no blocks to graph on {type(model).__name__} "
                "(it declares neither diffusers' _repeated_blocks nor transformers' "
                "_no_split_modules); pass blocks=, module classes or class names"
            )
    if isinstance(blocks, (str, type)):
        blocks = [blocks]
    classes = tuple(block for block in blocks if isinstance(block, type))
    names = {block for block in blocks if isinstance(block, str)}
    if len(classes) + len(names) != len(list(blocks)):
        raise TypeError("graphed: graph_regions' blocks are module classes or class names")
    return classes, names


def _matching(
    model: torch.nn.Module, classes: tuple[type, ...], names: set[str]
) -> list[tuple[str, torch.nn.Module]]:
    """The outermost submodules of one of `classes` or named by `names`, in tree order."""
    found: list[tuple[str, torch.nn.Module]] = []
    for path, module in model.named_modules():
        if not path or any(path.startswith(f"{outer}.") for outer, _ in found):
            continue
        if isinstance(module, classes) or type(module).__name__ in names:
            found.append((path, module))
    return found


class GraphedRegions:
    """The blocks graph_regions graphed: their regions, stats and the way back."""

    def __init__(self, regions: Regions) -> None:
        self._regions: Regions | None = regions

    def regions(self) -> list[dict[str, Any]]:
        """One dict per block (and per submodule of a block that split), as
        GraphedForward.regions() gives them."""
        return [] if self._regions is None else self._regions.describe()

    def stats(self) -> dict[str, int]:
        """The counters of every region's stats() added up (graphs, captures, replays, eager
        calls, bytes), and `regions` and `regions_graphed`: how many there are, and how many
        replay graphs now."""
        regions = self.regions()
        total: dict[str, int] = {
            "regions": len(regions),
            "regions_graphed": sum(entry["state"] == "graphed" for entry in regions),
        }
        for entry in regions:
            for key, value in (entry["stats"] or {}).items():
                if isinstance(value, int) and not isinstance(value, bool):
                    total[key] = total.get(key, 0) + value
        return total

    def reset(self) -> None:
        """Drops every region's graphs; the next call of each captures again."""
        if self._regions is not None:
            for runner in self._regions.runners():
                runner.reset()

    def remove(self) -> None:
        """Puts every block's original forward back; the model runs as it did. Idempotent."""
        if self._regions is not None:
            regions, self._regions = self._regions, None
            regions.remove()


def graph_regions(
    model: torch.nn.Module,
    blocks: Iterable[type | str] | type | str | None = None,
    *,
    device: torch.device | str | int,
    **options: Any,
) -> GraphedRegions:
    """Graphs each block of `model` in a GraphedForward of its own and leaves the rest eager.

    `blocks`: module classes or class names, matched against every submodule (the outermost match
    wins); None reads diffusers' `model._repeated_blocks`, else transformers'
    `model._no_split_modules`, else raises ValueError. `options` are GraphedForward's keyword
    options (name, max_entries, group, verify, churn_limit, memory_pool, ...); the blocks share one
    memory pool (`memory_pool`, or one made here). Warm-up is calling the model: a block's first
    call vets it, its second captures. Returns a GraphedRegions (regions(), stats(), reset(),
    remove())."""
    # Options GraphedForward does not take are refused here, not at each block's first call; the
    # blocks' runners are made from one record of them (graphed._options).
    pool = options.pop("memory_pool", None) or MemoryPool(device)
    bound = inspect.signature(GraphedForward).bind(model, device=device, **options)
    bound.apply_defaults()
    arguments = {key: value for key, value in bound.arguments.items() if key != "module"}
    record = RunnerOptions.of(**arguments)
    classes, names = _block_names(model, blocks)
    found = _matching(model, classes, names)
    if not found:
        wanted = [cls.__name__ for cls in classes] + sorted(names)
        raise ValueError(
            f"graphed: graph_regions found no submodule of {type(model).__name__} of "
            f"{', '.join(wanted)}"
        )
    name = record.name

    def make_runner(block: torch.nn.Module, path: str, forward: Callable) -> GraphedForward:
        copied = dataclasses.replace(record, name=f"{name}/{path}", memory_pool=pool)
        return GraphedForward.from_options(block, copied, forward)

    regions = Regions(
        model,
        make_runner,
        name=name,
        group=record.group,
        device=pool.device,
        found=found,
        permanent=True,
    )
    return GraphedRegions(regions)
