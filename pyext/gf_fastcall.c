/* graphed._fastcall: the CPython entry point of GraphedForward, in C. A torch.ops call spends
 * about 0.45 us per tensor parsing its arguments and a Python walk of the kwargs a few more, while
 * a graph launch costs about 3 us; this module walks the kwargs with the CPython API, builds the
 * non-tensor key as bytes, describes each tensor in place and enters the runner once.
 *
 * It takes the common shape of kwargs: exact dict (str keys), list and tuple containers, tensors,
 * and None/bool/int/float/str leaves, with a variant of those leaf types. Anything else returns
 * the FALLBACK object and the Python path (graphed._tree) handles the call. Fast-path keys start
 * with 'F', the Python path's never do, so the two never share a cache entry.
 *
 * The forward operator the core calls back (for probe, warm-up, capture or eager runs) reads the
 * call in flight from `state`, a list owned by the GraphedForward, which the shim fills while it
 * holds the runner's lock:
 *   state[0] the kwargs of the call in flight (None outside a call)
 *   state[1] the key of that call, as bytes
 *   state[2] dict: key bytes -> output template (see graphed._tree.output_template)
 *   state[3] callable rebuild(template, outputs) for templates this module does not rebuild */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "gf_fastcall_torch.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { GF_FAST_MAX_DEPTH = 32 };

typedef struct gf_walk {
  unsigned char *key;
  size_t key_length;
  size_t key_capacity;
  gf_tensor *tensors;
  size_t tensor_count;
  size_t tensor_capacity;
} gf_walk;

/* Reused across calls (the GIL serialises them); a call made from inside a forward that graphed
 * is capturing or running eagerly gets a walk of its own. */
static gf_walk gf_scratch;
static int gf_calls_in_flight;
static PyObject *gf_fallback;    /* returned when the fast path does not apply */
static PyObject *gf_placeholder; /* a tensor slot in an output template */

typedef enum { GF_WALK_OK = 0, GF_WALK_UNSUPPORTED = 1, GF_WALK_ERROR = -1 } gf_walk_result;

static gf_walk_result gf_walk_reserve(gf_walk *walk, size_t extra) {
  if (walk->key_length + extra <= walk->key_capacity) {
    return GF_WALK_OK;
  }
  size_t capacity = walk->key_capacity ? walk->key_capacity : 512;
  while (capacity < walk->key_length + extra) {
    capacity *= 2;
  }
  unsigned char *grown = realloc(walk->key, capacity);
  if (grown == NULL) {
    PyErr_NoMemory();
    return GF_WALK_ERROR;
  }
  walk->key = grown;
  walk->key_capacity = capacity;
  return GF_WALK_OK;
}

static gf_walk_result gf_walk_append(gf_walk *walk, char tag, const void *data, size_t length) {
  if (gf_walk_reserve(walk, 1 + length) != GF_WALK_OK) {
    return GF_WALK_ERROR;
  }
  walk->key[walk->key_length++] = (unsigned char)tag;
  if (length > 0) {
    memcpy(walk->key + walk->key_length, data, length);
    walk->key_length += length;
  }
  return GF_WALK_OK;
}

static gf_walk_result gf_walk_append_size(gf_walk *walk, char tag, Py_ssize_t size) {
  int64_t value = (int64_t)size;
  return gf_walk_append(walk, tag, &value, sizeof value);
}

/* 's', the length as int64, the UTF-8 bytes: one reservation, one copy. */
static gf_walk_result gf_walk_append_str(gf_walk *walk, PyObject *text) {
  Py_ssize_t length = 0;
  const char *utf8 = PyUnicode_AsUTF8AndSize(text, &length);
  if (utf8 == NULL) {
    return GF_WALK_ERROR;
  }
  int64_t prefix = (int64_t)length;
  if (gf_walk_reserve(walk, 1 + sizeof prefix + (size_t)length) != GF_WALK_OK) {
    return GF_WALK_ERROR;
  }
  unsigned char *at = walk->key + walk->key_length;
  at[0] = 's';
  memcpy(at + 1, &prefix, sizeof prefix);
  memcpy(at + 1 + sizeof prefix, utf8, (size_t)length);
  walk->key_length += 1 + sizeof prefix + (size_t)length;
  return GF_WALK_OK;
}

