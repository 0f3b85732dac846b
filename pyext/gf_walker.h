/* The one walker of plain kwargs and output trees (see gf_walker.c): the tensor order of the fast
 * path, the key it builds, and the three rebuilds that must follow that order (the kwargs with
 * the core's tensors, an output's template, an output from its template). */
#ifndef GF_WALKER_H
#define GF_WALKER_H

#include <Python.h>

#include "gf_tensor.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* GF_WALK_REFUSED is internal to a walk (a tensor the core cannot take); gf_walk_kwargs turns it
 * into GF_WALK_ERROR with a TypeError or ValueError that names the kwarg's path. */
typedef enum {
  GF_WALK_OK = 0,
  GF_WALK_UNSUPPORTED = 1,
  GF_WALK_REFUSED = 2,
  GF_WALK_ERROR = -1
} gf_walk_result;

enum { GF_WALK_PATH_CAPACITY = 256, GF_WALK_REASON_CAPACITY = 256 };

/* What a walk of kwargs collects: the key bytes, a descriptor of each tensor and a strong
 * reference to each tensor object (objects[i] for tensors[i]), in walk order, so the data the
 * descriptors point at lives until gf_walk_release, whatever the forward or another thread does
 * to the caller's containers. Buffers grow and are kept for the next walk; gf_walk_free releases
 * them. */
typedef struct gf_walk {
  unsigned char *key;
  size_t key_length;
  size_t key_capacity;
  gf_tensor *tensors;
  PyObject **objects;
  size_t tensor_count;
  size_t tensor_capacity;
  /* A refused tensor: the exception type, the reason and the path, built while unwinding. */
  PyObject *refusal_type;
  char reason[GF_WALK_REASON_CAPACITY];
  char path[GF_WALK_PATH_CAPACITY];
  size_t path_length;
} gf_walk;

/* Walks `variant` and the exact dict `kwargs` into an emptied walk: key 'F', variant, tree.
 * GF_WALK_UNSUPPORTED (no Python error) when the tree is not plain (see gf_walker.c);
 * GF_WALK_ERROR with a TypeError or ValueError naming the kwarg when a tensor is one the core
 * cannot take (sparse, nested, meta, quantized, storage-less, too many dimensions). */
gf_walk_result gf_walk_kwargs(gf_walk *walk, PyObject *kwargs, PyObject *variant);

/* The one check of a tensor graphed takes as an input or keep_alive tensor, for every path that
 * takes one (the walk, the fast path's keep_alive, and Python's through `refusal`): 0 with
 * *described filled when it can be taken; else 1, with *type the exception (TypeError for a kind
 * of tensor graphed cannot take, ValueError for too many dimensions) and `reason` the end of a
 * sentence whose subject is the tensor's path. */
int gf_tensor_refused(PyObject *tensor, gf_tensor *described, PyObject **type, char *reason,
                      size_t capacity);

/* Drops the walk's references to its tensor objects (the buffers stay for the next walk). */
void gf_walk_release(gf_walk *walk);

/* The path of the index-th tensor (walk order) of the plain tree `kwargs`, as "kwargs['x'][0]",
 * a new reference; NULL with a Python error when there is no such tensor. For errors only. */
PyObject *gf_walk_path_of_tensor(PyObject *kwargs, size_t index);

void gf_walk_free(gf_walk *walk);

/* The kwargs dict a walk's key stands for, decoded from the key bytes alone (never from the
 * caller's containers, which the forward may have changed), with tensors[i] (a list) in the i-th
 * tensor slot; a new reference, or NULL with a ValueError for bytes that are not such a key. */
PyObject *gf_walk_decode(const unsigned char *key, size_t length, PyObject *tensors);

/* For a plain forward result: *template (the result with `placeholder` in each tensor slot) and
 * *tensors (a list of its tensors in walk order), new references, and GF_WALK_OK. A result that is
 * not plain gives GF_WALK_UNSUPPORTED and no Python error. */
gf_walk_result gf_walk_output_template(PyObject *result, PyObject *placeholder,
                                       PyObject **made_template, PyObject **tensors);

/* The output a template stands for, outputs[i] (a list) in its i-th placeholder; a new reference,
 * or NULL with a Python error when the counts differ. */
PyObject *gf_walk_rebuild(PyObject *made_template, PyObject *placeholder, PyObject *outputs);

#ifdef __cplusplus
}
#endif

#endif /* GF_WALKER_H */
