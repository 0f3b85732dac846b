/* What the CPython entry point (pyext/) needs from libtorch, as plain C: recognise a tensor
 * object, describe it without copying, and run one runner call, getting the outputs back as new
 * Python tensor objects. Definitions catch every C++ exception and return a status. */
#ifndef GF_FASTCALL_TORCH_H
#define GF_FASTCALL_TORCH_H

#include <Python.h>

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

/* A borrowed descriptor of a tensor object, valid while obj lives; 0, or -1 when it has more
 * than GF_MAX_DIMS dimensions. */
int gf_fastcall_torch_describe(PyObject *obj, gf_tensor *out);

/* What the forward operator needs to know about the call in flight: state[0] and state[1] are set
 * to kwargs and key while the runner's lock is held, and put back afterwards. */
typedef struct gf_fastcall_in_flight {
  PyObject *state; /* a list of 4, see pyext/gf_fastcall.c */
  PyObject *kwargs;
  PyObject *key;
} gf_fastcall_in_flight;

/* One call of runner `runner_id` (see gf_runner_call), entered with the GIL held. When another
 * thread holds the runner, the GIL is released while waiting for it, so a forward running in that
 * thread can take the GIL back. On success *outputs is a new list of tensors. */
gf_status gf_fastcall_torch_call(int64_t runner_id, const gf_fastcall_in_flight *call,
                                 const void *key, size_t key_length, gf_tensor *inputs,
                                 size_t input_count, const gf_tensor *keep_alive,
                                 size_t keep_alive_count, int pin, int static_outputs,
                                 PyObject **outputs, gf_error *err);

/* Raises the Python exception that matches a failed status (ValueError, TypeError or
 * RuntimeError) and returns NULL. */
PyObject *gf_fastcall_torch_raise(gf_status status, const gf_error *err);

#ifdef __cplusplus
}
#endif

#endif /* GF_FASTCALL_TORCH_H */
