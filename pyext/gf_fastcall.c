/* graphed._native._graphed_fastcall: the CPython entry points of GraphedForward, in C. A torch.ops
 * call spends about 0.45 us per tensor parsing its arguments and a Python walk of the kwargs a few
 * more, while a graph launch costs about 3 us; `call` walks the kwargs with the CPython API
 * (pyext/gf_walker.c), builds the non-tensor key as bytes, describes each tensor in place and
 * enters the runner once.
 *
 * `call` takes plain kwargs: exact dict (str keys), list and tuple containers, exact tensors, and
 * None/bool/int/float/str leaves, with a variant of those leaf types. Anything else returns the
 * FALLBACK object; the Python layer then flattens the kwargs itself (graphed._tree.flatten_kwargs,
 * keys starting with 'V', never 'F') and enters through `call_flat`, which calls the
 * graphed::forward operator through the dispatcher so that FakeTensor and other modes see it.
 *
 * The walker is the truth for plain trees: the forward operator the core calls back (for probe,
 * warm-up, capture or eager runs) rebuilds plain kwargs with `substitute`, records a plain
 * result's template with `output_template`, and both entries rebuild a plain output in C; only
 * trees the walker does not take go through graphed._tree. `flatten` shows the walk to tests.
 *
 * The call in flight is a CallState (pyext/gf_call_state.h), one per GraphedForward, which both
 * entries set while they hold the runner's lock (pyext/gf_fastcall_torch.cpp):
 *   tree       the kwargs dict (`call`) or TreeSpec (`call_flat`) of the call in flight, or None
 *   key        the key of that call, as bytes
 *   templates  dict: key bytes -> output template, recorded by the forward operator: a 1-tuple
 *              (the result with PLACEHOLDER in each tensor slot) for a plain result, which this
 *              module rebuilds, or anything else, rebuilt by calling
 *   rebuild    (given to the constructor) rebuild(template, outputs). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "gf_call_state.h"
#include "gf_fastcall_torch.h"
#include "gf_walker.h"

#include <stdint.h>
#include <stdlib.h>

/* Reused across calls (the GIL serialises them); a call made from inside a forward that graphed
 * is capturing or running eagerly gets a walk of its own. */
static gf_walk gf_scratch;
static int gf_calls_in_flight;
static PyObject *gf_fallback;    /* returned when the fast path does not apply */
static PyObject *gf_placeholder; /* a tensor slot in an output template */

/* -- CallState --------------------------------------------------------------------------- */

static PyObject *gf_call_state_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  PyObject *rebuild = NULL;
  static char *names[] = {"rebuild", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:CallState", names, &rebuild)) {
    return NULL;
  }
  if (!PyCallable_Check(rebuild)) {
    PyErr_SetString(PyExc_TypeError, "CallState(rebuild): rebuild must be callable");
    return NULL;
  }
  gf_call_state *state = (gf_call_state *)type->tp_alloc(type, 0);
  if (state == NULL) {
    return NULL;
  }
  state->tree = Py_NewRef(Py_None);
  state->key = PyBytes_FromStringAndSize(NULL, 0);
  state->templates = PyDict_New();
  state->rebuild = Py_NewRef(rebuild);
  if (state->key == NULL || state->templates == NULL) {
    Py_DECREF(state);
    return NULL;
  }
  return (PyObject *)state;
}

static int gf_call_state_traverse(gf_call_state *state, visitproc visit, void *arg) {
  Py_VISIT(state->tree);
  Py_VISIT(state->key);
  Py_VISIT(state->templates);
  Py_VISIT(state->rebuild);
  return 0;
}

static int gf_call_state_clear(gf_call_state *state) {
  Py_CLEAR(state->tree);
  Py_CLEAR(state->key);
  Py_CLEAR(state->templates);
  Py_CLEAR(state->rebuild);
  return 0;
}

static void gf_call_state_dealloc(gf_call_state *state) {
  PyObject_GC_UnTrack(state);
  gf_call_state_clear(state);
  Py_TYPE(state)->tp_free((PyObject *)state);
}

static PyMemberDef gf_call_state_members[] = {
    {"tree", T_OBJECT, offsetof(gf_call_state, tree), READONLY,
     "the kwargs dict or TreeSpec of the call in flight, or None"},
    {"key", T_OBJECT, offsetof(gf_call_state, key), READONLY,
     "the key of the call in flight, as bytes"},
    {"templates", T_OBJECT, offsetof(gf_call_state, templates), READONLY,
     "dict: key bytes -> output template"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject gf_call_state_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_graphed_fastcall.CallState",
    .tp_basicsize = sizeof(gf_call_state),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "CallState(rebuild): the call in flight of one GraphedForward (see gf_fastcall.c).",
    .tp_new = gf_call_state_new,
    .tp_dealloc = (destructor)gf_call_state_dealloc,
    .tp_traverse = (traverseproc)gf_call_state_traverse,
    .tp_clear = (inquiry)gf_call_state_clear,
    .tp_members = gf_call_state_members,
};

/* -- outputs ----------------------------------------------------------------------------- */

/* The output of a call from its recorded template. */
static PyObject *gf_outputs_of_call(gf_call_state *state, PyObject *key, PyObject *outputs) {
  PyObject *template = PyDict_GetItemWithError(state->templates, key);
  if (template == NULL) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_RuntimeError, "graphed: no output template for this call");
    }
    return NULL;
  }
  if (PyTuple_CheckExact(template) && PyTuple_GET_SIZE(template) == 1) {
    return gf_walk_rebuild(PyTuple_GET_ITEM(template, 0), gf_placeholder, outputs);
  }
  return PyObject_CallFunctionObjArgs(state->rebuild, template, outputs, NULL);
}

