/* Verify mode's comparison launched as a ready graph (see gf_cuda_compare_jobs.cu): a kernel
 * launch cost 3.2 to 3.4 us of host time on an H100's host (runtime or driver API alike), a
 * launch of an instantiated one-kernel graph 1.3 us, and rewriting that graph's kernel parameters
 * first 2.1 us more; so each verdict byte gets a graph of its own, made once, whose kernel reads
 * its pairs from a job in mapped pinned memory that the host fills with plain stores. */
#ifndef GF_CUDA_COMPARE_JOBS_H
#define GF_CUDA_COMPARE_JOBS_H

#include "gf_backend.h"

#include <cuda_runtime_api.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A runner's comparison graphs, one per verdict byte it was handed (made on first use). */
typedef struct gf_cuda_compare_jobs gf_cuda_compare_jobs;

/* Queues on stream the comparison of `count` pairs (each gf_copy's dst with its src) through the
 * graph of `verdict_host` (made now if new; *jobs made on first use): 1 queued, 0 not taken (more
 * pairs than a job holds, no room for another graph, another device than the jobs'), or a negated
 * cudaError_t. The device writes the verdict through `verdict_device` and counts in `scratch` as
 * gf_cuda_compare_later says. A verdict byte is not handed again until the device has written it
 * (its job is rewritten then). */
int gf_cuda_compare_job(gf_cuda_compare_jobs **jobs, const gf_copy *pairs, size_t count,
                        uint8_t *verdict_host, uint8_t *verdict_device, uint32_t *scratch,
                        cudaStream_t stream);

/* Frees the graphs and the jobs (after the device has run what it was given). */
void gf_cuda_compare_jobs_free(gf_cuda_compare_jobs *jobs);

#ifdef __cplusplus
}
#endif

#endif /* GF_CUDA_COMPARE_JOBS_H */
