/* An nn.Module called the way torch's own call takes its shortest way (see gf_module_call.c),
 * for verify mode's sampled calls (gf_verify_sampled.c). */
#ifndef GF_MODULE_CALL_H
#define GF_MODULE_CALL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What to call for `forward` (a new reference): its bound `forward` where `forward` is an
 * nn.Module whose call would find nothing to do before it (torch's own __call__ and _call_impl, no
 * hooks of its own or global, not compiled, no JIT trace in progress), else `forward` itself;
 * NULL with the exception a look raised other than AttributeError (which the module's call would
 * have raised too). */
PyObject *gf_module_call_target(PyObject *forward);

#ifdef __cplusplus
}
#endif

#endif /* GF_MODULE_CALL_H */
