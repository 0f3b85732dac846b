/* The capture inventory's work per tensor (graphed._inventory), in C: while the run that records
 * a capture's reads goes (the capture itself, or one run before it), every torch call passes here
 * what it read and made, and a storage's key is asked of each tensor. Written in Python (a storage
 * object made per tensor, three set lookups, a frame per value), that bookkeeping was most of what
 * the mode added to a capture: on this project's 2-core CPU host, 13 us of the 27 us a torch call
 * of a small Linear/GELU chain took under the capture's mode, against 14 us eager; the C walk here
 * leaves the mode's own call. Python keeps what is rare: naming a new candidate (where it was read,
 * which global holds it). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "gf_fastcall_torch.h"
#include "gf_inventory_reads.h"

/* The key of `value` (a tensor on `device_type`, -1: any), a new reference; NULL without an
 * error for anything else (not a tensor, another device, no storage). */
static PyObject *gf_storage_key(PyObject *value, int device_type) {
  if (!gf_fastcall_torch_is_tensor(value)) {
    return NULL;
  }
  const void *storage = gf_fastcall_torch_storage_on(value, device_type);
  return storage != NULL ? PyLong_FromVoidPtr((void *)storage) : NULL;
}

/* What the run that records a capture's reads made (Note [One recorded run per capture],
 * graphed._phases): a weak reference to each storage, so that those still alive once the run
 * returned (a cache the forward keeps) can be counted. */
typedef struct gf_made_watch {
  size_t count;
  size_t capacity;
  void **weak; /* gf_fastcall_torch_storage_weak references */
} gf_made_watch;

static const char GF_MADE_WATCH[] = "graphed.made_watch";

static void gf_made_watch_free(PyObject *capsule) {
  gf_made_watch *watch = PyCapsule_GetPointer(capsule, GF_MADE_WATCH);
  if (watch == NULL) {
    PyErr_Clear();
    return;
  }
  for (size_t i = 0; i < watch->count; ++i) {
    gf_fastcall_torch_storage_weak_free(watch->weak[i]);
  }
  PyMem_Free(watch->weak);
  PyMem_Free(watch);
}

/* Follows the storage of `value` (a tensor on `device_type`); 0, or -1 with MemoryError. */
static int gf_made_watch_add(gf_made_watch *watch, PyObject *value, int device_type) {
  if (watch->count == watch->capacity) {
    size_t capacity = watch->capacity ? 2 * watch->capacity : 256;
    void **grown = PyMem_Realloc(watch->weak, capacity * sizeof(void *));
    if (grown == NULL) {
      PyErr_NoMemory();
      return -1;
    }
    watch->weak = grown;
    watch->capacity = capacity;
  }
  void *weak = gf_fastcall_torch_storage_weak(value, device_type);
  if (weak != NULL) {
    watch->weak[watch->count++] = weak;
  }
  return 0;
}

typedef struct gf_reads {
  int device_type;
  PyObject *known;      /* set: inputs and what the module's watch follows */
  PyObject *made;       /* set: made during the capture by a torch function */
  PyObject *candidates; /* dict: candidate externals, by key */
  PyObject *found;      /* list of (key, tensor) new candidates of this call, made when needed */
  gf_made_watch *watch; /* NULL, or where what is made is also followed */
} gf_reads;

/* 1 when `key` is in known, made or candidates (or already found in this call), 0 if not, -1
 * with an error. */
static int gf_reads_seen(const gf_reads *reads, PyObject *key) {
  int seen = PySet_Contains(reads->known, key);
  if (seen == 0) {
    seen = PySet_Contains(reads->made, key);
  }
  if (seen == 0) {
    seen = PyDict_Contains(reads->candidates, key);
  }
  if (seen == 0 && reads->found != NULL) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(reads->found) && seen == 0; ++i) {
      seen = PyObject_RichCompareBool(PyTuple_GET_ITEM(PyList_GET_ITEM(reads->found, i), 0), key,
                                      Py_EQ);
    }
  }
  return seen;
}