/* -- call: the fast path ----------------------------------------------------------------- */

/* Describes the keep-alive tensors (rare: a small heap array) and enters the runner. */
static gf_status gf_fast_call_runner(gf_walk *walk, int64_t runner_id,
                                     const gf_call_in_flight *call, PyObject *keep_alive, int pin,
                                     int static_outputs, PyObject **outputs, gf_error *err) {
  Py_ssize_t held_count = PyList_GET_SIZE(keep_alive);
  gf_tensor *held = NULL;
  if (held_count > 0) {
    held = calloc((size_t)held_count, sizeof *held);
    if (held == NULL) {
      return gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: out of memory for keep_alive");
    }
  }
  for (Py_ssize_t i = 0; i < held_count; ++i) {
    PyObject *item = PyList_GET_ITEM(keep_alive, i);
    if (!gf_fastcall_torch_is_plain_tensor(item) ||
        gf_fastcall_torch_describe(item, &held[i]) != 0) {
      free(held);
      return gf_error_set(err, GF_ERR_TYPE, "graphed: keep_alive item %zd is not a plain tensor",
                          i);
    }
  }
  gf_calls_in_flight++;
  gf_status status = gf_fastcall_torch_call(runner_id, call, walk->key, walk->key_length,
                                            walk->tensors, walk->tensor_count, held,
                                            (size_t)held_count, pin, static_outputs, outputs, err);
  gf_calls_in_flight--;
  free(held);
  return status;
}

/* Ends either entry: raises for a failed status, else rebuilds the output from the key's
 * template; releases the key and the outputs either way. */
static PyObject *gf_finish_call(gf_status status, const gf_error *err, gf_call_state *state,
                                PyObject *key, PyObject *outputs) {
  PyObject *rebuilt = NULL;
  if (status != GF_OK) {
    gf_fastcall_torch_raise(status, err);
  } else {
    rebuilt = gf_outputs_of_call(state, key, outputs);
  }
  Py_XDECREF(outputs);
  Py_DECREF(key);
  return rebuilt;
}

static PyObject *gf_fast_call_walked(gf_walk *walk, int64_t runner_id, gf_call_state *state,
                                     PyObject *kwargs, PyObject *variant, PyObject *keep_alive,
                                     int pin, int static_outputs) {
  gf_walk_result result = gf_walk_kwargs(walk, kwargs, variant);
  if (result == GF_WALK_ERROR) {
    return NULL;
  }
  if (result == GF_WALK_UNSUPPORTED || walk->tensor_count == 0) {
    return Py_NewRef(gf_fallback);
  }
  PyObject *key = PyBytes_FromStringAndSize((const char *)walk->key, (Py_ssize_t)walk->key_length);
  if (key == NULL) {
    return NULL;
  }
  gf_call_in_flight call = {state, kwargs, key};
  PyObject *outputs = NULL;
  gf_error err = {0};
  gf_status status =
      gf_fast_call_runner(walk, runner_id, &call, keep_alive, pin, static_outputs, &outputs, &err);
  return gf_finish_call(status, &err, state, key, outputs);
}

/* The options both entries share; 0, or -1 with a Python error. */
static int gf_parse_options(PyObject *runner, PyObject *pin_flag, PyObject *static_flag,
                            int64_t *runner_id, int *pin, int *static_outputs) {
  long long id = PyLong_AsLongLong(runner);
  if (id == -1 && PyErr_Occurred()) {
    return -1;
  }
  *runner_id = (int64_t)id;
  *pin = PyObject_IsTrue(pin_flag);
  *static_outputs = PyObject_IsTrue(static_flag);
  return *pin < 0 || *static_outputs < 0 ? -1 : 0;
}

/* call(runner_id, kwargs, variant, pin, static_outputs, state, keep_alive) -> output | FALLBACK,
 * keep_alive a list of tensors the entry holds for its life (may be empty). */
static PyObject *gf_fast_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 7 || !PyDict_CheckExact(args[1]) || Py_TYPE(args[5]) != &gf_call_state_type ||
      !PyList_CheckExact(args[6])) {
    PyErr_SetString(PyExc_TypeError,
                    "_graphed_fastcall.call(runner_id, kwargs, variant, pin, static_outputs, "
                    "state, keep_alive)");
    return NULL;
  }
  int64_t runner_id = 0;
  int pin = 0;
  int static_outputs = 0;
  if (gf_parse_options(args[0], args[3], args[4], &runner_id, &pin, &static_outputs) != 0) {
    return NULL;
  }
  gf_walk nested = {0};
  gf_walk *walk = gf_calls_in_flight == 0 ? &gf_scratch : &nested;
  PyObject *rebuilt = gf_fast_call_walked(walk, runner_id, (gf_call_state *)args[5], args[1],
                                          args[2], args[6], pin, static_outputs);
  gf_walk_free(&nested);
  return rebuilt;
}

