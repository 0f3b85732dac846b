/* nn.Module's call without the Python it runs to find that it has nothing to do. A module call
 * goes through Module._wrapped_call_impl and self._call_impl, which check for a compiled call, a
 * JIT trace, the module's four hook dicts and the four global ones, and, finding none, call
 * self.forward (torch/nn/modules/module.py, torch 2.11 to 2.14). Verify mode's queue runs the
 * forward eagerly once per compared call (gf_verify_sampled.c); made here in C over the same
 * objects, those checks are a few lookups. Where any of them finds something (torch's two call
 * functions replaced or overridden included), the module is called as it is, so hooks, a compiled
 * call, a trace and a patched call run exactly as they do eagerly.
 *
 * Why it stays, coupled to torch's private call path: on a 2-core x86 host (torch 2.14.1, a
 * Linear(4, 4) on the CPU, emulated backend, best of 5 runs of 100,000 calls) a sampled call
 * (verify_every=1) took 7.6-8.3 us with it and 8.7-9.7 us without it (torch's call taking its own
 * shortest way), 1.0 to 1.5 us of the 5.6 to 6.2 a sampled call adds to a call not verified (2.0);
 * torch's call of the module took 5.1-5.5 us against 4.1-4.3 for its forward. The sampled-call
 * row of bench/host_cost_only.py passed its bound by 0.7 to 2.0 us on an H100 host, so without it
 * that row would miss. What the coupling risks, a check torch adds that this copy skips, is held
 * by the tests that run hooks, a replaced _call_impl and torch's own call through a sampled call
 * (tests/python/test_verify_compare.py). */
#include "gf_module_call.h"

#include "gf_fastcall_torch.h"

#include <string.h>

enum { GF_HOOK_DICTS = 8, GF_OWN_HOOK_DICTS = 4 };

/* The module's own hook dicts, then torch's global ones, in _call_impl's order. */
static const char *const gf_hook_names[GF_HOOK_DICTS] = {
    "_backward_hooks",       "_backward_pre_hooks",        "_forward_hooks",
    "_forward_pre_hooks",    "_global_backward_pre_hooks", "_global_backward_hooks",
    "_global_forward_hooks", "_global_forward_pre_hooks"};

/* What the checks compare with, made once (gf_module_call_names). */
typedef struct gf_module_call_names {
  PyObject *torch_globals; /* torch.nn.modules.module's dict: its global hook dicts */
  PyObject *wrapped_call;  /* torch's own Module._wrapped_call_impl (Module.__call__) */
  PyObject *call_impl;     /* torch's own Module._call_impl */
  PyObject *call, *call_impl_name, *compiled, *forward; /* interned attribute names */
  PyObject *hooks[GF_HOOK_DICTS];                       /* gf_hook_names, interned */
} gf_module_call_names;

static gf_module_call_names gf_names; /* torch_globals set: made */

static void gf_names_clear(gf_module_call_names *names) {
  Py_CLEAR(names->torch_globals);
  Py_CLEAR(names->wrapped_call);
  Py_CLEAR(names->call_impl);
  Py_CLEAR(names->call);
  Py_CLEAR(names->call_impl_name);
  Py_CLEAR(names->compiled);
  Py_CLEAR(names->forward);
  for (int i = 0; i < GF_HOOK_DICTS; ++i) {
    Py_CLEAR(names->hooks[i]);
  }
}

/* Module.__dict__[name] (a new reference) where it is still torch's own function (its qualified
 * name Module.<name>, defined in torch.nn.modules.module), else NULL: a function replaced before
 * the first look leaves the shortcut off for the process. */
static PyObject *gf_torch_function(PyObject *module_type, const char *name) {
  PyObject *attributes = PyObject_GetAttrString(module_type, "__dict__");
  PyObject *function = attributes != NULL ? PyMapping_GetItemString(attributes, name) : NULL;
  Py_XDECREF(attributes);
  PyObject *qualname = function != NULL ? PyObject_GetAttrString(function, "__qualname__") : NULL;
  PyObject *where = function != NULL ? PyObject_GetAttrString(function, "__module__") : NULL;
  const char *text =
      qualname != NULL && PyUnicode_Check(qualname) ? PyUnicode_AsUTF8(qualname) : NULL;
  const int own = text != NULL && strncmp(text, "Module.", 7) == 0 && strcmp(text + 7, name) == 0 &&
                  where != NULL && PyUnicode_Check(where) &&
                  PyUnicode_CompareWithASCIIString(where, "torch.nn.modules.module") == 0;
  Py_XDECREF(qualname);
  Py_XDECREF(where);
  if (!own) {
    Py_CLEAR(function);
  }
  return function;
}

