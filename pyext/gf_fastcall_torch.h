/* What the CPython entry point (pyext/) needs from libtorch, as plain C: recognise tensor and
 * torch leaf objects, describe a tensor without copying, and run one runner call (directly, or
 * through the dispatcher for the Python path) with the call state set, getting the outputs back
 * as new Python tensor objects. Definitions catch every C++ exception and return a status. */
#ifndef GF_FASTCALL_TORCH_H
#define GF_FASTCALL_TORCH_H

#include <Python.h>

#include "gf_call_state.h"
#include "gf_status.h"
#include "gf_tensor.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when obj is exactly a torch.Tensor or an nn.Parameter: a tensor the C entry point takes.
 * Tensor subclasses (FakeTensor, functional wrappers, user subclasses) answer 0 and take the
 * Python path, which goes through the dispatcher where their modes can see the call. */
int gf_fastcall_torch_is_plain_tensor(PyObject *obj);

/* 1 when obj is any tensor, subclasses included. */
int gf_fastcall_torch_is_tensor(PyObject *obj);

/* 1 when obj is exactly a torch.dtype, torch.device, torch.Size, torch.layout or
 * torch.memory_format: torch values that cannot hold a tensor. */
int gf_fastcall_torch_is_plain_leaf(PyObject *obj);

/* A borrowed descriptor of a tensor object, valid while obj lives; 0, or -1 when it has more
 * than GF_MAX_DIMS dimensions. */
int gf_fastcall_torch_describe(PyObject *obj, gf_tensor *out);

/* The tensor object a descriptor from gf_fastcall_torch_describe was made of (a new reference). */
PyObject *gf_fastcall_torch_object_of(const gf_tensor *tensor);

/* The call a runner call puts into a GraphedForward's call state while it holds the runner's
 * lock: `tree` (kwargs dict or TreeSpec) and `key` (bytes). */
typedef struct gf_call_in_flight {
  gf_call_state *state;
  PyObject *tree;
  PyObject *key;
} gf_call_in_flight;

/* The fast path: one call of runner `runner_id` (see gf_runner_call) with inputs the walker
 * described, entered with the GIL held. When another thread holds the runner, the GIL is released
 * while waiting for it, so a forward running in that thread can take the GIL back. On success
 * *outputs is a new list of tensors. */
gf_status gf_fastcall_torch_call(int64_t runner_id, const gf_call_in_flight *call, const void *key,
                                 size_t key_length, gf_tensor *inputs, size_t input_count,
                                 const gf_tensor *keep_alive, size_t keep_alive_count, int pin,
                                 int static_outputs, PyObject **outputs, gf_error *err);

/* The Python path: torch.ops.graphed.forward(runner_id, call->key, inputs, keep_alive, pin,
 * static_outputs) through the dispatcher (so FakeTensor and other modes see it), with the call
 * state set under the runner's lock as gf_fastcall_torch_call sets it. inputs and keep_alive are
 * lists of tensors. A Python exception raised inside is restored as it was. */
gf_status gf_fastcall_torch_call_dispatched(int64_t runner_id, const gf_call_in_flight *call,
                                            PyObject *inputs, PyObject *keep_alive, int pin,
                                            int static_outputs, PyObject **outputs, gf_error *err);

/* Raises the Python exception that matches a failed status (ValueError, TypeError or
 * RuntimeError) and returns NULL. */
PyObject *gf_fastcall_torch_raise(gf_status status, const gf_error *err);

#ifdef __cplusplus
}
#endif

#endif /* GF_FASTCALL_TORCH_H */
