/* The one walker of plain trees. The fast path's tensor order is decided here and nowhere else:
 * the Python layer never walks a plain tree itself, it asks this file (through the extension) to
 * put the core's tensors back into the kwargs, to make an output's template and to rebuild an
 * output, so the order the core sees and the order the trees are rebuilt in cannot drift apart.
 *
 * A plain tree is made of exact dict, list and tuple containers (at most GF_WALK_MAX_DEPTH deep)
 * and leaves. The order is depth first: a dict's items in insertion order (PyDict_Next), a list's
 * or tuple's items by index. For kwargs, dict keys are str, tensors are exact torch.Tensor or
 * nn.Parameter, other leaves None/bool/int (fits int64)/float/str; anything else is
 * GF_WALK_UNSUPPORTED and the Python path (graphed._tree) takes the call. For outputs, dict keys
 * and leaves are any value that cannot hold a tensor (None, bool, int, float, complex, str,
 * bytes, torch.dtype/device/Size/layout/memory_format) and any tensor, subclasses included, is a
 * slot.
 *
 * The key of kwargs is bytes: 'F', the variant, then the tree: 'd' + int64 size + ('s' + int64
 * length + UTF-8)/value per item, 'l'/'t' + int64 size + items, 'T' per tensor (its dtype, device
 * and shape are not in the key: the core adds them), 'N', 'b' + byte, 'i' + int64, 'f' + double,
 * 's' + int64 length + UTF-8. Python-path keys start with 'V', so the paths never share a key. */
#include "gf_walker.h"

#include "gf_fastcall_torch.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { GF_WALK_MAX_DEPTH = 32 };

/* -- the walk of kwargs: key bytes and tensor descriptors ------------------------------------ */

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
    if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
      return GF_WALK_ERROR;
    }
    PyErr_Clear(); /* a lone surrogate: the Python path keys it by repr */
    return GF_WALK_UNSUPPORTED;
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

int gf_tensor_refused(PyObject *tensor, gf_tensor *described, PyObject **type, char *reason,
                      size_t capacity) {
  const char *why = NULL;
  switch (gf_fastcall_torch_describe(tensor, described, &why)) {
  case GF_DESCRIBE_OK:
    return 0;
  case GF_DESCRIBE_TOO_MANY_DIMS:
    *type = PyExc_ValueError;
    snprintf(reason, capacity, "has %d dimensions; at most %d are supported", (int)described->ndim,
             (int)GF_MAX_DIMS);
    return 1;
  default:
    *type = PyExc_TypeError;
    snprintf(reason, capacity, "%s", why ? why : "is not a tensor graphed takes");
    return 1;
  }
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
    PyObject **objects = realloc(walk->objects, capacity * sizeof *objects);
    if (objects == NULL) {
      PyErr_NoMemory();
      return GF_WALK_ERROR;
    }
    walk->objects = objects;
    walk->tensor_capacity = capacity;
  }
  if (gf_tensor_refused(tensor, &walk->tensors[walk->tensor_count], &walk->refusal_type,
                        walk->reason, sizeof walk->reason)) {
    return GF_WALK_REFUSED;
  }
  Py_INCREF(tensor);
  walk->objects[walk->tensor_count] = tensor;
  walk->tensor_count++;
  return gf_walk_append(walk, 'T', NULL, 0);
}

/* Puts a path segment ("['k']", "[3]") in front of a refused tensor's path while unwinding; a
 * path that no longer fits keeps its innermost part behind "...". */
