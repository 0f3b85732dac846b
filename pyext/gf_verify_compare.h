/* Verify mode's comparison queued on the device, as a function of _graphed_fastcall (see
 * gf_verify_compare.c). */
#ifndef GF_VERIFY_COMPARE_H
#define GF_VERIFY_COMPARE_H

#include <Python.h>

#include "gf_tensor.h"

#include <stddef.h>
#include <stdint.h>

enum {
  GF_COMPARE_ERROR = -1,    /* a Python exception is set */
  GF_COMPARE_QUEUED = 0,    /* the device writes the verdict */
  GF_COMPARE_DIFFERS = 1,   /* a pair of other dtypes or shapes: they differ */
  GF_COMPARE_ELSEWHERE = 2, /* queued nothing: compare another way */
};

/* Describes `obj` (a plain tensor) into *out: 0, or -1 for anything else. */
int gf_compare_describe(PyObject *obj, gf_tensor *out);

/* Queues on runner `runner_id`'s device the comparison of got[i] with want[i] (`size` tensors
 * each) by bytes: the device then writes 0 or 1 into `verdict` (a pinned host byte), counting in
 * `scratch_words` (two zeroed 32-bit words of `scratch`'s device); every pair must lie,
 * contiguous, on that device, else GF_COMPARE_ELSEWHERE. *nbytes: the bytes of one side. */
int gf_verify_compare_queue(int64_t runner_id, PyObject *const *got, PyObject *const *want,
                            Py_ssize_t size, uint8_t *verdict, uint32_t *scratch_words,
                            const gf_tensor *scratch, size_t *nbytes);

/* Adds compare_later to the module: 0, or -1 with an exception set. */
int gf_verify_compare_init(PyObject *module);

#endif /* GF_VERIFY_COMPARE_H */
