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
 * graph of `verdict_host` (made now if new; *jobs made on first use): 1 queued, or 0 not taken, for
 * the caller to launch it as a kernel (more pairs than a job holds, no room for another graph,
 * another device than the jobs', the byte's job still read by its last launch, or a graph that
 * could not be made or launched, after which none is tried again). The device writes the verdict
 * through `verdict_device` and counts in `scratch` as gf_cuda_compare_later says. */
int gf_cuda_compare_job(gf_cuda_compare_jobs **jobs, const gf_copy *pairs, size_t count,
                        uint8_t *verdict_host, uint8_t *verdict_device, uint32_t *scratch,
                        cudaStream_t stream);

/* Frees the graphs and the jobs; where a launch has not finished on the device (it failed there),
 * keeps them rather than free what the device may still read. Prohibits nothing while another
 * thread captures (relaxed capture mode). */
void gf_cuda_compare_jobs_free(gf_cuda_compare_jobs *jobs);

#ifdef __cplusplus
}
#endif

#endif /* GF_CUDA_COMPARE_JOBS_H */
