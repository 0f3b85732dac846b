/* The watch of what a GraphedForward's graphs baked in (see gf_baked.h). */
#define PY_SSIZE_T_CLEAN
#include "gf_baked.h"

#include "gf_fastcall_torch.h"

#include <stdint.h>
#include <stdlib.h>

#if PY_VERSION_HEX >= 0x030C0000
#define GF_DICT_WATCHERS 1
/* Every mutation of every dict any watch armed: the check compares one counter. A watcher is
 * called on the mutation itself, so a forward that sets attributes costs one increment each. */
static int gf_dict_watcher = -1;
static uint64_t gf_dict_mutations;

static int gf_baked_dict_event(PyDict_WatchEvent event, PyObject *dict, PyObject *key,
                               PyObject *new_value) {
  (void)event;
  (void)dict;
  (void)key;
  (void)new_value;
  gf_dict_mutations++;
  return 0;
}
#else
#define GF_DICT_WATCHERS 0
/* Before 3.12, PEP 509's version tag changes with every mutation of its dict. */
static uint64_t gf_dict_version(PyObject *dict) { return ((PyDictObject *)dict)->ma_version_tag; }
#endif

struct gf_baked {
  PyObject *dicts;        /* a tuple: the watched dicts (references held) */
  PyObject *tensors;      /* a tuple: the watched tensors (references held) */
  uint64_t mutations;     /* Python 3.12+: gf_dict_mutations when armed */
  uint64_t *versions;     /* before 3.12: each dict's version tag when armed */
  const void **impls;     /* each tensor's TensorImpl */
  const void **addresses; /* and its data address when armed */
  size_t tensor_count;
};

int gf_baked_init(void) {
#if GF_DICT_WATCHERS
  if (gf_dict_watcher < 0) {
    gf_dict_watcher = PyDict_AddWatcher(gf_baked_dict_event);
    if (gf_dict_watcher < 0) {
      return -1;
    }
  }
#endif
  return 0;
}

void gf_baked_free(gf_baked *baked) {
  if (baked == NULL) {
    return;
  }
  Py_XDECREF(baked->dicts);
  Py_XDECREF(baked->tensors);
  free(baked->versions);
  free(baked->impls);
  free(baked->addresses);
  free(baked);
}

static int gf_baked_arm_dicts(gf_baked *baked) {
  const Py_ssize_t count = PyTuple_GET_SIZE(baked->dicts);
#if !GF_DICT_WATCHERS
  baked->versions = calloc((size_t)count + 1, sizeof *baked->versions);
  if (baked->versions == NULL) {
    PyErr_NoMemory();
    return -1;
  }
#endif
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject *dict = PyTuple_GET_ITEM(baked->dicts, i);
    if (!PyDict_Check(dict)) {
      PyErr_Format(PyExc_TypeError, "graphed: watched item %zd is not a dict", i);
      return -1;
    }
#if GF_DICT_WATCHERS
    if (PyDict_Watch(gf_dict_watcher, dict) != 0) {
      return -1;
    }
#else
    baked->versions[i] = gf_dict_version(dict);
#endif
  }
#if GF_DICT_WATCHERS
  baked->mutations = gf_dict_mutations;
#endif
  return 0;
}

static int gf_baked_arm_tensors(gf_baked *baked) {
  const size_t count = (size_t)PyTuple_GET_SIZE(baked->tensors);
  baked->impls = calloc(count + 1, sizeof *baked->impls);
  baked->addresses = calloc(count + 1, sizeof *baked->addresses);
  if (baked->impls == NULL || baked->addresses == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  for (size_t i = 0; i < count; ++i) {
    PyObject *tensor = PyTuple_GET_ITEM(baked->tensors, (Py_ssize_t)i);
    if (!gf_fastcall_torch_is_tensor(tensor)) {
      PyErr_Format(PyExc_TypeError, "graphed: watched item %zu is not a tensor", i);
      return -1;
    }
    gf_fastcall_torch_data_address(tensor, &baked->impls[i], &baked->addresses[i]);
  }
  baked->tensor_count = count;
  return 0;
}

gf_baked *gf_baked_arm(PyObject *dicts, PyObject *tensors) {
  gf_baked *baked = calloc(1, sizeof *baked);
  if (baked == NULL) {
    PyErr_NoMemory();
    return NULL;
  }
  baked->dicts = PySequence_Tuple(dicts);
  baked->tensors = baked->dicts != NULL ? PySequence_Tuple(tensors) : NULL;
  if (baked->tensors == NULL || gf_baked_arm_dicts(baked) != 0 ||
      gf_baked_arm_tensors(baked) != 0) {
    gf_baked_free(baked);
    return NULL;
  }
  return baked;
}

int gf_baked_changed(const gf_baked *baked) {
#if GF_DICT_WATCHERS
  if (baked->mutations != gf_dict_mutations) {
    return 1;
  }
#else
  const Py_ssize_t dict_count = PyTuple_GET_SIZE(baked->dicts);
  for (Py_ssize_t i = 0; i < dict_count; ++i) {
    if (gf_dict_version(PyTuple_GET_ITEM(baked->dicts, i)) != baked->versions[i]) {
      return 1;
    }
  }
#endif
  return gf_fastcall_torch_addresses_moved(baked->impls, baked->addresses, baked->tensor_count);
}
