/* The batched copy: many device-to-device copies in one kernel launch per GF_CUDA_COPIES_PER_LAUNCH
 * copies, so that refreshing K static inputs or cloning K outputs costs a constant number of
 * launches instead of K cudaMemcpyAsync calls. */
#ifndef GF_CUDA_COPY_H
#define GF_CUDA_COPY_H

#include "gf_backend.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { GF_CUDA_COPIES_PER_LAUNCH = 128 };

/* Launches the copies on stream (a cudaStream_t). Returns 0 or the cudaError_t of the launch. */
int gf_cuda_copy_batch(const gf_copy *copies, size_t count, void *stream);

/* The message of a cudaError_t. */
const char *gf_cuda_error_string(int error);

#ifdef __cplusplus
}
#endif

#endif /* GF_CUDA_COPY_H */
