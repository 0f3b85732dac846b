"""Why this exists: the child process of test_inputs.py's tensor-kind matrix. It feeds each kind
of tensor it is given through every entry point of graphed, one kind after another in this one
process (a torch import per kind cost more than the kinds themselves), and prints JSON lines as
it goes: one when it starts a kind, one per entry point as it finishes it, and one when the kind is
done. A process abort (a C++ exception crossing extern "C") then shows in the parent as a failed
case naming its kind, the one started and not done, instead of killing the test session; the
parent runs the kinds after it in a new child. Usage: python _tensor_kinds_child.py KIND [KIND ...]
"""

from __future__ import annotations

import json
import sys
from collections import namedtuple

import graphed
import torch
from _backend_choice import EMULATED, load_emulated
from graphed import GraphedForward

Pair = namedtuple("Pair", "first second")


def make(kind: str) -> torch.Tensor:
    base = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    if kind == "sparse_coo":
        return base.to_sparse()
    if kind == "sparse_csr":
        return base.to_sparse_csr()
    if kind == "nested":
        return torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    if kind == "mkldnn":
        return base.to_mkldnn()
    if kind == "meta":
        return torch.empty(2, 3, device="meta")
    if kind == "conj":
        return torch.complex(base, base + 1).conj()
    if kind == "neg":
        return torch._neg_view(base)
    if kind == "zero_size":
        return torch.empty(0, 3)
    if kind == "quantized":
        return torch.quantize_per_tensor(base, 0.1, 0, torch.quint8)
    if kind == "int4":
        return torch.empty(4, dtype=torch.int4)
    if kind == "dims13":
        return torch.zeros([1] * 13)
    if kind == "subclass":

        class Sub(torch.Tensor):
            pass

        return base.as_subclass(Sub)
    if kind == "noncontiguous":
        return base.t()
    return base  # "vmap", "grad" and "plain" start from a plain tensor


def _register_doubling_operator() -> torch.library.Library:
    """The forward operator of the operator entry's runners (as a C++ caller registers one), for
    calls through torch.ops.graphed.forward; registered once per process, kept by the caller."""
    library = torch.library.Library("graphed_kinds_test", "DEF")
    library.define("double(Tensor[] inputs) -> Tensor[]")
    library.impl("double", lambda inputs: [inputs[0] * 2], "CompositeExplicitAutograd")
    return library


def _emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def run_kind(kind: str) -> None:
    """Every entry point with one kind, each on runners of its own (a fresh operator runner too,
    destroyed after the kind), so that no kind sees another's graphs."""
    op_runner = torch.ops.graphed.create(
        "kinds", "graphed_kinds_test::double", torch.device("cpu"), 4, 1, True, backend=EMULATED
    )
    plain = torch.ones(2, 3)
    tensor = make(kind)
    # With the emulated backend a replay returns what the capture wrote, except that an identity
    # forward's output is its static input, which the replay's input copy refreshes: so a first
    # call with zeros of the same dtype and shape captures, and the second shows the bytes the
    # replay copied (a conjugate view must arrive resolved).
    dense = tensor.layout == torch.strided and not tensor.is_meta and kind not in ("int4",)
    dense = dense and not tensor.is_quantized and not tensor.is_nested

    def fresh():
        return GraphedForward(lambda *, x, pair=None: x, device="cpu", backend=EMULATED)

    def entries():
        def fast(t):
            gf = fresh()
            if dense and kind not in ("vmap", "grad"):
                gf(x=torch.zeros(t.shape, dtype=t.dtype))
            return gf(x=t)

        def python(t):
            gf = fresh()
            if dense and kind not in ("vmap", "grad"):
                gf(x=torch.zeros(t.shape, dtype=t.dtype), pair=Pair(1, 2))
            return gf(x=t, pair=Pair(1, 2))

        yield "fast", fast
        yield "python", python
        yield "keep_alive", lambda t: fresh()(x=plain, keep_alive=t)
        yield "keep_alive_python", lambda t: fresh()(x=plain, pair=Pair(1, 2), keep_alive=[t])

        def op(t):
            return torch.ops.graphed.forward(op_runner, "op-key", [t], [], False, False)[0]

        yield "op", op

    for name, call in entries():
        record = {"kind": kind, "entry": name}
        try:
            if kind == "vmap":
                out = torch.vmap(call)(torch.ones(3, 2))
                expected = None
            elif kind == "grad":
                out = torch.func.grad(lambda t, call=call: call(t).sum())(torch.ones(2))
                expected = None
            else:
                out = call(tensor)
                expected = None
                if name.startswith("keep_alive"):
                    expected = plain
                elif dense:
                    expected = tensor.resolve_conj().resolve_neg()
                    if name == "op":
                        expected = expected * 2
            if expected is not None:
                torch.testing.assert_close(out, expected, rtol=0, atol=0)
            record["result"] = "ok"
        except Exception as error:  # noqa: BLE001 - the parent judges every outcome
            record["result"] = type(error).__name__
            record["message"] = str(error).splitlines()[0] if str(error) else ""
        _emit(record)
    torch.ops.graphed.destroy(op_runner)


def main(kinds: list[str]) -> None:
    if not kinds:
        raise SystemExit("usage: python _tensor_kinds_child.py KIND [KIND ...]")
    load_emulated()
    library = _register_doubling_operator()
    for kind in kinds:
        _emit({"kind": kind, "event": "start"})
        run_kind(kind)
        _emit({"kind": kind, "event": "done"})
    del library  # the registration lives until here, past every kind
    assert graphed is not None


if __name__ == "__main__":
    main(sys.argv[1:])
