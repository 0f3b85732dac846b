/* Verify mode's comparison queued on the device, as a function of _graphed_fastcall (see
 * gf_verify_compare.c). */
#ifndef GF_VERIFY_COMPARE_H
#define GF_VERIFY_COMPARE_H

#include <Python.h>

/* Adds compare_later to the module: 0, or -1 with an exception set. */
int gf_verify_compare_init(PyObject *module);

#endif /* GF_VERIFY_COMPARE_H */