/* 0 when gf_names is made (now or before), -1 when the shortcut is off (no exception left). */
static int gf_names_make(void) {
  if (gf_names.torch_globals != NULL) {
    return 0;
  }
  gf_module_call_names names = {0}; /* made aside, stored whole: the import may switch threads */
  PyObject *module = PyImport_ImportModule("torch.nn.modules.module");
  PyObject *module_type = module != NULL ? PyObject_GetAttrString(module, "Module") : NULL;
  int ok = module_type != NULL;
  if (ok) {
    names.wrapped_call = gf_torch_function(module_type, "_wrapped_call_impl");
    names.call_impl = gf_torch_function(module_type, "_call_impl");
    names.call = PyUnicode_InternFromString("__call__");
    names.call_impl_name = PyUnicode_InternFromString("_call_impl");
    names.compiled = PyUnicode_InternFromString("_compiled_call_impl");
    names.forward = PyUnicode_InternFromString("forward");
    ok = names.wrapped_call != NULL && names.call_impl != NULL && names.call != NULL &&
         names.call_impl_name != NULL && names.compiled != NULL && names.forward != NULL;
  }
  for (int i = 0; ok && i < GF_HOOK_DICTS; ++i) {
    names.hooks[i] = PyUnicode_InternFromString(gf_hook_names[i]);
    ok = names.hooks[i] != NULL;
  }
  if (ok) {
    names.torch_globals = Py_NewRef(PyModule_GetDict(module));
  }
  Py_XDECREF(module_type);
  Py_XDECREF(module);
  PyErr_Clear(); /* the shortcut stays off: the module is called as it is */
  if (!ok || gf_names.torch_globals != NULL) {
    gf_names_clear(&names);
    return ok ? 0 : -1;
  }
  gf_names = names; /* kept for the process */
  return 0;
}

/* 1 when `hooks` (a dict of hooks, as the module or torch keeps them) holds none; 0 for any
 * other object, which torch's truth test would read its own way. */
static int gf_no_hooks(PyObject *hooks) {
  return hooks != NULL && PyDict_Check(hooks) && PyDict_GET_SIZE(hooks) == 0;
}

/* An attribute of `object` as Python reads it (a new reference): NULL with no exception where
 * it has none, NULL with the exception for any other error. */
static PyObject *gf_attribute(PyObject *object, PyObject *name) {
  PyObject *value = PyObject_GetAttr(object, name);
  if (value == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
    PyErr_Clear();
  }
  return value;
}

/* 1 when torch's call of `module` would go straight to self.forward (see the top), 0 when not,
 * -1 with the exception a look raised (as torch's call would have). */
static int gf_goes_straight_to_forward(PyObject *module) {
  PyObject *call = gf_attribute((PyObject *)Py_TYPE(module), gf_names.call);
  int straight = call != NULL && call == gf_names.wrapped_call;
  Py_XDECREF(call);
  PyObject *call_impl = straight ? gf_attribute(module, gf_names.call_impl_name) : NULL;
  straight = call_impl != NULL && PyMethod_Check(call_impl) &&
             PyMethod_GET_FUNCTION(call_impl) == gf_names.call_impl &&
             PyMethod_GET_SELF(call_impl) == module;
  Py_XDECREF(call_impl);
  PyObject *compiled = straight ? gf_attribute(module, gf_names.compiled) : NULL;
  straight = compiled == Py_None; /* a class attribute, until module.compile() sets its own */
  Py_XDECREF(compiled);
  for (int i = 0; straight && i < GF_HOOK_DICTS; ++i) {
    if (i < GF_OWN_HOOK_DICTS) { /* read as torch reads them: self._forward_hooks, ... */
      PyObject *hooks = gf_attribute(module, gf_names.hooks[i]);
      straight = gf_no_hooks(hooks);
      Py_XDECREF(hooks);
    } else {
      straight = gf_no_hooks(PyDict_GetItemWithError(gf_names.torch_globals, gf_names.hooks[i]));
    }
  }
  if (PyErr_Occurred()) {
    return -1;
  }
  return straight && !gf_fastcall_torch_is_tracing();
}

PyObject *gf_module_call_target(PyObject *forward) {
  if (gf_names_make() != 0) {
    return Py_NewRef(forward);
  }
  const int straight = gf_goes_straight_to_forward(forward);
  if (straight < 0) {
    return NULL;
  }
  return straight ? PyObject_GetAttr(forward, gf_names.forward) : Py_NewRef(forward);
}
