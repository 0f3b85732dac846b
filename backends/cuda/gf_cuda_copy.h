/* The batched copy: many device-to-device copies in one kernel, so that refreshing K static inputs
 * or cloning K outputs costs one launch (per GF_CUDA_COPIES_PER_LAUNCH copies) instead of K
 * cudaMemcpyAsync calls; and the same kernel recorded into a captured graph as a node whose copy
 * table each replay rewrites, so that copies cost no launch of their own. */
#ifndef GF_CUDA_COPY_H
#define GF_CUDA_COPY_H

#include "gf_backend.h"

#include <cuda_runtime_api.h>

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { GF_CUDA_COPIES_PER_LAUNCH = 128 };

/* A copy node found in a captured graph. */
typedef struct gf_cuda_copy_node {
  cudaGraphNode_t node;
  const void *kernel; /* the kernel it runs */
  int table_size;
  unsigned grid_x;
  unsigned grid_y;
} gf_cuda_copy_node;

/* Launches the copies on stream. Returns 0 or the cudaError_t of the launch. */
int gf_cuda_copy_batch(const gf_copy *copies, size_t count, cudaStream_t stream);

/* Launches, into the capture in progress on stream, the copy node of `role` (GF_COPY_INPUTS or
 * GF_COPY_OUTPUTS); count must be at most GF_CUDA_COPIES_PER_LAUNCH. 0 or a cudaError_t. */
int gf_cuda_copy_record(int role, const gf_copy *copies, size_t count, cudaStream_t stream);

/* Finds the copy node of `role` in a captured graph: 1 found, 0 not found, or a
 * negated cudaError_t. */
int gf_cuda_copy_find_node(cudaGraph_t graph, int role, gf_cuda_copy_node *found);

/* Rewrites the table of a found node in an instantiated graph; the next
 * launch copies these. count must be the count recorded. 0 or a cudaError_t. */
int gf_cuda_copy_update(cudaGraphExec_t exec, const gf_cuda_copy_node *node, const gf_copy *copies,
                        size_t count);

/* The blocks of 256 threads, 16 bytes each a pass, that the longest of `count` ranges takes, from
 * 1 to max_blocks: the grid's width of the batched copy and of the batched comparison
 * (gf_cuda_compare.h), whose blocks stride over what is longer. */
unsigned gf_cuda_blocks_per_range(const gf_copy *ranges, size_t count, unsigned max_blocks);

/* The message of a cudaError_t. */
const char *gf_cuda_error_string(int error);

#ifdef __cplusplus
}
#endif

#endif /* GF_CUDA_COPY_H */
