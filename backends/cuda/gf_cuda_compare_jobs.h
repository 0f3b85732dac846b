/* Verify mode's comparison launched as a ready graph (see gf_cuda_compare_jobs.cu): a kernel
 * launch cost 3.2 to 3.4 us of host time on an H100's host (runtime or driver API alike), a
 * launch of an instantiated one-kernel graph 1.3 us, and rewriting that graph's kernel parameters
 * first 2.1 us more; so each of a device's jobs gets graphs of its own, made once, whose kernel
 * reads its pairs from the job in mapped pinned memory, which the host fills with plain stores.
 * On an H100 this took a sampled call from 15.2-16.6 us over the plain call to 13.7-14.4. */
#ifndef GF_CUDA_COMPARE_JOBS_H
#define GF_CUDA_COMPARE_JOBS_H

#include "gf_backend.h"

#include <cuda_runtime_api.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Queues on stream the comparison of `count` pairs (each gf_copy's dst with its src) through the
 * ready graph of a free job of the current device (its jobs made on first use): 1 queued, or 0 not
 * taken, for the caller to launch it as a kernel (more pairs than a job holds, a stream of another
 * device or one being captured, every job of the device in flight, or no mapped pinned memory or
 * a graph that could not be made or launched, after which none is tried again on that device).
 * The device writes the verdict through `verdict_device` and counts in `scratch` as
 * gf_cuda_compare_later says. A device's jobs serve every runner on it, from any thread, and are
 * never freed: a runner's teardown makes no CUDA call. They belong to the device's primary
 * context: a process that resets the device (cudaDeviceReset) must not compare afterwards. */
int gf_cuda_compare_job(const gf_copy *pairs, size_t count, uint8_t *verdict_device,
                        uint32_t *scratch, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* GF_CUDA_COMPARE_JOBS_H */
