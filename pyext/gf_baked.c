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
/* The latest mutated dicts, mutation n at n % GF_DICT_LOG: which of a watch's dicts changed is told
 * from them (gf_baked_changes) while fewer than GF_DICT_LOG mutations happened since it was armed.
 * A pointer here may be a dict freed since; an armed dict is held by its watch, so a logged
 * pointer equal to an armed dict's is that dict. */
enum { GF_DICT_LOG = 4096 };
static PyObject *gf_dict_log[GF_DICT_LOG];

static int gf_baked_dict_event(PyDict_WatchEvent event, PyObject *dict, PyObject *key,
                               PyObject *new_value) {
  (void)event;
  (void)key;
  (void)new_value;
  gf_dict_log[gf_dict_mutations % GF_DICT_LOG] = dict;
  gf_dict_mutations++;
  return 0;
}

static int gf_compare_pointers(const void *a, const void *b) {
  const uintptr_t left = (uintptr_t) * (PyObject *const *)a;
  const uintptr_t right = (uintptr_t) * (PyObject *const *)b;
  return left < right ? -1 : left > right;
}
#else
#define GF_DICT_WATCHERS 0
/* Before 3.12, PEP 509's version tag changes with every mutation of its dict. */
static uint64_t gf_dict_version(PyObject *dict) { return ((PyDictObject *)dict)->ma_version_tag; }
#endif

/* Every swap of two tensors' contents (torch.utils.swap_tensors, which nn.Module._apply uses for
 * some conversions and load_state_dict under torch.__future__'s swap setting): such a swap gives a
 * parameter's Python object another TensorImpl without touching a dict, where the watch holds the
 * old one's address, which the swap may leave to be freed. graphed._watch counts each swap here and
 * the check compares this counter first, before it reads any tensor. */
static uint64_t gf_tensor_swaps;

void gf_baked_note_swap(void) { gf_tensor_swaps++; }

/* One watched list or set, as the check before each call reads it: one entry of a C array, so that
 * the check reads the object and its length from one place (about 1.7 ns a list on a 2-core x86
 * host when each was found through the tuples). */
typedef struct gf_watched_sequence {
  PyObject *sequence; /* borrowed from gf_baked.sequences */
  PyObject *snapshot; /* borrowed from gf_baked.snapshots: its items when armed, a tuple */
  Py_ssize_t length;
  int is_list;
} gf_watched_sequence;

struct gf_baked {
  PyObject *dicts;     /* a tuple: the watched dicts (references held) */
  PyObject *tensors;   /* a tuple: the watched tensors (references held) */
  PyObject *sequences; /* a tuple: the watched lists and sets (references held) */
  PyObject *snapshots; /* a tuple: each one's items when armed (a tuple) */
  gf_watched_sequence *watched_sequences;
  size_t sequence_count;
  uint64_t mutations;                 /* Python 3.12+: gf_dict_mutations when armed */
  uint64_t swaps;                     /* gf_tensor_swaps when armed */
  uint64_t *versions;                 /* before 3.12: each dict's version tag when armed */
  gf_watched_tensor *watched_tensors; /* each tensor as armed */
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
  Py_XDECREF(baked->sequences);
  Py_XDECREF(baked->snapshots);
  free(baked->watched_sequences);
  free(baked->versions);
  free(baked->watched_tensors);
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
  baked->watched_tensors = calloc(count + 1, sizeof *baked->watched_tensors);
  if (baked->watched_tensors == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  for (size_t i = 0; i < count; ++i) {
    PyObject *tensor = PyTuple_GET_ITEM(baked->tensors, (Py_ssize_t)i);
    if (!gf_fastcall_torch_is_tensor(tensor)) {
      PyErr_Format(PyExc_TypeError, "graphed: watched item %zu is not a tensor", i);
      return -1;
    }
    gf_fastcall_torch_watch_tensor(tensor, &baked->watched_tensors[i]);
  }
  baked->tensor_count = count;
  return 0;
}

/* Lists and sets have no watcher and no version tag: each is compared with a copy of its items
 * (a list item by identity, in order; a set's items by membership), so a watched one should be
 * short (graphed._baked watches lists and sets of at most 64 items). */
static int gf_baked_arm_sequences(gf_baked *baked) {
  const Py_ssize_t count = PyTuple_GET_SIZE(baked->sequences);
  baked->snapshots = PyTuple_New(count);
  baked->watched_sequences = calloc((size_t)count + 1, sizeof *baked->watched_sequences);
  if (baked->snapshots == NULL || baked->watched_sequences == NULL) {
    if (baked->watched_sequences == NULL) {
      PyErr_NoMemory();
    }
    return -1;
  }
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject *sequence = PyTuple_GET_ITEM(baked->sequences, i);
    PyObject *snapshot =
        PyList_Check(sequence) || PyAnySet_Check(sequence) ? PySequence_Tuple(sequence) : NULL;
    if (snapshot == NULL) {
      if (!PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "graphed: watched item %zd is not a list or a set", i);
      }
      return -1;
    }
    PyTuple_SET_ITEM(baked->snapshots, i, snapshot);
    baked->watched_sequences[i] = (gf_watched_sequence){
        sequence, snapshot, PyTuple_GET_SIZE(snapshot), PyList_Check(sequence)};
  }
  baked->sequence_count = (size_t)count;
  return 0;
}

