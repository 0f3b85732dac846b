/* _graphed_fastcall.compare_later: verify mode's comparison of a sampled call (graphed._verify)
 * queued on the runner's device in one call, without waiting. It describes each pair of output
 * tensors in place and hands their bytes to the backend's batched comparison
 * (gf_backend.compare_later), whose verdict the device writes into a pinned host byte. On the H200
 * the few torch operations a pair took (a comparison, a reduction and a copy to the host, each
 * launched from Python) cost a sampled call 73 to 115 us on top of its eager forward; one launch
 * costs a few. Apart from the entry points (gf_fastcall.c): one job, its own file. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "gf_backend.h"
#include "gf_fastcall_torch.h"
#include "gf_status.h"
#include "gf_tensor.h"
#include "gf_verify_compare.h"

#include <stdint.h>
#include <stdlib.h>

int gf_compare_describe(PyObject *obj, gf_tensor *out) {
  const char *why = NULL;
  if (!gf_fastcall_torch_is_plain_tensor(obj) ||
      gf_fastcall_torch_describe(obj, out, &why) != GF_DESCRIBE_OK) {
    return -1;
  }
  return 0;
}

/* Fills pairs[*count...] from the lists, adding one side's bytes to *nbytes: GF_COMPARE_QUEUED
 * when every pair can be compared by bytes on one device (empty ones left out),
 * GF_COMPARE_DIFFERS for a pair of other dtypes or shapes, GF_COMPARE_ELSEWHERE for anything the
 * bytes cannot tell (not a plain tensor, not contiguous, another device than the scratch's). */
static int gf_compare_pairs(PyObject *const *got, PyObject *const *want, Py_ssize_t size,
                            const gf_tensor *scratch, gf_copy *pairs, size_t *count,
                            size_t *nbytes) {
  for (Py_ssize_t i = 0; i < size; ++i) {
    gf_copy pair;
    int device_type = 0;
    int device_index = 0;
    if (!gf_fastcall_torch_is_plain_tensor(got[i]) || !gf_fastcall_torch_is_plain_tensor(want[i])) {
      return GF_COMPARE_ELSEWHERE;
    }
    switch (gf_fastcall_torch_byte_pair(got[i], want[i], &pair, &device_type, &device_index)) {
    case GF_BYTE_PAIR_SAME_SHAPE:
      break;
    case GF_BYTE_PAIR_DIFFERS:
      return GF_COMPARE_DIFFERS;
    default:
      return GF_COMPARE_ELSEWHERE;
    }
    if (device_type != scratch->device_type || device_index != scratch->device_index) {
      return GF_COMPARE_ELSEWHERE;
    }
    if (pair.bytes > 0) {
      pairs[(*count)++] = pair;
      *nbytes += pair.bytes;
    }
  }
  return GF_COMPARE_QUEUED;
}

int gf_verify_compare_queue(int64_t runner_id, PyObject *const *got, PyObject *const *want,
                            Py_ssize_t size, uint8_t *verdict, uint32_t *scratch_words,
                            const gf_tensor *scratch, size_t *nbytes) {
  gf_copy few[8]; /* a sampled call's outputs are usually a handful: no allocation */
  gf_copy *pairs = size <= 8 ? few : malloc((size_t)size * sizeof *pairs);
  if (pairs == NULL) {
    PyErr_NoMemory();
    return GF_COMPARE_ERROR;
  }
  size_t count = 0;
  *nbytes = 0;
  int outcome = gf_compare_pairs(got, want, size, scratch, pairs, &count, nbytes);
  if (outcome == GF_COMPARE_QUEUED && count == 0) {
    *verdict = 0; /* nothing to compare: the same */
  } else if (outcome == GF_COMPARE_QUEUED) {
    gf_error err = {0};
    gf_status status =
        gf_fastcall_torch_compare_later(runner_id, pairs, count, verdict, scratch_words, &err);
    if (status == GF_ERR_NOT_FOUND) {
      outcome = GF_COMPARE_ELSEWHERE;
    } else if (status != GF_OK) {
      gf_fastcall_torch_raise(status, &err);
      outcome = GF_COMPARE_ERROR;
    }
  }
  if (pairs != few) {
    free(pairs);
  }
  return outcome;
}

/* compare_later(runner_id, got, want, verdict, scratch) -> True (queued: the device writes 0 or 1
 * into verdict's byte), False (a pair differs in dtype or shape), or None (queued nothing: a pair
 * bytes cannot tell, or a backend that cannot). got and want are lists of tensors of one length;
 * verdict is one byte of pinned host memory, scratch two zeroed int32 on the outputs' device. */
static PyObject *gf_compare_later(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  gf_tensor verdict, scratch;
  if (nargs != 5 || !PyLong_Check(args[0]) || !PyList_CheckExact(args[1]) ||
      !PyList_CheckExact(args[2]) || PyList_GET_SIZE(args[1]) != PyList_GET_SIZE(args[2]) ||
      gf_compare_describe(args[3], &verdict) != 0 || gf_compare_describe(args[4], &scratch) != 0 ||
      gf_tensor_nbytes(&verdict) != 1 || gf_tensor_nbytes(&scratch) != 2 * sizeof(uint32_t)) {
    PyErr_SetString(PyExc_TypeError,
                    "compare_later(runner_id: int, got: list[Tensor], want: list[Tensor] of the "
                    "same length, verdict: a one-byte tensor, scratch: two int32)");
    return NULL;
  }
  const int64_t runner_id = PyLong_AsLongLong(args[0]);
  if (runner_id == -1 && PyErr_Occurred()) {
    return NULL;
  }
  size_t nbytes = 0;
  switch (gf_verify_compare_queue(runner_id, PySequence_Fast_ITEMS(args[1]),
                                  PySequence_Fast_ITEMS(args[2]), PyList_GET_SIZE(args[1]),
                                  verdict.data, scratch.data, &scratch, &nbytes)) {
  case GF_COMPARE_QUEUED:
    Py_RETURN_TRUE;
  case GF_COMPARE_DIFFERS:
    Py_RETURN_FALSE;
  case GF_COMPARE_ELSEWHERE:
    Py_RETURN_NONE;
  default:
    return NULL;
  }
}

static PyMethodDef gf_verify_compare_methods[] = {
    {"compare_later", (PyCFunction)(void (*)(void))gf_compare_later, METH_FASTCALL,
     "compare_later(runner_id, got, want, verdict, scratch) -> True (queued), False (a pair "
     "differs in dtype or shape) or None (compare another way): verify mode's comparison of a "
     "sampled call, queued on the device"},
    {NULL, NULL, 0, NULL},
};

int gf_verify_compare_init(PyObject *module) {
  return PyModule_AddFunctions(module, gf_verify_compare_methods);
}
