/* Static buffer pools (see gf_pool.h). */
#include "gf_pool.h"

#include <stdint.h>
#include <stdlib.h>

gf_status gf_pool_add(gf_pool *pool, const gf_tensor *tensor, gf_error *err) {
  /* Sizes no real tensor has (found by tests/fuzz): the byte sum must stay an int64. */
  const int64_t bytes = gf_tensor_nbytes(tensor);
  int64_t total = 0;
  if (bytes < 0 || __builtin_add_overflow(pool->bytes, bytes, &total)) {
    return gf_error_set(err, GF_ERR_INVALID_ARGUMENT,
                        "graphed: a tensor's byte size does not fit in int64");
  }
  if (pool->count == pool->capacity) {
    size_t capacity = pool->capacity ? 2 * pool->capacity : 8;
    gf_tensor *grown = realloc(pool->tensors, capacity * sizeof *grown);
    if (grown == NULL) {
      return gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: out of memory growing a buffer pool");
    }
    pool->tensors = grown;
    pool->capacity = capacity;
  }
  pool->tensors[pool->count++] = *tensor;
  pool->bytes = total;
  return GF_OK;
}

void gf_pool_truncate(gf_pool *pool, size_t first, gf_release_fn release, void *context) {
  for (size_t i = first; i < pool->count; ++i) {
    pool->bytes -= gf_tensor_nbytes(&pool->tensors[i]);
    if (release != NULL && pool->tensors[i].handle != NULL) {
      release(context, pool->tensors[i].handle);
    }
  }
  if (first < pool->count) {
    pool->count = first;
  }
}

int64_t gf_pool_release(gf_pool *pool, gf_release_fn release, void *context) {
  int64_t released = pool->bytes;
  gf_pool_truncate(pool, 0, release, context);
  pool->bytes = 0;
  return released;
}

void gf_pool_free(gf_pool *pool, gf_release_fn release, void *context) {
  gf_pool_release(pool, release, context);
  free(pool->tensors);
  pool->tensors = NULL;
  pool->capacity = 0;
}

/* The bytes a view spans, [*first, *end) from its address: by its strides, which may be 0 or
 * negative. 0 when it has no element. */
static int gf_tensor_span(const gf_tensor *t, intptr_t *first, intptr_t *end) {
  int64_t low = 0;
  int64_t high = 0;
  for (int d = 0; d < t->ndim; ++d) {
    if (t->sizes[d] == 0) {
      return 0;
    }
    const int64_t reach = (t->sizes[d] - 1) * t->strides[d];
    if (reach < 0) {
      low += reach;
    } else {
      high += reach;
    }
  }
  *first = (intptr_t)t->data + (intptr_t)(low * t->itemsize);
  *end = (intptr_t)t->data + (intptr_t)((high + 1) * t->itemsize);
  return 1;
}

int gf_pool_overlaps(const gf_pool *a, const gf_pool *b) {
  for (size_t i = 0; i < a->count; ++i) {
    intptr_t a_first = 0;
    intptr_t a_end = 0;
    if (!gf_tensor_span(&a->tensors[i], &a_first, &a_end)) {
      continue;
    }
    for (size_t j = 0; j < b->count; ++j) {
      intptr_t b_first = 0;
      intptr_t b_end = 0;
      if (gf_tensor_span(&b->tensors[j], &b_first, &b_end) && a_first < b_end && b_first < a_end) {
        return 1;
      }
    }
  }
  return 0;
}