/* A tensor read: a new candidate when its storage is on the device and seen nowhere yet. */
static int gf_reads_tensor(gf_reads *reads, PyObject *value) {
  PyObject *key = gf_storage_key(value, reads->device_type);
  if (key == NULL) {
    return PyErr_Occurred() ? -1 : 0;
  }
  int seen = gf_reads_seen(reads, key);
  if (seen != 0) {
    Py_DECREF(key);
    return seen < 0 ? -1 : 0;
  }
  if (reads->found == NULL && (reads->found = PyList_New(0)) == NULL) {
    Py_DECREF(key);
    return -1;
  }
  PyObject *pair = PyTuple_Pack(2, key, value);
  Py_DECREF(key);
  if (pair == NULL) {
    return -1;
  }
  int status = PyList_Append(reads->found, pair);
  Py_DECREF(pair);
  return status;
}

/* A tensor a torch call returned: made during the capture unless known or a candidate. */
static int gf_reads_made(gf_reads *reads, PyObject *value) {
  PyObject *key = gf_storage_key(value, reads->device_type);
  if (key == NULL) {
    return PyErr_Occurred() ? -1 : 0;
  }
  int status = gf_reads_seen(reads, key); /* a tensor this call read, written in place: not made */
  if (status == 0) {
    status = PySet_Add(reads->made, key);
  }
  if (status == 0 && reads->watch != NULL) {
    status = gf_made_watch_add(reads->watch, value, reads->device_type);
  }
  Py_DECREF(key);
  return status < 0 ? -1 : 0;
}

/* `each` of a value a torch call was given or returned: a tensor, or each item of a list or tuple
 * (one level; items that are no tensor are skipped by `each`). */
static int gf_reads_each(gf_reads *reads, PyObject *value, int (*each)(gf_reads *, PyObject *)) {
  if (PyList_Check(value) || PyTuple_Check(value)) {
    PyObject *items = PySequence_Fast(value, "");
    if (items == NULL) {
      return -1;
    }
    int status = 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(items) && status == 0; ++i) {
      status = each(reads, PySequence_Fast_GET_ITEM(items, i));
    }
    Py_DECREF(items);
    return status;
  }
  return each(reads, value);
}

/* note_reads(device_type, known, made, candidates, args, kwargs, result, watch=None): one torch
 * call of a capture. Notes in `made` (and in `watch`, a made_watch(), when given) the storages
 * its results made, and returns the (key, tensor) pairs of the tensors it read that are new
 * candidates (in the order read), or None when there are none: graphed._inventory._Reads.note. */
static PyObject *gf_note_reads(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  gf_made_watch *watch = NULL;
  if (nargs == 8 && args[7] != Py_None) {
    watch = PyCapsule_GetPointer(args[7], GF_MADE_WATCH);
    if (watch == NULL) {
      return NULL;
    }
  }
  if (nargs < 7 || nargs > 8 || !PyLong_Check(args[0]) || !PyAnySet_Check(args[1]) ||
      !PyAnySet_Check(args[2]) || !PyDict_Check(args[3]) || !PyTuple_Check(args[4]) ||
      (args[5] != Py_None && !PyDict_Check(args[5]))) {
    PyErr_SetString(PyExc_TypeError,
                    "note_reads(device_type: int, known: set, made: set, candidates: dict, "
                    "args: tuple, kwargs: dict | None, result, watch=None)");
    return NULL;
  }
  gf_reads reads = {(int)PyLong_AsLong(args[0]), args[1], args[2], args[3], NULL, watch};
  int status = 0;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args[4]) && status == 0; ++i) {
    status = gf_reads_each(&reads, PyTuple_GET_ITEM(args[4], i), gf_reads_tensor);
  }
  if (args[5] != Py_None) {
    Py_ssize_t position = 0;
    PyObject *name = NULL;
    PyObject *value = NULL;
    while (status == 0 && PyDict_Next(args[5], &position, &name, &value)) {
      status = gf_reads_each(&reads, value, gf_reads_tensor);
    }
  }
  if (status == 0) {
    status = gf_reads_each(&reads, args[6], gf_reads_made);
  }
  if (status != 0) {
    Py_XDECREF(reads.found);
    return NULL;
  }
  if (reads.found == NULL) {
    Py_RETURN_NONE;
  }
  return reads.found;
}

/* storage_keys(tensors, device_type=-1): the keys of the storages of the tensors an iterable
 * holds (other items skipped) on that device type (-1: any), as a set. */