static void gf_walk_prepend_path(gf_walk *walk, PyObject *segment) {
  Py_ssize_t length = 0;
  const char *text = segment != NULL ? PyUnicode_AsUTF8AndSize(segment, &length) : NULL;
  if (text == NULL) {
    PyErr_Clear();
    text = "[?]";
    length = 3;
  }
  if (walk->path_length + (size_t)length + 1 > sizeof walk->path) {
    text = "...";
    length = 3;
    if (walk->path_length + 4 > sizeof walk->path || memcmp(walk->path, "...", 3) == 0) {
      return;
    }
  }
  memmove(walk->path + length, walk->path, walk->path_length);
  memcpy(walk->path, text, (size_t)length);
  walk->path_length += (size_t)length;
  walk->path[walk->path_length] = '\0';
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
  if (depth > GF_WALK_MAX_DEPTH) {
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
        if (result == GF_WALK_REFUSED) {
          PyObject *segment = PyUnicode_FromFormat("[%R]", name);
          gf_walk_prepend_path(walk, segment);
          Py_XDECREF(segment);
        }
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
        if (result == GF_WALK_REFUSED) {
          PyObject *segment = PyUnicode_FromFormat("[%zd]", i);
          gf_walk_prepend_path(walk, segment);
          Py_XDECREF(segment);
        }
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

gf_walk_result gf_walk_kwargs(gf_walk *walk, PyObject *kwargs, PyObject *variant) {
  gf_walk_release(walk);
  walk->key_length = 0;
  walk->path_length = 0;
  walk->path[0] = '\0';
  gf_walk_result result = gf_walk_append(walk, 'F', NULL, 0);
  if (result == GF_WALK_OK) {
    result = gf_walk_leaf(walk, variant);
  }
  if (result == GF_WALK_OK) {
    result = gf_walk_value(walk, kwargs, 0);
  }
  if (result == GF_WALK_REFUSED) {
    PyErr_Format(walk->refusal_type, "graphed: kwargs%s %s", walk->path, walk->reason);
    result = GF_WALK_ERROR;
  }
  if (result != GF_WALK_OK) {
    gf_walk_release(walk);
  }
  return result;
}

/* Counts tensors down from *remaining; returns the path below value of the one it reaches zero at
 * (a new reference, "" for value itself), Py_None when value holds fewer, NULL on an error. */
static PyObject *gf_path_below(PyObject *value, size_t *remaining, int depth) {
  if (depth > GF_WALK_MAX_DEPTH) {
    return Py_NewRef(Py_None);
  }
  if (gf_fastcall_torch_is_plain_tensor(value)) {
    if (*remaining == 0) {
      return PyUnicode_FromString("");
    }
    --*remaining;
    return Py_NewRef(Py_None);
  }
  PyTypeObject *type = Py_TYPE(value);
  if (type == &PyDict_Type) {
    Py_ssize_t position = 0;
    PyObject *name;
    PyObject *item;
    while (PyDict_Next(value, &position, &name, &item)) {
      PyObject *below = gf_path_below(item, remaining, depth + 1);
      if (below == NULL || below != Py_None) {
        PyObject *path = below != NULL ? PyUnicode_FromFormat("[%R]%U", name, below) : NULL;
        Py_XDECREF(below);
        return path;
      }
      Py_DECREF(below);
    }
  } else if (type == &PyList_Type || type == &PyTuple_Type) {
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(value); ++i) {
      PyObject *below = gf_path_below(PySequence_Fast_GET_ITEM(value, i), remaining, depth + 1);
      if (below == NULL || below != Py_None) {
        PyObject *path = below != NULL ? PyUnicode_FromFormat("[%zd]%U", i, below) : NULL;
        Py_XDECREF(below);
        return path;
      }
      Py_DECREF(below);
    }
  }
  return Py_NewRef(Py_None);
}

PyObject *gf_walk_path_of_tensor(PyObject *kwargs, size_t index) {
  size_t remaining = index;
  PyObject *below = gf_path_below(kwargs, &remaining, 0);
  if (below == Py_None) {
    Py_DECREF(below);
    PyErr_Format(PyExc_IndexError, "graphed: kwargs hold no tensor %zu", index);
    return NULL;
  }
  PyObject *path = below != NULL ? PyUnicode_FromFormat("kwargs%U", below) : NULL;
  Py_XDECREF(below);
  return path;
}

void gf_walk_release(gf_walk *walk) {
  size_t count = walk->tensor_count;
  walk->tensor_count = 0; /* first: a finalizer that calls graphed again finds the walk empty */
  for (size_t i = 0; i < count; ++i) {
    Py_DECREF(walk->objects[i]);
  }
}

void gf_walk_free(gf_walk *walk) {
  gf_walk_release(walk);
  free(walk->key);
  free(walk->tensors);
  free(walk->objects);
  memset(walk, 0, sizeof *walk);
}

/* -- the decode of a key: the kwargs from the bytes the walk wrote ----------------------------- */

typedef struct gf_reader {
  const unsigned char *at;
  const unsigned char *end;
  PyObject *tensors;
  Py_ssize_t next;
} gf_reader;

static int gf_read(gf_reader *reader, void *out, size_t length) {
  if ((size_t)(reader->end - reader->at) < length) {
    return -1;
  }
  memcpy(out, reader->at, length);
  reader->at += length;
  return 0;
}

static PyObject *gf_decode_value(gf_reader *reader, int depth);

static PyObject *gf_decode_str(gf_reader *reader) {
  int64_t length = 0;
  if (gf_read(reader, &length, sizeof length) != 0 || length < 0 ||
      (uint64_t)length > (uint64_t)(reader->end - reader->at)) {
    return NULL;
  }
  PyObject *text = PyUnicode_DecodeUTF8((const char *)reader->at, (Py_ssize_t)length, "strict");
  reader->at += length;
  return text;
}

static PyObject *gf_decode_container(gf_reader *reader, unsigned char tag, int depth) {
  int64_t size = 0;
  if (gf_read(reader, &size, sizeof size) != 0 || size < 0 ||
      (uint64_t)size > (uint64_t)(reader->end - reader->at)) {
    return NULL; /* every item takes at least one byte */
  }
  PyObject *made = tag == 'd' ? PyDict_New() : tag == 'l' ? PyList_New(size) : PyTuple_New(size);
  for (int64_t i = 0; made != NULL && i < size; ++i) {
    PyObject *name = NULL;
    if (tag == 'd') {
      unsigned char name_tag = 0;
      if (gf_read(reader, &name_tag, 1) != 0 || name_tag != 's' ||
          (name = gf_decode_str(reader)) == NULL) {
        Py_CLEAR(made);
        break;
      }
    }
    PyObject *item = gf_decode_value(reader, depth + 1);
    if (item == NULL) {
      Py_XDECREF(name);
      Py_CLEAR(made);
      break;
    }
    if (tag == 'd') {
      int failed = PyDict_SetItem(made, name, item);
      Py_DECREF(name);
      Py_DECREF(item);
      if (failed != 0) {
        Py_CLEAR(made);
      }
    } else if (tag == 'l') {
      PyList_SET_ITEM(made, (Py_ssize_t)i, item);
    } else {
      PyTuple_SET_ITEM(made, (Py_ssize_t)i, item);
    }
  }
  return made;
}

static PyObject *gf_decode_value(gf_reader *reader, int depth) {
  unsigned char tag = 0;
  if (depth > GF_WALK_MAX_DEPTH + 1 || gf_read(reader, &tag, 1) != 0) {
    return NULL;
  }
  switch (tag) {
  case 'N':
    return Py_NewRef(Py_None);
  case 'b': {
    unsigned char flag = 0;
    return gf_read(reader, &flag, 1) != 0 ? NULL : PyBool_FromLong(flag);
  }
  case 'i': {
    int64_t number = 0;
    return gf_read(reader, &number, sizeof number) != 0 ? NULL
                                                        : PyLong_FromLongLong((long long)number);
  }
  case 'f': {
    double number = 0;
    return gf_read(reader, &number, sizeof number) != 0 ? NULL : PyFloat_FromDouble(number);
  }
  case 's':
    return gf_decode_str(reader);
  case 'T':
    if (reader->next >= PyList_GET_SIZE(reader->tensors)) {
      return NULL;
    }
    return Py_NewRef(PyList_GET_ITEM(reader->tensors, reader->next++));
  case 'd':
  case 'l':
  case 't':
    return gf_decode_container(reader, tag, depth);
  default:
    return NULL;
  }
}

PyObject *gf_walk_decode(const unsigned char *key, size_t length, PyObject *tensors) {
  gf_reader reader = {key, key + length, tensors, 0};
  unsigned char tag = 0;
  PyObject *variant = NULL;
  PyObject *kwargs = NULL;
  if (gf_read(&reader, &tag, 1) == 0 && tag == 'F' &&
      (variant = gf_decode_value(&reader, 0)) != NULL) {
    kwargs = gf_decode_value(&reader, 0);
  }
  Py_XDECREF(variant);
  if (kwargs != NULL && (!PyDict_CheckExact(kwargs) || reader.at != reader.end ||
                         reader.next != PyList_GET_SIZE(tensors))) {
    Py_CLEAR(kwargs);
  }
  if (kwargs == NULL && !PyErr_Occurred()) {
    PyErr_Format(PyExc_ValueError,
                 "graphed: not the key of a fast-path call with %zd tensors (%zu bytes)",
                 PyList_GET_SIZE(tensors), length);
  }
  return kwargs;
}

/* -- the rebuilds: one map of plain containers, in the walk's order -------------------------- */

typedef enum {
  GF_MAP_TEMPLATE, /* any tensor is a slot; it is appended to `items`, the placeholder put */
  GF_MAP_REBUILD,  /* the placeholder is a slot; it takes the next of `items` */
} gf_map_kind;

typedef struct gf_map {
  gf_map_kind kind;
  PyObject *placeholder;
  PyObject *items; /* a list */
  Py_ssize_t next;
} gf_map;

/* Output leaves and dict keys: values that cannot hold a tensor. */
static int gf_is_plain_output_leaf(PyObject *value) {
  PyTypeObject *type = Py_TYPE(value);
  return value == Py_None || type == &PyBool_Type || type == &PyLong_Type ||
         type == &PyFloat_Type || type == &PyComplex_Type || type == &PyUnicode_Type ||
         type == &PyBytes_Type || gf_fastcall_torch_is_plain_leaf(value);
}

static int gf_map_is_slot(const gf_map *map, PyObject *value) {
  switch (map->kind) {
  case GF_MAP_TEMPLATE:
    return gf_fastcall_torch_is_tensor(value);
  case GF_MAP_REBUILD:
    return value == map->placeholder;
  }
  return 0;
}

static PyObject *gf_map_fill_slot(gf_map *map, PyObject *value) {
  if (map->kind == GF_MAP_TEMPLATE) {
    if (PyList_Append(map->items, value) != 0) {
      return NULL;
    }
    Py_INCREF(map->placeholder);
    return map->placeholder;
  }
  if (map->next >= PyList_GET_SIZE(map->items)) {
    PyErr_Format(PyExc_ValueError,
                 "graphed: the tree has more tensor slots than the %zd tensors given",
                 PyList_GET_SIZE(map->items));
    return NULL;
  }
  PyObject *tensor = PyList_GET_ITEM(map->items, map->next);
  map->next++;
  Py_INCREF(tensor);
  return tensor;
}

static gf_walk_result gf_map_value(gf_map *map, PyObject *value, int depth, PyObject **mapped);

static gf_walk_result gf_map_dict(gf_map *map, PyObject *value, int depth, PyObject **mapped) {
  PyObject *rebuilt = PyDict_New();
  if (rebuilt == NULL) {
    return GF_WALK_ERROR;
  }
  Py_ssize_t position = 0;
  PyObject *name;
  PyObject *item;
  while (PyDict_Next(value, &position, &name, &item)) {
    if (map->kind == GF_MAP_TEMPLATE && !gf_is_plain_output_leaf(name)) {
      Py_DECREF(rebuilt);
      return GF_WALK_UNSUPPORTED;
    }
    PyObject *mapped_item = NULL;
    gf_walk_result result = gf_map_value(map, item, depth + 1, &mapped_item);
    if (result == GF_WALK_OK && PyDict_SetItem(rebuilt, name, mapped_item) != 0) {
      result = GF_WALK_ERROR;
    }
    Py_XDECREF(mapped_item);
    if (result != GF_WALK_OK) {
      Py_DECREF(rebuilt);
      return result;
    }
  }
  *mapped = rebuilt;
  return GF_WALK_OK;
}

static gf_walk_result gf_map_sequence(gf_map *map, PyObject *value, int depth, PyObject **mapped) {
  int is_list = PyList_CheckExact(value);
  Py_ssize_t size = PySequence_Fast_GET_SIZE(value);
  PyObject *rebuilt = is_list ? PyList_New(size) : PyTuple_New(size);
  if (rebuilt == NULL) {
    return GF_WALK_ERROR;
  }
  for (Py_ssize_t i = 0; i < size; ++i) {
    PyObject *mapped_item = NULL;
    gf_walk_result result =
        gf_map_value(map, PySequence_Fast_ITEMS(value)[i], depth + 1, &mapped_item);
    if (result != GF_WALK_OK) {
      Py_DECREF(rebuilt);
      return result;
    }
    if (is_list) {
      PyList_SET_ITEM(rebuilt, i, mapped_item);
    } else {
      PyTuple_SET_ITEM(rebuilt, i, mapped_item);
    }
  }
  *mapped = rebuilt;
  return GF_WALK_OK;
}

static gf_walk_result gf_map_value(gf_map *map, PyObject *value, int depth, PyObject **mapped) {
  if (depth > GF_WALK_MAX_DEPTH) {
    return GF_WALK_UNSUPPORTED;
  }
  PyTypeObject *type = Py_TYPE(value);
  if (type == &PyDict_Type) {
    return gf_map_dict(map, value, depth, mapped);
  }
  if (type == &PyList_Type || type == &PyTuple_Type) {
    return gf_map_sequence(map, value, depth, mapped);
  }
  if (gf_map_is_slot(map, value)) {
    *mapped = gf_map_fill_slot(map, value);
    return *mapped != NULL ? GF_WALK_OK : GF_WALK_ERROR;
  }
  if (map->kind == GF_MAP_TEMPLATE && !gf_is_plain_output_leaf(value)) {
    return GF_WALK_UNSUPPORTED;
  }
  Py_INCREF(value);
  *mapped = value;
  return GF_WALK_OK;
}

/* Rebuild: every item of `items` must fill exactly one slot. */
static PyObject *gf_map_filling(gf_map_kind kind, PyObject *tree, PyObject *placeholder,
                                PyObject *items) {
  gf_map map = {kind, placeholder, items, 0};
  PyObject *mapped = NULL;
  gf_walk_result result = gf_map_value(&map, tree, 0, &mapped);
  if (result == GF_WALK_UNSUPPORTED) {
    PyErr_SetString(PyExc_ValueError, "graphed: not a plain tree (too deep)");
    return NULL;
  }
  if (result != GF_WALK_OK) {
    return NULL;
  }
  if (map.next != PyList_GET_SIZE(items)) {
    PyErr_Format(PyExc_ValueError, "graphed: the tree has %zd tensor slots, got %zd tensors",
                 map.next, PyList_GET_SIZE(items));
    Py_DECREF(mapped);
    return NULL;
  }
  return mapped;
}

PyObject *gf_walk_rebuild(PyObject *template, PyObject *placeholder, PyObject *outputs) {
  return gf_map_filling(GF_MAP_REBUILD, template, placeholder, outputs);
}

gf_walk_result gf_walk_output_template(PyObject *result, PyObject *placeholder, PyObject **template,
                                       PyObject **tensors) {
  gf_map map = {GF_MAP_TEMPLATE, placeholder, PyList_New(0), 0};
  if (map.items == NULL) {
    return GF_WALK_ERROR;
  }
  PyObject *mapped = NULL;
  gf_walk_result status = gf_map_value(&map, result, 0, &mapped);
  if (status != GF_WALK_OK) {
    Py_DECREF(map.items);
    return status;
  }
  *template = mapped;
  *tensors = map.items;
  return GF_WALK_OK;
}
