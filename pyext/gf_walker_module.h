/* The walker's functions of _graphed_fastcall (gf_walker_module.c) and the two marker objects the
 * entry points (gf_fastcall.c) share with them. */
#ifndef GF_WALKER_MODULE_H
#define GF_WALKER_MODULE_H

#include <Python.h>

#ifdef __cplusplus
extern "C" {
#endif

extern PyObject *gf_fallback;    /* returned when the fast path does not apply */
extern PyObject *gf_placeholder; /* a tensor slot in an output template */

/* The walked result a plain template holds (borrowed), or NULL for any other template. */
PyObject *gf_walked_of_template(PyObject *template);

/* Makes the marker objects and adds the walker's functions and FALLBACK and PLACEHOLDER to
 * `module`; -1 with a Python error set on failure. */
int gf_walker_module_init(PyObject *module);

#ifdef __cplusplus
}
#endif

#endif /* GF_WALKER_MODULE_H */
