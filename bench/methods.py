"""Every method the benchmark measures, by key, with the label the report and the printed summary
give it, and in the order they show it: one table per workload. It imports nothing, so the
measurements (host_cost.py, dit_request.py), the torch.compile child (compiled.py) and the
driver that merges their figures (run.py) share the labels without importing one another.

A new method is one row here plus the builder of its callable in its workload's module.
"""

from __future__ import annotations

__all__ = ["COMPILED_METHODS", "COMPILE_LABEL", "DIT_METHODS", "HOST_COST_METHODS"]

# The methods the torch.compile child process measures (compiled.py).
COMPILED_METHODS = {
    "compile": "torch.compile reduce-overhead",
    "graphed_compile": "GraphedForward over torch.compile (default, dynamic=False)",
}
# The torch.compile methods together, as skips and sections name them.
COMPILE_LABEL = "torch.compile (reduce-overhead, and GraphedForward over a default compile)"

# Display order and labels of every host-cost method (host_cost.py; compile from the child).
HOST_COST_METHODS = {
    "bare": "bare replay g.replay() (floor)",
    "graphed": "GraphedForward (C fast path)",
    "graphed_changing": "GraphedForward, inputs and outputs at new addresses",
    "graphed_static": "GraphedForward static_outputs=True",
    "graphed_keep_alive": "GraphedForward keep_alive=(t,)",
    "graphed_weights": "GraphedForward, module of 300 parameters (the watch)",
    "graphed_positional": "GraphedForward, same module, xs positional",
    "graphed_cpu_input": "GraphedForward cpu_inputs='to_device', one xs on the CPU",
    "graphed_externals": "GraphedForward, four tensors read from a plain object (externals)",
    "graphed_lora": "GraphedForward, same module, LoRA (peft, rank 16) on 96 projections",
    "graphed_verify_unsampled": "GraphedForward verify_every=2**40 (a call not sampled)",
    "graphed_verify_sampled": "GraphedForward verify_every=1 (every call sampled: eager + compare)",
    "graphed_op": "torch.ops.graphed.forward (pre-flattened)",
    "graphed_python": "GraphedForward, Python path (flatten+op)",
    "seed": "seed Python wrapper",
    "compile": COMPILED_METHODS["compile"],
    "graphed_compile": COMPILED_METHODS["graphed_compile"],
    "passthrough": "empty torch.ops call, same Tensor[]",
    "eager": "eager (one kernel launch)",
}

# Display order and labels of every DiT-request method (dit_request.py; compile from the child).
DIT_METHODS = {
    "eager": "eager",
    "seed": "seed Python wrapper",
    "graphed": "GraphedForward",
    "bare": "bare replay of the model's graph (floor)",
    "compile": COMPILED_METHODS["compile"],
    "graphed_compile": COMPILED_METHODS["graphed_compile"],
}