static gf_walk_result gf_walk_add_tensor(gf_walk *walk, PyObject *tensor) {
  if (walk->tensor_count == walk->tensor_capacity) {
    size_t capacity = walk->tensor_capacity ? 2 * walk->tensor_capacity : 64;
    gf_tensor *grown = realloc(walk->tensors, capacity * sizeof *grown);
    if (grown == NULL) {
      PyErr_NoMemory();
      return GF_WALK_ERROR;
    }
    walk->tensors = grown;
    walk->tensor_capacity = capacity;
  }
  if (gf_fastcall_torch_describe(tensor, &walk->tensors[walk->tensor_count]) != 0) {
    return GF_WALK_UNSUPPORTED; /* too many dimensions: the Python path says so */
  }
  walk->tensor_count++;
  return gf_walk_append(walk, 'T', NULL, 0);
}

/* Leaves that are not tensors; GF_WALK_UNSUPPORTED for any other type. */
static gf_walk_result gf_walk_leaf(gf_walk *walk, PyObject *value) {
  PyTypeObject *type = Py_TYPE(value);
  if (value == Py_None) {
    return gf_walk_append(walk, 'N', NULL, 0);
  }
  if (type == &PyBool_Type) {
    unsigned char flag = value == Py_True;
    return gf_walk_append(walk, 'b', &flag, 1);
  }
  if (type == &PyLong_Type) {
    int overflow = 0;
    long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow != 0) {
      return GF_WALK_UNSUPPORTED;
    }
    if (number == -1 && PyErr_Occurred()) {
      return GF_WALK_ERROR;
    }
    int64_t fixed = (int64_t)number;
    return gf_walk_append(walk, 'i', &fixed, sizeof fixed);
  }
  if (type == &PyFloat_Type) {
    double number = PyFloat_AS_DOUBLE(value);
    return gf_walk_append(walk, 'f', &number, sizeof number);
  }
  if (type == &PyUnicode_Type) {
    return gf_walk_append_str(walk, value);
  }
  return GF_WALK_UNSUPPORTED;
}

static gf_walk_result gf_walk_value(gf_walk *walk, PyObject *value, int depth) {
  if (depth > GF_FAST_MAX_DEPTH) {
    return GF_WALK_UNSUPPORTED;
  }
  gf_walk_result result;
  PyTypeObject *type = Py_TYPE(value);
  if (type == &PyDict_Type) {
    if ((result = gf_walk_append_size(walk, 'd', PyDict_GET_SIZE(value))) != GF_WALK_OK) {
      return result;
    }
    Py_ssize_t position = 0;
    PyObject *name;
    PyObject *item;
    while (PyDict_Next(value, &position, &name, &item)) {
      if (Py_TYPE(name) != &PyUnicode_Type) {
        return GF_WALK_UNSUPPORTED;
      }
      if ((result = gf_walk_append_str(walk, name)) != GF_WALK_OK ||
          (result = gf_walk_value(walk, item, depth + 1)) != GF_WALK_OK) {
        return result;
      }
    }
    return GF_WALK_OK;
  }
  if (type == &PyList_Type || type == &PyTuple_Type) {
    Py_ssize_t size = PySequence_Fast_GET_SIZE(value);
    PyObject **items = PySequence_Fast_ITEMS(value);
    if ((result = gf_walk_append_size(walk, type == &PyList_Type ? 'l' : 't', size)) !=
        GF_WALK_OK) {
      return result;
    }
    for (Py_ssize_t i = 0; i < size; ++i) {
      if ((result = gf_walk_value(walk, items[i], depth + 1)) != GF_WALK_OK) {
        return result;
      }
    }
    return GF_WALK_OK;
  }
  if (gf_fastcall_torch_is_plain_tensor(value)) {
    return gf_walk_add_tensor(walk, value);
  }
  return gf_walk_leaf(walk, value);
}