gf_baked *gf_baked_arm(PyObject *dicts, PyObject *tensors, PyObject *sequences) {
  gf_baked *baked = calloc(1, sizeof *baked);
  if (baked == NULL) {
    PyErr_NoMemory();
    return NULL;
  }
  baked->swaps = gf_tensor_swaps;
  baked->dicts = PySequence_Tuple(dicts);
  baked->tensors = baked->dicts != NULL ? PySequence_Tuple(tensors) : NULL;
  baked->sequences = baked->tensors != NULL ? PySequence_Tuple(sequences) : NULL;
  if (baked->sequences == NULL || gf_baked_arm_dicts(baked) != 0 ||
      gf_baked_arm_tensors(baked) != 0 || gf_baked_arm_sequences(baked) != 0) {
    gf_baked_free(baked);
    return NULL;
  }
  return baked;
}

/* Whether `item` is one of the snapshot's items, by identity. */
static int gf_snapshot_holds(PyObject *snapshot, PyObject *item) {
  const Py_ssize_t length = PyTuple_GET_SIZE(snapshot);
  for (Py_ssize_t i = 0; i < length; ++i) {
    if (PyTuple_GET_ITEM(snapshot, i) == item) {
      return 1;
    }
  }
  return 0;
}

/* 1 when a list's or set's items differ from its snapshot's, by identity (an equal item that is
 * another object counts as a change: the Python layer then compares records by value). No Python
 * code runs here (a set is walked by its C iterator, never hashed or compared), so nothing can
 * release the watch while it is read; an iterator that cannot be made counts as a change. */
static int gf_sequence_changed(const gf_watched_sequence *watched) {
  const Py_ssize_t length = watched->length;
  if (watched->is_list) {
    if (PyList_GET_SIZE(watched->sequence) != length) {
      return 1;
    }
    for (Py_ssize_t i = 0; i < length; ++i) {
      if (PyList_GET_ITEM(watched->sequence, i) != PyTuple_GET_ITEM(watched->snapshot, i)) {
        return 1;
      }
    }
    return 0;
  }
  if (PySet_GET_SIZE(watched->sequence) != length) {
    return 1;
  }
  PyObject *items = PyObject_GetIter(watched->sequence);
  if (items == NULL) {
    PyErr_Clear();
    return 1;
  }
  int changed = 0;
  PyObject *item = NULL;
  while (!changed && (item = PyIter_Next(items)) != NULL) {
    changed = !gf_snapshot_holds(watched->snapshot, item);
    Py_DECREF(item);
  }
  Py_DECREF(items);
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return 1;
  }
  return changed;
}

int gf_baked_changed(const gf_baked *baked) {
  if (baked->swaps != gf_tensor_swaps) {
    return 1;
  }
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
  for (size_t i = 0; i < baked->sequence_count; ++i) {
    if (gf_sequence_changed(&baked->watched_sequences[i])) {
      return 1;
    }
  }
  return gf_fastcall_torch_tensors_moved(baked->watched_tensors, baked->tensor_count);
}

/* The watched dicts mutated since the watch was armed, appended to `changed`: 0, 1 when that
 * cannot be told (more mutations than the log holds), -1 with a Python error. */
static int gf_baked_changed_dicts(const gf_baked *baked, PyObject *changed) {
  const Py_ssize_t count = PyTuple_GET_SIZE(baked->dicts);
#if GF_DICT_WATCHERS
  const uint64_t since = gf_dict_mutations - baked->mutations;
  if (since == 0) {
    return 0;
  }
  if (since > GF_DICT_LOG) {
    return 1;
  }
  PyObject **logged = malloc((size_t)since * sizeof *logged);
  if (logged == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  for (uint64_t i = 0; i < since; ++i) {
    logged[i] = gf_dict_log[(baked->mutations + i) % GF_DICT_LOG];
  }
  qsort(logged, (size_t)since, sizeof *logged, gf_compare_pointers);
  int status = 0;
  for (Py_ssize_t i = 0; status == 0 && i < count; ++i) {
    PyObject *dict = PyTuple_GET_ITEM(baked->dicts, i);
    if (bsearch(&dict, logged, (size_t)since, sizeof *logged, gf_compare_pointers) != NULL) {
      status = PyList_Append(changed, dict);
    }
  }
  free(logged);
  return status;
#else
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject *dict = PyTuple_GET_ITEM(baked->dicts, i);
    if (gf_dict_version(dict) != baked->versions[i] && PyList_Append(changed, dict) != 0) {
      return -1;
    }
  }
  return 0;
#endif
}

PyObject *gf_baked_changes(const gf_baked *baked) {
  if (baked->swaps != gf_tensor_swaps) {
    Py_RETURN_NONE;
  }
  PyObject *changed = PyList_New(0);
  if (changed == NULL) {
    return NULL;
  }
  int status = gf_baked_changed_dicts(baked, changed);
  for (size_t i = 0; status == 0 && i < baked->sequence_count; ++i) {
    const gf_watched_sequence *watched = &baked->watched_sequences[i];
    if (gf_sequence_changed(watched)) {
      status = PyList_Append(changed, watched->sequence);
    }
  }
  for (size_t i = 0; status == 0 && i < baked->tensor_count; ++i) {
    if (gf_fastcall_torch_tensors_moved(&baked->watched_tensors[i], 1)) {
      status = PyList_Append(changed, PyTuple_GET_ITEM(baked->tensors, (Py_ssize_t)i));
    }
  }
  if (status != 0) {
    Py_DECREF(changed);
    if (status < 0) {
      return NULL;
    }
    Py_RETURN_NONE;
  }
  return changed;
}
