/* Small facts about a gf_tensor that the signature, the pools and the replay path all need. */
#include "gf_tensor.h"

/* Products saturate at INT64_MAX (INT64_MIN for a negative one) instead of overflowing, which is
 * undefined in C: sizes no real tensor has (the fuzz target feeds them) must not be UB. */
static int64_t gf_saturating_mul(int64_t a, int64_t b) {
  int64_t product;
  if (__builtin_mul_overflow(a, b, &product)) {
    return (a < 0) != (b < 0) ? INT64_MIN : INT64_MAX;
  }
  return product;
}

int64_t gf_tensor_numel(const gf_tensor *t) {
  int64_t count = 1;
  for (int32_t d = 0; d < t->ndim; ++d) {
    count = gf_saturating_mul(count, t->sizes[d]);
  }
  return count;
}

int64_t gf_tensor_nbytes(const gf_tensor *t) {
  return gf_saturating_mul(gf_tensor_numel(t), t->itemsize);
}

/* As torch decides it: a tensor with no element is contiguous whatever its strides; otherwise
 * each dimension of size other than 1 has the row-major stride. A product that would overflow
 * int64 cannot describe real memory and answers 0. */
int gf_tensor_is_contiguous(const gf_tensor *t) {
  for (int32_t d = 0; d < t->ndim; ++d) {
    if (t->sizes[d] == 0) {
      return 1;
    }
  }
  int64_t expected = 1;
  for (int32_t d = t->ndim - 1; d >= 0; --d) {
    if (t->sizes[d] != 1 && t->strides[d] != expected) {
      return 0;
    }
    if (d > 0 && __builtin_mul_overflow(expected, t->sizes[d], &expected)) {
      return 0;
    }
  }
  return 1;
}

int gf_tensor_same_shape(const gf_tensor *a, const gf_tensor *b) {
  if (a->dtype != b->dtype || a->itemsize != b->itemsize || a->device_type != b->device_type ||
      a->device_index != b->device_index || a->ndim != b->ndim) {
    return 0;
  }
  for (int32_t d = 0; d < a->ndim; ++d) {
    if (a->sizes[d] != b->sizes[d]) {
      return 0;
    }
  }
  return 1;
}

int gf_tensor_same_view(const gf_tensor *a, const gf_tensor *b) {
  if (a->data != b->data || a->ndim != b->ndim) {
    return 0;
  }
  for (int32_t d = 0; d < a->ndim; ++d) {
    if (a->sizes[d] != b->sizes[d] || a->strides[d] != b->strides[d]) {
      return 0;
    }
  }
  return 1;
}