/* Rebuilds an output from its template: exact dict/list/tuple containers are rebuilt, the
 * placeholder takes the next output, every other object is returned as it is. */
static PyObject *gf_rebuild(PyObject *template, PyObject *outputs, Py_ssize_t *next) {
  if (template == gf_placeholder) {
    if (*next >= PyList_GET_SIZE(outputs)) {
      PyErr_SetString(PyExc_RuntimeError, "graphed: the output template wants more outputs");
      return NULL;
    }
    PyObject *tensor = PyList_GET_ITEM(outputs, *next);
    (*next)++;
    Py_INCREF(tensor);
    return tensor;
  }
  PyTypeObject *type = Py_TYPE(template);
  if (type == &PyDict_Type) {
    PyObject *rebuilt = PyDict_New();
    Py_ssize_t position = 0;
    PyObject *name;
    PyObject *item;
    while (rebuilt != NULL && PyDict_Next(template, &position, &name, &item)) {
      PyObject *value = gf_rebuild(item, outputs, next);
      if (value == NULL || PyDict_SetItem(rebuilt, name, value) != 0) {
        Py_XDECREF(value);
        Py_CLEAR(rebuilt);
        break;
      }
      Py_DECREF(value);
    }
    return rebuilt;
  }
  if (type == &PyList_Type || type == &PyTuple_Type) {
    Py_ssize_t size = PySequence_Fast_GET_SIZE(template);
    PyObject *rebuilt = type == &PyList_Type ? PyList_New(size) : PyTuple_New(size);
    for (Py_ssize_t i = 0; rebuilt != NULL && i < size; ++i) {
      PyObject *value = gf_rebuild(PySequence_Fast_ITEMS(template)[i], outputs, next);
      if (value == NULL) {
        Py_CLEAR(rebuilt);
        break;
      }
      if (type == &PyList_Type) {
        PyList_SET_ITEM(rebuilt, i, value);
      } else {
        PyTuple_SET_ITEM(rebuilt, i, value);
      }
    }
    return rebuilt;
  }
  Py_INCREF(template);
  return template;
}

static PyObject *gf_fast_outputs(PyObject *state, PyObject *key, PyObject *outputs) {
  PyObject *templates = PyList_GET_ITEM(state, 2);
  PyObject *template = PyDict_GetItemWithError(templates, key);
  if (template == NULL) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_RuntimeError, "graphed: no output template for this call");
    }
    return NULL;
  }
  if (PyTuple_CheckExact(template) && PyTuple_GET_SIZE(template) == 1) {
    Py_ssize_t next = 0;
    return gf_rebuild(PyTuple_GET_ITEM(template, 0), outputs, &next);
  }
  return PyObject_CallFunctionObjArgs(PyList_GET_ITEM(state, 3), template, outputs, NULL);
}

static PyObject *gf_fast_call_walked(gf_walk *walk, int64_t runner_id, PyObject *const *args,
                                     int pin, int static_outputs);

/* Describes the keep-alive tensors (rare: a small heap array) and enters the runner. */
static gf_status gf_fast_call_runner(gf_walk *walk, int64_t runner_id, PyObject *state,
                                     PyObject *kwargs, PyObject *key, PyObject *keep_alive, int pin,
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
  gf_fastcall_in_flight call = {state, kwargs, key};
  gf_status status = gf_fastcall_torch_call(runner_id, &call, walk->key, walk->key_length,
                                            walk->tensors, walk->tensor_count, held,
                                            (size_t)held_count, pin, static_outputs, outputs, err);
  gf_calls_in_flight--;
  free(held);
  return status;
}

