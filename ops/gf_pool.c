/* Static buffer pools (see gf_pool.h). */
#include "gf_pool.h"

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
