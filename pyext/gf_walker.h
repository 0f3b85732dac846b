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

typedef enum { GF_WALK_OK = 0, GF_WALK_UNSUPPORTED = 1, GF_WALK_ERROR = -1 } gf_walk_result;

/* What a walk of kwargs collects: the key bytes and a borrowed descriptor of each tensor, in walk
 * order. Buffers grow and are kept for the next walk; gf_walk_free releases them. */
typedef struct gf_walk {
  unsigned char *key;
  size_t key_length;
  size_t key_capacity;
  gf_tensor *tensors;
  size_t tensor_count;
  size_t tensor_capacity;
} gf_walk;

/* Walks `variant` and the exact dict `kwargs` into an emptied walk: key 'F', variant, tree.
 * GF_WALK_UNSUPPORTED (no Python error) when the tree is not plain (see gf_walker.c). */
gf_walk_result gf_walk_kwargs(gf_walk *walk, PyObject *kwargs, PyObject *variant);

void gf_walk_free(gf_walk *walk);

/* `kwargs`, a tree the walker took, rebuilt with tensors[i] (a list) in the i-th tensor slot of
 * the walk; a new reference, or NULL with a Python error when the counts differ. */
PyObject *gf_walk_substitute(PyObject *kwargs, PyObject *tensors);

/* For a plain forward result: *template (the result with `placeholder` in each tensor slot) and
 * *tensors (a list of its tensors in walk order), new references, and GF_WALK_OK. A result that is
 * not plain gives GF_WALK_UNSUPPORTED and no Python error. */
gf_walk_result gf_walk_output_template(PyObject *result, PyObject *placeholder, PyObject **template,
                                       PyObject **tensors);

/* The output a template stands for, outputs[i] (a list) in its i-th placeholder; a new reference,
 * or NULL with a Python error when the counts differ. */
PyObject *gf_walk_rebuild(PyObject *template, PyObject *placeholder, PyObject *outputs);

#ifdef __cplusplus
}
#endif

#endif /* GF_WALKER_H */
