/* The plain C view of a tensor that crosses from the shim into the core: no torch types here.
 * `handle` is the shim's owning reference (an at::Tensor on the heap) or NULL for a borrowed view;
 * the core never looks inside it, it only hands it back to the host hooks. */
#ifndef GF_TENSOR_H
#define GF_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { GF_MAX_DIMS = 12 };

typedef struct gf_tensor {
  void *data;           /* address of element 0 */
  int32_t dtype;        /* the framework's scalar type code */
  int32_t itemsize;     /* bytes per element */
  int32_t device_type;  /* the framework's device type code */
  int32_t device_index; /* -1 for a device with no index */
  int32_t ndim;
  int64_t sizes[GF_MAX_DIMS];
  int64_t strides[GF_MAX_DIMS]; /* in elements */
  void *handle;
} gf_tensor;

/* Number of elements (1 for a 0-d tensor). */
int64_t gf_tensor_numel(const gf_tensor *t);

/* Bytes of the elements, as if contiguous. */
int64_t gf_tensor_nbytes(const gf_tensor *t);

/* 1 when torch would call the tensor contiguous: no element at all, or the row-major strides
 * (size-1 dimensions ignored). */
int gf_tensor_is_contiguous(const gf_tensor *t);

/* 1 when a and b have the same address, sizes and strides: copying one into the other is a no-op.
 */
int gf_tensor_same_view(const gf_tensor *a, const gf_tensor *b);

/* 1 when a and b have the same dtype, item size, device and sizes: a buffer of one can hold the
 * other's values (their addresses and strides aside). */
int gf_tensor_same_shape(const gf_tensor *a, const gf_tensor *b);

#ifdef __cplusplus
}
#endif

#endif /* GF_TENSOR_H */
