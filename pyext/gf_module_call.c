/* nn.Module's call without the Python it runs to find that it has nothing to do. A module call
 * goes through Module._wrapped_call_impl and Module._call_impl, which check for a compiled call,
 * a JIT trace, the module's four hook dicts and the four global ones, and, finding none, call
 * self.forward (torch/nn/modules/module.py, torch 2.11 to 2.14). Verify mode's sampled call runs
 * the forward eagerly once per sample; made here in C over the same objects, those checks are a
 * few dict reads, where torch's Python took 1.0 us of a 3.0 us call of a one-operation module on
 * a 2-core host (a sampled call there went from 5.05-5.10 us to 4.3-4.5). Where any of them finds
 * something, the module is called as it is, so hooks, a compiled call and a trace run exactly as
 * they do eagerly. */
#include "gf_module_call.h"

#include "gf_fastcall_torch.h"

enum { GF_HOOK_DICTS = 8, GF_OWN_HOOK_DICTS = 4 };

/* The module's own hook dicts, then torch's global ones, in _call_impl's order. */
static const char *const gf_hook_names[GF_HOOK_DICTS] = {
    "_backward_hooks",       "_backward_pre_hooks",        "_forward_hooks",
    "_forward_pre_hooks",    "_global_backward_pre_hooks", "_global_backward_hooks",
    "_global_forward_hooks", "_global_forward_pre_hooks"};

/* Looked up once; torch.nn.modules.module is imported by torch itself. */
static PyObject *gf_torch_globals; /* its module dict, whose global hook dicts are read per call */
static PyObject *gf_module_type_call;                               /* torch.nn.Module.__call__ */
static PyObject *gf_call_name, *gf_forward_name, *gf_compiled_name; /* interned attribute names */
static PyObject *gf_hooks[GF_HOOK_DICTS];                           /* gf_hook_names, interned */

static void gf_module_call_forget(void) {
  Py_CLEAR(gf_module_type_call);
  Py_CLEAR(gf_call_name);
  Py_CLEAR(gf_forward_name);
  Py_CLEAR(gf_compiled_name);
  for (int i = 0; i < GF_HOOK_DICTS; ++i) {
    Py_CLEAR(gf_hooks[i]);
  }
}

static int gf_module_call_init(void) {
  if (gf_torch_globals != NULL) {
    return 0;
  }
  PyObject *module = PyImport_ImportModule("torch.nn.modules.module");
  PyObject *module_type = module != NULL ? PyObject_GetAttrString(module, "Module") : NULL;
  int ok = module_type != NULL;
  if (ok) {
    gf_module_type_call = PyObject_GetAttrString(module_type, "__call__");
    gf_call_name = PyUnicode_InternFromString("__call__");
    gf_forward_name = PyUnicode_InternFromString("forward");
    gf_compiled_name = PyUnicode_InternFromString("_compiled_call_impl");
    ok = gf_module_type_call != NULL && gf_call_name != NULL && gf_forward_name != NULL &&
         gf_compiled_name != NULL;
  }
  for (int i = 0; ok && i < GF_HOOK_DICTS; ++i) {
    gf_hooks[i] = PyUnicode_InternFromString(gf_hook_names[i]);
    ok = gf_hooks[i] != NULL;
  }
  if (ok) {
    gf_torch_globals = Py_NewRef(PyModule_GetDict(module)); /* kept for the process */
  } else {
    gf_module_call_forget();
  }
  Py_XDECREF(module_type);
  Py_XDECREF(module);
  return ok ? 0 : -1;
}

/* 1 when `hooks` (a dict of hooks, as the module or torch keeps them) holds none; 0 for any
 * other object, which torch's truth test would read its own way. */
static int gf_no_hooks(PyObject *hooks) {
  return hooks != NULL && PyDict_Check(hooks) && PyDict_GET_SIZE(hooks) == 0;
}

/* 1 when torch's call of `module` would go straight to self.forward (see the top). */
static int gf_goes_straight_to_forward(PyObject *module) {
  PyObject *call = PyObject_GetAttr((PyObject *)Py_TYPE(module), gf_call_name);
  int straight = call != NULL && call == gf_module_type_call;
  Py_XDECREF(call);
  PyObject *compiled = straight ? PyObject_GetAttr(module, gf_compiled_name) : NULL;
  straight = compiled == Py_None; /* a class attribute, until module.compile() sets its own */
  Py_XDECREF(compiled);
  PyObject *own = straight ? PyObject_GenericGetDict(module, NULL) : NULL;
  straight = own != NULL;
  for (int i = 0; straight && i < GF_HOOK_DICTS; ++i) {
    PyObject *hooks = i < GF_OWN_HOOK_DICTS ? own : gf_torch_globals;
    straight = gf_no_hooks(PyDict_GetItemWithError(hooks, gf_hooks[i]));
  }
  Py_XDECREF(own);
  straight = straight && !gf_fastcall_torch_is_tracing();
  PyErr_Clear(); /* a failed look means: call the module as it is */
  return straight;
}

PyObject *gf_module_call_target(PyObject *forward) {
  if (gf_module_call_init() != 0) {
    PyErr_Clear(); /* no torch module to read: the module is called as it is */
    return Py_NewRef(forward);
  }
  if (!gf_goes_straight_to_forward(forward)) {
    return Py_NewRef(forward);
  }
  return PyObject_GetAttr(forward, gf_forward_name);
}