/* call(runner_id, kwargs, variant, pin, static_outputs, state, keep_alive) -> output | FALLBACK,
 * keep_alive a list of tensors the entry holds for its life (may be empty). */
static PyObject *gf_fast_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 7 || !PyDict_CheckExact(args[1]) || !PyList_CheckExact(args[5]) ||
      PyList_GET_SIZE(args[5]) != 4 || !PyList_CheckExact(args[6])) {
    PyErr_SetString(PyExc_TypeError,
                    "graphed._fastcall.call(runner_id, kwargs, variant, pin, static_outputs, "
                    "state, keep_alive)");
    return NULL;
  }
  long long runner_id = PyLong_AsLongLong(args[0]);
  if (runner_id == -1 && PyErr_Occurred()) {
    return NULL;
  }
  int pin = PyObject_IsTrue(args[3]);
  int static_outputs = PyObject_IsTrue(args[4]);
  if (pin < 0 || static_outputs < 0) {
    return NULL;
  }
  gf_walk nested = {0};
  gf_walk *walk = gf_calls_in_flight == 0 ? &gf_scratch : &nested;
  walk->key_length = 0;
  walk->tensor_count = 0;
  PyObject *rebuilt = gf_fast_call_walked(walk, (int64_t)runner_id, args, pin, static_outputs);
  free(nested.key);
  free(nested.tensors);
  return rebuilt;
}

static PyObject *gf_fast_call_walked(gf_walk *walk, int64_t runner_id, PyObject *const *args,
                                     int pin, int static_outputs) {
  gf_walk_result result = gf_walk_append(walk, 'F', NULL, 0);
  if (result == GF_WALK_OK) {
    result = gf_walk_leaf(walk, args[2]);
  }
  if (result == GF_WALK_OK) {
    result = gf_walk_value(walk, args[1], 0);
  }
  if (result == GF_WALK_ERROR) {
    return NULL;
  }
  if (result == GF_WALK_UNSUPPORTED || walk->tensor_count == 0) {
    Py_INCREF(gf_fallback);
    return gf_fallback;
  }
  PyObject *state = args[5];
  PyObject *key = PyBytes_FromStringAndSize((const char *)walk->key, (Py_ssize_t)walk->key_length);
  if (key == NULL) {
    return NULL;
  }
  PyObject *outputs = NULL;
  gf_error err = {0};
  gf_status status = gf_fast_call_runner(walk, runner_id, state, args[1], key, args[6], pin,
                                         static_outputs, &outputs, &err);
  PyObject *rebuilt = NULL;
  if (status != GF_OK) {
    gf_fastcall_torch_raise(status, &err);
  } else {
    rebuilt = gf_fast_outputs(state, key, outputs);
  }
  Py_XDECREF(outputs);
  Py_DECREF(key);
  return rebuilt;
}

static PyMethodDef gf_fastcall_methods[] = {
    {"call", (PyCFunction)(void (*)(void))gf_fast_call, METH_FASTCALL,
     "call(runner_id, kwargs, variant, pin, static_outputs, state, keep_alive) -> output or "
     "FALLBACK"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef gf_fastcall_module = {
    PyModuleDef_HEAD_INIT,
    "_graphed_fastcall",
    "The CPython entry point of GraphedForward (see gf_fastcall.c).",
    -1,
    gf_fastcall_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__graphed_fastcall(void) {
  PyObject *module = PyModule_Create(&gf_fastcall_module);
  if (module == NULL) {
    return NULL;
  }
  gf_fallback = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
  gf_placeholder = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
  if (gf_fallback == NULL || gf_placeholder == NULL ||
      PyModule_AddObjectRef(module, "FALLBACK", gf_fallback) != 0 ||
      PyModule_AddObjectRef(module, "PLACEHOLDER", gf_placeholder) != 0) {
    Py_DECREF(module);
    return NULL;
  }
  return module;
}