static PyObject *gf_storage_keys(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  int device_type = -1;
  if (nargs < 1 || nargs > 2 || (nargs == 2 && !PyLong_Check(args[1]))) {
    PyErr_SetString(PyExc_TypeError, "storage_keys(tensors, device_type: int = -1)");
    return NULL;
  }
  if (nargs == 2) {
    device_type = (int)PyLong_AsLong(args[1]);
  }
  PyObject *iterator = PyObject_GetIter(args[0]);
  PyObject *keys = iterator != NULL ? PySet_New(NULL) : NULL;
  if (keys == NULL) {
    Py_XDECREF(iterator);
    return NULL;
  }
  PyObject *item = NULL;
  while ((item = PyIter_Next(iterator)) != NULL) {
    PyObject *key = gf_storage_key(item, device_type);
    Py_DECREF(item);
    if (key != NULL) {
      int added = PySet_Add(keys, key);
      Py_DECREF(key);
      if (added != 0) {
        break;
      }
    } else if (PyErr_Occurred()) {
      break;
    }
  }
  Py_DECREF(iterator);
  if (PyErr_Occurred()) {
    Py_DECREF(keys);
    return NULL;
  }
  return keys;
}

/* made_watch(): an empty record of what a run makes, for note_reads and survivors. */
static PyObject *gf_made_watch_new(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  gf_made_watch *watch = PyMem_Calloc(1, sizeof(gf_made_watch));
  if (watch == NULL) {
    return PyErr_NoMemory();
  }
  PyObject *capsule = PyCapsule_New(watch, GF_MADE_WATCH, gf_made_watch_free);
  if (capsule == NULL) {
    PyMem_Free(watch);
  }
  return capsule;
}

/* survivors(watch, excluded): how many storages the watch followed are still alive, leaving out
 * those whose keys the set `excluded` holds (the run's outputs). */
static PyObject *gf_survivors(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 2 || !PyAnySet_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "survivors(watch, excluded: set)");
    return NULL;
  }
  gf_made_watch *watch = PyCapsule_GetPointer(args[0], GF_MADE_WATCH);
  if (watch == NULL) {
    return NULL;
  }
  Py_ssize_t alive = 0;
  for (size_t i = 0; i < watch->count; ++i) {
    const void *storage = gf_fastcall_torch_storage_weak_alive(watch->weak[i]);
    if (storage == NULL) {
      continue;
    }
    PyObject *key = PyLong_FromVoidPtr((void *)storage);
    int excluded = key != NULL ? PySet_Contains(args[1], key) : -1;
    Py_XDECREF(key);
    if (excluded < 0) {
      return NULL;
    }
    alive += excluded == 0;
  }
  return PyLong_FromSsize_t(alive);
}

/* device_type_code(name): the c10::DeviceType number of a device type's name ("cuda"). */
static PyObject *gf_device_type_code(PyObject *self, PyObject *name) {
  (void)self;
  const char *text = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
  if (text == NULL) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_TypeError, "device_type_code(name: str)");
    }
    return NULL;
  }
  int code = gf_fastcall_torch_device_type(text);
  if (code < 0) {
    PyErr_Format(PyExc_ValueError, "no device type is named %R", name);
    return NULL;
  }
  return PyLong_FromLong(code);
}

static PyMethodDef gf_inventory_reads_methods[] = {
    {"note_reads", (PyCFunction)(void (*)(void))gf_note_reads, METH_FASTCALL,
     "One torch call of a capture: the new candidate externals it read (graphed._inventory)."},
    {"storage_keys", (PyCFunction)(void (*)(void))gf_storage_keys, METH_FASTCALL,
     "The keys of the storages of an iterable's tensors, as the capture's inventory sorts them."},
    {"made_watch", gf_made_watch_new, METH_NOARGS,
     "An empty record of the storages a run makes, which note_reads fills and survivors reads."},
    {"survivors", (PyCFunction)(void (*)(void))gf_survivors, METH_FASTCALL,
     "How many storages a made_watch followed are still alive, leaving out a set of keys."},
    {"device_type_code", gf_device_type_code, METH_O,
     "The number torch gives a device type's name, as note_reads and storage_keys take it."},
    {NULL, NULL, 0, NULL},
};

int gf_inventory_reads_init(PyObject *module) {
  return PyModule_AddFunctions(module, gf_inventory_reads_methods);
}
