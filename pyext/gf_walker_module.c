/* The walker of plain trees (gf_walker.c) as functions of _graphed_fastcall, for the Python layer
 * and for tests: the walk `call` makes (flatten), the decode of a key, the one tensor check
 * (refusal), and a plain result's output template and its rebuild. Apart from the entry points
 * (gf_fastcall.c), which share its two marker objects. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "gf_fastcall_torch.h"
#include "gf_tensor.h"
#include "gf_walker.h"
#include "gf_walker_module.h"

PyObject *gf_fallback;
PyObject *gf_placeholder;

/* The walked result a plain template holds (borrowed), or NULL for any other template: a plain
 * template is a 1-tuple (output_template), which no other kind of template is (graphed._tree's
 * are TreeSpecs). */
PyObject *gf_walked_of_template(PyObject *template) {
  return PyTuple_CheckExact(template) && PyTuple_GET_SIZE(template) == 1
             ? PyTuple_GET_ITEM(template, 0)
             : NULL;
}

/* refusal(tensor) -> None | (exception type, reason): the check every path makes of a tensor
 * (gf_tensor_refused), for the Python path's walk and keep_alive. */
static PyObject *gf_refusal(PyObject *self, PyObject *tensor) {
  (void)self;
  if (!gf_fastcall_torch_is_tensor(tensor)) {
    PyErr_SetString(PyExc_TypeError, "_graphed_fastcall.refusal(tensor)");
    return NULL;
  }
  gf_tensor described;
  PyObject *type = NULL;
  char reason[GF_WALK_REASON_CAPACITY];
  if (!gf_tensor_refused(tensor, &described, &type, reason, sizeof reason)) {
    Py_RETURN_NONE;
  }
  return Py_BuildValue("(Os)", type, reason);
}

/* decode(key, tensors) -> the kwargs of a fast-path key with tensors in its tensor slots. */
static PyObject *gf_decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 2 || !PyBytes_Check(args[0]) || !PyList_CheckExact(args[1])) {
    PyErr_SetString(PyExc_TypeError, "_graphed_fastcall.decode(key: bytes, tensors: list)");
    return NULL;
  }
  return gf_walk_decode((const unsigned char *)PyBytes_AS_STRING(args[0]),
                        (size_t)PyBytes_GET_SIZE(args[0]), args[1]);
}

/* flatten(kwargs, variant) -> (key bytes, [tensors]) | FALLBACK: what `call` would hand the core.
 */
static PyObject *gf_flatten(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 2 || !PyDict_CheckExact(args[0])) {
    PyErr_SetString(PyExc_TypeError, "_graphed_fastcall.flatten(kwargs: dict, variant)");
    return NULL;
  }
  gf_walk walk = {0};
  PyObject *flat = NULL;
  gf_walk_result result = gf_walk_kwargs(&walk, args[0], args[1]);
  if (result == GF_WALK_UNSUPPORTED) {
    flat = Py_NewRef(gf_fallback);
  } else if (result == GF_WALK_OK) {
    PyObject *tensors = PyList_New((Py_ssize_t)walk.tensor_count);
    for (size_t i = 0; tensors != NULL && i < walk.tensor_count; ++i) {
      PyObject *tensor = gf_fastcall_torch_object_of(&walk.tensors[i]);
      if (tensor == NULL) {
        Py_CLEAR(tensors);
        break;
      }
      PyList_SET_ITEM(tensors, (Py_ssize_t)i, tensor);
    }
    if (tensors != NULL) {
      flat = Py_BuildValue("(y#N)", (const char *)walk.key, (Py_ssize_t)walk.key_length, tensors);
    }
  }
  gf_walk_free(&walk);
  return flat;
}

/* output_template(result) -> (template, [tensors]) for a plain result, else None. */
static PyObject *gf_output_template(PyObject *self, PyObject *result) {
  (void)self;
  PyObject *template = NULL;
  PyObject *tensors = NULL;
  switch (gf_walk_output_template(result, gf_placeholder, &template, &tensors)) {
  case GF_WALK_OK:
    return Py_BuildValue("((N)N)", template, tensors);
  case GF_WALK_UNSUPPORTED:
    Py_RETURN_NONE;
  default:
    return NULL;
  }
}

/* rebuild(template, outputs) -> the output a plain template (from output_template) stands for. */
static PyObject *gf_rebuild(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  PyObject *walked = nargs == 2 ? gf_walked_of_template(args[0]) : NULL;
  if (walked == NULL || !PyList_CheckExact(args[1])) {
    PyErr_SetString(PyExc_TypeError,
                    "_graphed_fastcall.rebuild(template: a plain template, outputs: list)");
    return NULL;
  }
  return gf_walk_rebuild(walked, gf_placeholder, args[1]);
}

/* walked_of(template) -> the walked result a plain template holds, or None for any other. */
static PyObject *gf_walked_of(PyObject *self, PyObject *template) {
  (void)self;
  PyObject *walked = gf_walked_of_template(template);
  return Py_NewRef(walked != NULL ? walked : Py_None);
}

static PyMethodDef gf_walker_methods[] = {
    {"refusal", gf_refusal, METH_O,
     "refusal(tensor) -> None when graphed takes it, else (TypeError or ValueError, the end of a "
     "sentence saying why)"},
    {"decode", (PyCFunction)(void (*)(void))gf_decode, METH_FASTCALL,
     "decode(key, tensors) -> the kwargs a fast-path key stands for"},
    {"flatten", (PyCFunction)(void (*)(void))gf_flatten, METH_FASTCALL,
     "flatten(kwargs, variant) -> (key bytes, [tensors]) or FALLBACK: the walk of `call`"},
    {"output_template", (PyCFunction)gf_output_template, METH_O,
     "output_template(result) -> (template, [tensors]) for a plain result, else None"},
    {"rebuild", (PyCFunction)(void (*)(void))gf_rebuild, METH_FASTCALL,
     "rebuild(template, outputs) -> the output a plain template stands for"},
    {"walked_of", gf_walked_of, METH_O,
     "walked_of(template) -> the walked result a plain template holds, or None for any other"},
    {NULL, NULL, 0, NULL},
};

int gf_walker_module_init(PyObject *module) {
  gf_fallback = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
  gf_placeholder = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
  if (gf_fallback == NULL || gf_placeholder == NULL ||
      PyModule_AddFunctions(module, gf_walker_methods) != 0 ||
      PyModule_AddObjectRef(module, "FALLBACK", gf_fallback) != 0 ||
      PyModule_AddObjectRef(module, "PLACEHOLDER", gf_placeholder) != 0) {
    return -1;
  }
  return 0;
}
