/* A static buffer pool: the tensors one cache entry owns (its static inputs or outputs, or the
 * tensors it keeps alive), with their bytes accounted, released together on eviction, reset and
 * disable. Release goes back to the host (the shim, or a test) through a callback. A handle is one
 * owning reference: two entries that share a static input each hold their own. */
#ifndef GF_POOL_H
#define GF_POOL_H

#include "gf_status.h"
#include "gf_tensor.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*gf_release_fn)(void *context, void *handle);

typedef struct gf_pool {
  gf_tensor *tensors;
  size_t count;
  size_t capacity;
  int64_t bytes; /* sum of gf_tensor_nbytes over the tensors */
} gf_pool;

/* Appends a tensor (taking ownership of its handle); the pool's bytes grow by its size. */
gf_status gf_pool_add(gf_pool *pool, const gf_tensor *tensor, gf_error *err);

/* Releases every handle through release (when not NULL), empties the pool and returns the bytes it
 * held. The pool stays usable. */
int64_t gf_pool_release(gf_pool *pool, gf_release_fn release, void *context);

/* Releases the tensors from index `first` on and shrinks the pool to `first` tensors. */
void gf_pool_truncate(gf_pool *pool, size_t first, gf_release_fn release, void *context);

/* Releases the handles and frees the pool's own storage. */
void gf_pool_free(gf_pool *pool, gf_release_fn release, void *context);

/* 1 when a tensor of `a` shares a byte of memory with a tensor of `b` (views by their strides;
 * tensors without elements share nothing). */
int gf_pool_overlaps(const gf_pool *a, const gf_pool *b);

#ifdef __cplusplus
}
#endif

#endif /* GF_POOL_H */
