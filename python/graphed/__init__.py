"""graphed: replay captured device graphs of fixed-shape nn.Module forwards (positional arguments
are bound to the forward's parameter names and keyed as keywords).

Importing the package loads the native plugin, which registers `torch.ops.graphed.*`."""

from . import (
    _preflight,  # noqa: F401  (first: a missing or mismatched build is one ImportError)
    _switches,
)
from ._fake import register_fakes as _register_fakes
from ._forward import GraphedForward
from ._generation import GraphedGeneration, graph_generation
from ._graph_regions import GraphedRegions, graph_regions
from ._inventory import inventory
from ._library import backend, library_path, load_library
from ._memory import MemoryPool, memory_table
from ._pipelines import graph_pipeline, ungraph_pipeline
from ._platform import CUDAGraphedForward, XPUGraphedForward, get_graphed_forward_cls
from ._report import report
from ._runner import Runner
from ._seed import clone_static, copy_into, kwargs_signature
from ._tree import flatten_kwargs, unflatten
from ._version import __version__ as __version__
from ._warm_up import warm_up

load_library()
_register_fakes()
_switches.apply_at_import(report)

__all__ = [
    "CUDAGraphedForward",
    "GraphedForward",
    "GraphedGeneration",
    "GraphedRegions",
    "MemoryPool",
    "Runner",
    "XPUGraphedForward",
    "backend",
    "clone_static",
    "copy_into",
    "flatten_kwargs",
    "get_graphed_forward_cls",
    "graph_generation",
    "graph_pipeline",
    "graph_regions",
    "inventory",
    "kwargs_signature",
    "library_path",
    "load_library",
    "memory_table",
    "report",
    "unflatten",
    "ungraph_pipeline",
    "warm_up",
]
