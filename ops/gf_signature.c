/* Canonical signature bytes and their hash (see gf_signature.h). Layout, all little fields in host
 * order: u64 key length, key bytes, u64 tensor count, then per tensor i32 dtype, i32 device type,
 * i32 device index, i32 ndim and ndim i64 sizes. Strides are not part of it: live tensors are
 * copied into contiguous static buffers, so their layout never changes the graph. */
#include "gf_signature.h"

#include <stdlib.h>
#include <string.h>

/* Eight bytes at a time (the replay path hashes a few hundred bytes per call), each word mixed in
 * with a multiply and a shift; the tail byte-wise. Equality never relies on it. */
uint64_t gf_signature_default_hash(const unsigned char *bytes, size_t length) {
  uint64_t hash = 14695981039346656037ull ^ (uint64_t)length;
  size_t i = 0;
  for (; i + sizeof(uint64_t) <= length; i += sizeof(uint64_t)) {
    uint64_t word;
    memcpy(&word, bytes + i, sizeof word);
    hash = (hash ^ word) * 0x9E3779B97F4A7C15ull;
    hash ^= hash >> 29;
  }
  for (; i < length; ++i) {
    hash = (hash ^ bytes[i]) * 1099511628211ull;
  }
  return hash ^ (hash >> 32);
}

static gf_status gf_signature_reserve(gf_signature *sig, size_t needed, gf_error *err) {
  if (needed <= sig->capacity) {
    return GF_OK;
  }
  size_t capacity = sig->capacity ? sig->capacity : 256;
  while (capacity < needed) {
    capacity *= 2;
  }
  unsigned char *grown = realloc(sig->bytes, capacity);
  if (grown == NULL) {
    return gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: out of memory building a signature");
  }
  sig->bytes = grown;
  sig->capacity = capacity;
  return GF_OK;
}

static void gf_signature_append(gf_signature *sig, const void *data, size_t length) {
  memcpy(sig->bytes + sig->length, data, length);
  sig->length += length;
}

gf_status gf_signature_build(gf_signature *sig, const void *key, size_t key_length,
                             const gf_tensor *tensors, size_t tensor_count, gf_hash_fn hash_fn,
                             gf_error *err) {
  size_t needed = 2 * sizeof(uint64_t) + key_length;
  for (size_t i = 0; i < tensor_count; ++i) {
    if (tensors[i].ndim < 0 || tensors[i].ndim > GF_MAX_DIMS) {
      return gf_error_set(err, GF_ERR_INVALID_ARGUMENT,
                          "graphed: input tensor %zu has %d dimensions; at most %d are supported",
                          i, (int)tensors[i].ndim, GF_MAX_DIMS);
    }
    needed += 4 * sizeof(int32_t) + (size_t)tensors[i].ndim * sizeof(int64_t);
  }
  gf_status status = gf_signature_reserve(sig, needed, err);
  if (status != GF_OK) {
    return status;
  }
  sig->length = 0;
  uint64_t count = key_length;
  gf_signature_append(sig, &count, sizeof count);
  if (key_length > 0) {
    gf_signature_append(sig, key, key_length);
  }
  count = tensor_count;
  gf_signature_append(sig, &count, sizeof count);
  for (size_t i = 0; i < tensor_count; ++i) {
    const gf_tensor *t = &tensors[i];
    int32_t header[4] = {t->dtype, t->device_type, t->device_index, t->ndim};
    gf_signature_append(sig, header, sizeof header);
    gf_signature_append(sig, t->sizes, (size_t)t->ndim * sizeof(int64_t));
  }
  sig->hash = (hash_fn ? hash_fn : gf_signature_default_hash)(sig->bytes, sig->length);
  return GF_OK;
}

gf_status gf_signature_add_state(gf_signature *sig, uint64_t state, gf_error *err) {
  if (state == 0) {
    return GF_OK;
  }
  gf_status status = gf_signature_reserve(sig, sig->length + sizeof state, err);
  if (status != GF_OK) {
    return status;
  }
  gf_signature_append(sig, &state, sizeof state);
  sig->hash ^= (state + 0x9e3779b97f4a7c15ull) * 0xff51afd7ed558ccdull;
  return GF_OK;
}

gf_status gf_signature_copy(gf_signature *dst, const gf_signature *src, gf_error *err) {
  gf_status status = gf_signature_reserve(dst, src->length, err);
  if (status != GF_OK) {
    return status;
  }
  memcpy(dst->bytes, src->bytes, src->length);
  dst->length = src->length;
  dst->hash = src->hash;
  return GF_OK;
}

int gf_signature_equal(const gf_signature *a, const gf_signature *b) {
  return a->hash == b->hash && a->length == b->length && memcmp(a->bytes, b->bytes, a->length) == 0;
}

void gf_signature_free(gf_signature *sig) {
  free(sig->bytes);
  sig->bytes = NULL;
  sig->length = 0;
  sig->capacity = 0;
  sig->hash = 0;
}

const unsigned char *gf_signature_key(const gf_signature *sig, size_t *key_length) {
  uint64_t length = 0;
  if (sig->bytes == NULL || sig->length < sizeof length) {
    *key_length = 0;
    return NULL;
  }
  memcpy(&length, sig->bytes, sizeof length);
  *key_length = length <= sig->length - sizeof length ? (size_t)length : 0;
  return sig->bytes + sizeof length;
}

uint64_t gf_signature_tensors_hash(const gf_signature *sig) {
  size_t key_length = 0;
  const unsigned char *key = gf_signature_key(sig, &key_length);
  if (key == NULL) {
    return 0;
  }
  const unsigned char *tensors = key + key_length;
  return gf_signature_default_hash(tensors, (size_t)(sig->bytes + sig->length - tensors));
}
