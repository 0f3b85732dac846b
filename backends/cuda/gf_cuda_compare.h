/* Verify mode's comparison on a CUDA device (gf_backend.compare_later): every pair of a sampled
 * call's outputs compared bitwise in one kernel launch (per GF_CUDA_COMPARES_PER_LAUNCH pairs),
 * whose last block writes the verdict straight into pinned host memory, so that the call neither
 * waits for the device nor pays the few torch operations a pair (a comparison, a reduction, a
 * copy to the host) that cost 73 to 115 us a sampled call on the H200. */
#ifndef GF_CUDA_COMPARE_H
#define GF_CUDA_COMPARE_H

#include "gf_backend.h"

#include <cuda_runtime_api.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { GF_CUDA_COMPARES_PER_LAUNCH = 64 };

/* Queues the comparison of `count` pairs (each gf_copy's dst with its src, `bytes` long) on
 * stream, as a ready graph where it can (gf_cuda_compare_jobs.h), else as kernel launches; the
 * last block to finish writes 0 or 1 to `verdict` (pinned host memory the device can
 * reach) and zeroes `scratch` (two 32-bit words of device memory, zero on entry). Returns 0,
 * cudaErrorInvalidValue for a verdict the device cannot write (nothing queued), or the
 * cudaError_t of a launch. */
int gf_cuda_compare_later(const gf_copy *pairs, size_t count, uint8_t *verdict, uint32_t *scratch,
                          cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* GF_CUDA_COMPARE_H */