/* -- call_flat: the Python path ---------------------------------------------------------- */

/* call_flat(runner_id, state, key, tensors, spec, keep_alive, pin, static_outputs) -> output, the
 * kwargs already flattened by graphed._tree (key a str, tensors and keep_alive lists). */
static PyObject *gf_flat_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 8 || Py_TYPE(args[1]) != &gf_call_state_type || !PyUnicode_CheckExact(args[2]) ||
      !PyList_CheckExact(args[3]) || !PyList_CheckExact(args[5])) {
    PyErr_SetString(PyExc_TypeError,
                    "_graphed_fastcall.call_flat(runner_id, state, key, tensors, spec, "
                    "keep_alive, pin, static_outputs)");
    return NULL;
  }
  int64_t runner_id = 0;
  int pin = 0;
  int static_outputs = 0;
  if (gf_parse_options(args[0], args[6], args[7], &runner_id, &pin, &static_outputs) != 0) {
    return NULL;
  }
  gf_call_state *state = (gf_call_state *)args[1];
  PyObject *key = PyUnicode_AsUTF8String(args[2]);
  if (key == NULL) {
    return NULL;
  }
  gf_call_in_flight call = {state, args[4], key};
  PyObject *outputs = NULL;
  gf_error err = {0};
  gf_status status = gf_fastcall_torch_call_dispatched(runner_id, &call, args[3], args[5], pin,
                                                       static_outputs, &outputs, &err);
  return gf_finish_call(status, &err, state, key, outputs);
}

/* -- the walker, for the forward operator and for tests -------------------------------- */

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

/* substitute(kwargs, tensors) -> kwargs rebuilt with tensors in the walk's tensor slots. */
static PyObject *gf_substitute(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 2 || !PyList_CheckExact(args[1])) {
    PyErr_SetString(PyExc_TypeError, "_graphed_fastcall.substitute(kwargs, tensors: list)");
    return NULL;
  }
  return gf_walk_substitute(args[0], args[1]);
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
  if (nargs != 2 || !PyTuple_CheckExact(args[0]) || PyTuple_GET_SIZE(args[0]) != 1 ||
      !PyList_CheckExact(args[1])) {
    PyErr_SetString(PyExc_TypeError, "_graphed_fastcall.rebuild(template: 1-tuple, outputs: list)");
    return NULL;
  }
  return gf_walk_rebuild(PyTuple_GET_ITEM(args[0], 0), gf_placeholder, args[1]);
}

static PyMethodDef gf_fastcall_methods[] = {
    {"call", (PyCFunction)(void (*)(void))gf_fast_call, METH_FASTCALL,
     "call(runner_id, kwargs, variant, pin, static_outputs, state, keep_alive) -> output or "
     "FALLBACK"},
    {"call_flat", (PyCFunction)(void (*)(void))gf_flat_call, METH_FASTCALL,
     "call_flat(runner_id, state, key, tensors, spec, keep_alive, pin, static_outputs) -> output"},
    {"flatten", (PyCFunction)(void (*)(void))gf_flatten, METH_FASTCALL,
     "flatten(kwargs, variant) -> (key bytes, [tensors]) or FALLBACK: the walk of `call`"},
    {"substitute", (PyCFunction)(void (*)(void))gf_substitute, METH_FASTCALL,
     "substitute(kwargs, tensors) -> kwargs with tensors in the walk's tensor slots"},
    {"output_template", (PyCFunction)gf_output_template, METH_O,
     "output_template(result) -> (template, [tensors]) for a plain result, else None"},
    {"rebuild", (PyCFunction)(void (*)(void))gf_rebuild, METH_FASTCALL,
     "rebuild(template, outputs) -> the output a plain template stands for"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef gf_fastcall_module = {
    PyModuleDef_HEAD_INIT,
    "_graphed_fastcall",
    "The CPython entry points of GraphedForward and its walker of plain trees (see "
    "gf_fastcall.c).",
    -1,
    gf_fastcall_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__graphed_fastcall(void) {
  if (PyType_Ready(&gf_call_state_type) != 0) {
    return NULL;
  }
  PyObject *module = PyModule_Create(&gf_fastcall_module);
  if (module == NULL) {
    return NULL;
  }
  gf_fallback = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
  gf_placeholder = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
  if (gf_fallback == NULL || gf_placeholder == NULL ||
      PyModule_AddObjectRef(module, "FALLBACK", gf_fallback) != 0 ||
      PyModule_AddObjectRef(module, "PLACEHOLDER", gf_placeholder) != 0 ||
      PyModule_AddObjectRef(module, "CallState", (PyObject *)&gf_call_state_type) != 0) {
    Py_DECREF(module);
    return NULL;
  }
  return module;
}
